package wire

// Engine payloads: the msgpack KV-event batches vLLM and SGLang publish on ZMQ, and the ZMQ
// frames around them. SPEC.md §10 describes every accepted shape. This file holds the batch and
// the decoder's msgpack primitives; engine_event.go the events, engine_frames.go the ZMQ frames,
// engine_encode.go the encoder for tests and fake publishers.
//
// Decoding walks the payload once with msgp's zero-copy byte readers: no reflection, no
// intermediate values, and nothing allocated once an EngineBatch has grown to the batch sizes
// seen. Errors are built only on failure, so their formatting costs valid input nothing.

import (
	"errors"
	"fmt"
	"math"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

const engineMsg = "engine batch"

// EngineSeqEnd is the sequence number of the marker that ends a replay: -1 as a signed
// 64-bit integer, eight 0xFF bytes on the wire.
const EngineSeqEnd uint64 = math.MaxUint64

// EngineBatch is one KV-event batch as an engine publishes it; it is for one goroutine at a
// time, since Decode reuses its memory.
//
// Decode points the events' Hashes, Tokens and MM into arenas the batch keeps and reuses: they
// are valid until the next Decode into the same EngineBatch. Every event's LoRA aliases the
// payload: valid only while the payload is unchanged, so whatever keeps an event longer must
// copy its name (strings.Clone).
type EngineBatch struct {
	TS      float64 // the publisher's clock when it sent the batch, seconds since the Unix epoch
	Rank    uint32  // data_parallel_rank (vLLM) or attn_dp_rank (SGLang)
	HasRank bool    // false when the batch has no rank or a nil one

	// Events are the batch's stored, removed and cleared events in order, each with Rank set to
	// the batch's (0 without one) and ID 0: engines do not number events, the transport's batch
	// sequence is what reveals a loss.
	Events []kvevent.Event

	// Skipped counts events of a type this decoder does not know, left out of Events so that
	// engines can add event types without breaking the router.
	Skipped int
	// Filtered counts events of a KV-cache group other than the main attention one (a hybrid
	// model's sliding-window or Mamba group), left out as Dynamo does: their block hashes
	// are the same as the full-attention blocks', so a removal there would remove the wrong
	// block from the index. Which group an event belongs to is decided with what Groups
	// learned (SPEC.md §10.4).
	Filtered int
	// UnknownMedium counts the events of Events whose medium is a string ParseMedium does not
	// know. They are decoded as the device tier, as Dynamo does, rather than refusing the batch
	// and the device events in it; counted, because a block kept in a tier of a new name then
	// counts as cached on the device. UnknownMediumName is the first such medium; it aliases
	// the payload.
	UnknownMedium     int
	UnknownMediumName string

	// Groups holds the KV-cache groups the publisher's stored events described, which decide
	// the group of the events that name only a group index (vLLM's removals). Decode reads and
	// updates it; nil means the batch's own table, right when every payload decoded into this
	// EngineBatch comes from one publisher. A reader of several publishers sets each one's.
	Groups *EngineGroups

	groups EngineGroups // Groups when it is nil
	meta   []evMeta     // per decoded event, until the group filter has run

	// Arenas the events' slices point into. A slice taken before an arena grew keeps the old
	// backing array, which still holds its data.
	hashes []uint64
	tokens []uint32
	mm     [][]uint64
	mmData []uint64
}

// Decode decodes one msgpack payload (the last frame of a ZMQ message) into b, reusing b's
// memory; SPEC.md §10 lists the accepted forms. On error b holds a partial result and the
// error is an *Error naming the field (events[3].block_hashes[2]) and its byte offset in the
// payload. Decode allocates nothing once b has grown to the sizes seen.
func (b *EngineBatch) Decode(payload []byte) error {
	clear(b.Events) // let go of the strings of the previous payload
	b.Events = b.Events[:0]
	b.TS, b.Rank, b.HasRank, b.Skipped, b.Filtered = 0, 0, false, 0, 0
	b.UnknownMedium, b.UnknownMediumName = 0, ""
	b.hashes, b.tokens, b.mmData = b.hashes[:0], b.tokens[:0], b.mmData[:0]
	clear(b.mm)
	b.mm = b.mm[:0]
	clear(b.meta)
	b.meta = b.meta[:0]

	d := engineDecoder{p: payload, ev: -1}
	rest, err := d.batch(b, payload)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return d.errAt(rest, "payload", -1, -1, ErrTrailing, "%d bytes after the batch", len(rest))
	}
	b.filterGroups()
	for i := range b.Events {
		b.Events[i].Rank = b.Rank
	}
	return nil
}

// engineDecoder reads one payload; offsets in errors are from its start.
type engineDecoder struct {
	p  []byte
	ev int // index of the event being read in the payload's events array; -1 outside
}

