// Package wire is kvrouterd's binary protocol: route requests, route responses and batches of
// KV events, encoded and decoded without reflection and, once buffers are reused, without
// allocating.
//
// The format is specified in SPEC.md beside this file, precisely enough to write a client in
// another language: a 12-byte header ("KVRW", version, type, body length), then a little-endian
// body of fixed-offset fields, length-prefixed strings and counted arrays. Every message has
// exactly one encoding: the decoders reject unknown flag bits, nonzero reserved bytes and
// values whose presence flag is clear, so a message that decodes re-encodes to the same bytes.
//
// Decoders check structure, never meaning: a count that claims more elements than the message
// holds is rejected before anything is allocated for it, but a NaN weight or a stored event
// whose tokens do not fill its blocks is the server's to refuse. Every decode error is an
// *Error naming the message, the field and its byte offset, and wraps one of the sentinels
// (ErrTruncated, ErrMagic, ErrVersion, ErrType, ErrTrailing, ErrInvalid, ErrTooLong).
//
// Decoded strings alias the input buffer and decoded slices live in memory the destination
// value reuses: both are valid only until the buffer changes or the value is decoded into
// again. Copy what must outlive that (strings.Clone, slices.Clone).
//
// The functions are safe for concurrent use on distinct values; a value being decoded into
// belongs to one goroutine.
package wire