// errAt builds the error for the value that starts at at (a suffix of the payload): field,
// with up to two indices (-1: none), under the current event if there is one.
//
//go:noinline
func (d *engineDecoder) errAt(at []byte, field string, i, j int, err error, format string, args ...any) error {
	if i >= 0 {
		field += fmt.Sprintf("[%d]", i)
	}
	if j >= 0 {
		field += fmt.Sprintf("[%d]", j)
	}
	if d.ev >= 0 {
		sep := "."
		if field == "" || field[0] == '[' {
			sep = "" // the event itself, or one of its positions
		}
		field = fmt.Sprintf("events[%d]%s%s", d.ev, sep, field)
	}
	return &Error{Msg: engineMsg, Field: field, Offset: len(d.p) - len(at), Err: err, Detail: fmt.Sprintf(format, args...)}
}

// bad turns an error of a msgp reader, or a value of the wrong type when err is nil, into
// the field's error.
//
//go:noinline
func (d *engineDecoder) bad(at []byte, field string, i, j int, want string, err error) error {
	switch e := err.(type) {
	case msgp.UintBelowZero:
		return d.errAt(at, field, i, j, ErrInvalid, "%d, want %s", e.Value, want)
	case msgp.UintOverflow:
		return d.errAt(at, field, i, j, ErrInvalid, "%d, want %s", e.Value, want)
	}
	switch {
	case len(at) == 0:
		return d.errAt(at, field, i, j, ErrTruncated, "the payload ends where %s should start", want)
	case err == msgp.ErrShortBytes:
		return d.errAt(at, field, i, j, ErrTruncated, "the payload ends inside this %v", msgp.NextType(at))
	case err == errTooDeep || err == msgp.ErrRecursion:
		return d.errAt(at, field, i, j, ErrInvalid, "nested more than %d levels deep", maxSkipDepth)
	case msgp.NextType(at) == msgp.InvalidType:
		return d.errAt(at, field, i, j, ErrInvalid, "byte %#02x starts no msgpack value", at[0])
	}
	return d.errAt(at, field, i, j, ErrInvalid, "got %v, want %s", msgp.NextType(at), want)
}

// count checks, before anyone allocates for them, that n elements of at least per bytes each
// fit in what is left of the payload.
func (d *engineDecoder) count(at, rest []byte, field string, i, j int, n uint32, per int) error {
	if uint64(n)*uint64(per) > uint64(len(rest)) {
		return d.errAt(at, field, i, j, ErrTruncated, "%d elements, only %d bytes left", n, len(rest))
	}
	return nil
}

// maxSkipDepth bounds the nesting of a value the decoder skips. Engines nest a few levels; the
// bound keeps a hostile payload from recursing deep.
const maxSkipDepth = 64

// errTooDeep is skipValue's own failure, turned into the field's error.
var errTooDeep = errors.New("nested too deeply")

// skipAny returns what follows the msgpack value at the start of b.
func skipAny(b []byte, depth int) ([]byte, error) {
	var n uint64
	var r []byte
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		c, rr, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return nil, err
		}
		n, r = uint64(c), rr
	case msgp.MapType:
		c, rr, err := msgp.ReadMapHeaderBytes(b)
		if err != nil {
			return nil, err
		}
		n, r = 2*uint64(c), rr
	default:
		return msgp.Skip(b) // a scalar: no recursion
	}
	if depth >= maxSkipDepth {
		return nil, errTooDeep
	}
	for ; n > 0; n-- {
		var err error
		if r, err = skipAny(r, depth+1); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (d *engineDecoder) skip(b []byte, field string, i, j int) ([]byte, error) {
	r, err := skipAny(b, 0)
	if err != nil {
		return nil, d.bad(b, field, i, j, "a msgpack value", err)
	}
	return r, nil
}

// skipValue skips the value of map key k, naming k only if that fails.
func (d *engineDecoder) skipValue(b, k []byte) ([]byte, error) {
	r, err := skipAny(b, 0)
	if err != nil {
		return nil, d.bad(b, string(k), -1, -1, "a msgpack value", err)
	}
	return r, nil
}

func isNil(b []byte) bool { return len(b) > 0 && b[0] == 0xc0 }

// str reads a str value without copying.
func (d *engineDecoder) str(b []byte, field string, i, j int) ([]byte, []byte, error) {
	if msgp.NextType(b) != msgp.StrType {
		return nil, nil, d.bad(b, field, i, j, "str", nil)
	}
	s, r, err := msgp.ReadStringZC(b)
	if err != nil {
		return nil, nil, d.bad(b, field, i, j, "str", err)
	}
	return s, r, nil
}

// key reads a map key: str, or bin as some encoders write them.
func (d *engineDecoder) key(b []byte, field string) ([]byte, []byte, error) {
	var k, r []byte
	var err error
	switch msgp.NextType(b) {
	case msgp.StrType:
		k, r, err = msgp.ReadStringZC(b)
	case msgp.BinType:
		k, r, err = msgp.ReadBytesZC(b)
	default:
		return nil, nil, d.bad(b, field, -1, -1, "a map key (str)", nil)
	}
	if err != nil {
		return nil, nil, d.bad(b, field, -1, -1, "a map key (str)", err)
	}
	return k, r, nil
}

// unsigned reads a non-negative integer of at most max.
func (d *engineDecoder) unsigned(b []byte, field string, max uint64) (uint64, []byte, error) {
	if t := msgp.NextType(b); t != msgp.IntType && t != msgp.UintType {
		return 0, nil, d.bad(b, field, -1, -1, "an integer", nil)
	}
	v, r, err := msgp.ReadUint64Bytes(b)
	if err != nil {
		return 0, nil, d.bad(b, field, -1, -1, "a non-negative integer", err)
	}
	if v > max {
		return 0, nil, d.errAt(b, field, -1, -1, ErrInvalid, "%d, max %d", v, max)
	}
	return v, r, nil
}

// batch reads [ts, events, rank?] or {"ts", "events", "data_parallel_rank"}.
func (d *engineDecoder) batch(out *EngineBatch, b []byte) ([]byte, error) {
	const want = "a batch: [ts, events, data_parallel_rank] or a map"
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		n, r, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return nil, d.bad(b, "batch", -1, -1, want, err)
		}
		if n < 2 {
			return nil, d.errAt(b, "batch", -1, -1, ErrInvalid, "array of %d elements, want [ts, events] or [ts, events, data_parallel_rank]", n)
		}
		if err := d.count(b, r, "batch", -1, -1, n, 1); err != nil {
			return nil, err
		}
		if r, err = d.ts(out, r); err != nil {
			return nil, err
		}
		if r, err = d.events(out, r); err != nil {
			return nil, err
		}
		if n >= 3 {
			if r, err = d.rank(out, r); err != nil {
				return nil, err
			}
		}
		for i := uint32(3); i < n; i++ {
			if r, err = d.skip(r, "batch", int(i), -1); err != nil {
				return nil, err
			}
		}
		return r, nil
	case msgp.MapType:
		n, r, err := msgp.ReadMapHeaderBytes(b)
		if err != nil {
			return nil, d.bad(b, "batch", -1, -1, want, err)
		}
		if err := d.count(b, r, "batch", -1, -1, n, 2); err != nil {
			return nil, err
		}
		const (
			seenTS = 1 << iota
			seenEvents
			seenRank
		)
		var seen uint8
		once := func(at []byte, bit uint8, name string) error {
			if seen&bit != 0 {
				return d.errAt(at, name, -1, -1, ErrInvalid, "duplicate key")
			}
			seen |= bit
			return nil
		}
		for range n {
			var k []byte
			if k, r, err = d.key(r, "batch"); err != nil {
				return nil, err
			}
			switch string(k) {
			case "ts":
				if err = once(r, seenTS, "ts"); err == nil {
					r, err = d.ts(out, r)
				}
			case "events":
				if err = once(r, seenEvents, "events"); err == nil {
					r, err = d.events(out, r)
				}
			case "data_parallel_rank", "dp_rank", "attn_dp_rank":
				if err = once(r, seenRank, "data_parallel_rank"); err == nil {
					r, err = d.rank(out, r)
				}
			default:
				r, err = d.skipValue(r, k)
			}
			if err != nil {
				return nil, err
			}
		}
		if seen&seenTS == 0 {
			return nil, d.errAt(b, "ts", -1, -1, ErrInvalid, "missing from the batch map")
		}
		if seen&seenEvents == 0 {
			return nil, d.errAt(b, "events", -1, -1, ErrInvalid, "missing from the batch map")
		}
		return r, nil
	}
	return nil, d.bad(b, "batch", -1, -1, want, nil)
}

func (d *engineDecoder) ts(out *EngineBatch, b []byte) ([]byte, error) {
	const want = "a number (seconds)"
	var r []byte
	var err error
	switch msgp.NextType(b) {
	case msgp.Float64Type, msgp.Float32Type:
		out.TS, r, err = msgp.ReadFloat64Bytes(b)
	case msgp.IntType:
		var v int64
		v, r, err = msgp.ReadInt64Bytes(b)
		out.TS = float64(v)
	case msgp.UintType:
		var v uint64
		v, r, err = msgp.ReadUint64Bytes(b)
		out.TS = float64(v)
	default:
		return nil, d.bad(b, "ts", -1, -1, want, nil)
	}
	if err != nil {
		return nil, d.bad(b, "ts", -1, -1, want, err)
	}
	return r, nil
}

func (d *engineDecoder) rank(out *EngineBatch, b []byte) ([]byte, error) {
	if isNil(b) {
		out.Rank, out.HasRank = 0, false
		return b[1:], nil
	}
	v, r, err := d.unsigned(b, "data_parallel_rank", math.MaxUint32)
	if err != nil {
		return nil, err
	}
	out.Rank, out.HasRank = uint32(v), true
	return r, nil
}

func (d *engineDecoder) events(out *EngineBatch, b []byte) ([]byte, error) {
	if msgp.NextType(b) != msgp.ArrayType {
		return nil, d.bad(b, "events", -1, -1, "array", nil)
	}
	n, r, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, d.bad(b, "events", -1, -1, "array", err)
	}
	if err := d.count(b, r, "events", -1, -1, n, 1); err != nil {
		return nil, err
	}
	for i := range int(n) {
		d.ev = i
		if r, err = d.event(out, r); err != nil {
			return nil, err
		}
	}
	d.ev = -1
	return r, nil
}
