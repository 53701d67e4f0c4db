package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"unsafe"
)

// Format constants. SPEC.md is the authority; these mirror it.
const (
	// Magic opens every message.
	Magic = "KVRW"
	// Version is the only format version this package reads and writes.
	Version = 1
	// HeaderSize is the length of the header that precedes every body.
	HeaderSize = 12
	// MaxString is the longest str field, in bytes.
	MaxString = 1024
	// MaxEvents is the most events one EventBatch may carry.
	MaxEvents = 1 << 16
	// MaxBlockSize is the most tokens per block a block_size field may state.
	MaxBlockSize = 1 << 16
)

// Type is a message type as the header's u16 type field holds it; a plain value, safe to copy
// and share.
type Type uint16

const (
	TypeRouteRequest  Type = 1
	TypeRouteResponse Type = 2
	TypeEventBatch    Type = 3
	// TypeSnapshotWorker is one worker's state in a snapshot (SnapshotWorker).
	TypeSnapshotWorker Type = 4
	// TypeSnapshotHeader opens a snapshot of the second format (SnapshotHeader).
	TypeSnapshotHeader Type = 5
	// TypeSnapshotIndex is part of a model's index by block in a snapshot (SnapshotIndex).
	TypeSnapshotIndex Type = 6
)

func (t Type) String() string {
	switch t {
	case TypeRouteRequest:
		return "route request"
	case TypeRouteResponse:
		return "route response"
	case TypeEventBatch:
		return "event batch"
	case TypeSnapshotWorker:
		return "snapshot worker"
	case TypeSnapshotHeader:
		return "snapshot header"
	case TypeSnapshotIndex:
		return "snapshot index"
	}
	return fmt.Sprintf("type(%d)", uint16(t))
}

// Mode is a routing mode as requests and responses carry it in one byte; a plain value, safe to
// copy and share.
type Mode uint8

const (
	ModeDefault             Mode = iota // the server's configured mode (requests only)
	ModeKV                              // KV-cache-aware scoring
	ModeRoundRobin                      // rotate over the allowed workers
	ModeRandom                          // uniform choice among the allowed workers
	ModeLeastLoaded                     // fewest active blocks
	ModeDirect                          // the pinned worker, no choice
	ModePowerOfTwo                      // the less loaded of two workers drawn at random
	ModeDeviceAwareWeighted             // fewest requests in flight per unit of the worker's weight
	// ModeMax is the highest mode a message may carry.
	ModeMax = ModeDeviceAwareWeighted
)

func (m Mode) String() string {
	switch m {
	case ModeDefault:
		return "default"
	case ModeKV:
		return "kv"
	case ModeRoundRobin:
		return "round_robin"
	case ModeRandom:
		return "random"
	case ModeLeastLoaded:
		return "least_loaded"
	case ModeDirect:
		return "direct"
	case ModePowerOfTwo:
		return "power_of_two"
	case ModeDeviceAwareWeighted:
		return "device_aware_weighted"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseHeader checks the 12-byte header at the start of b (magic, version, a known type) and
// returns the message type and the body length it announces. Unlike the Decode functions it
// does not require b to hold the body, so a stream reader can use it on the first 12 bytes to
// learn how many more to read; it should cap the length before reading that much.
func ParseHeader(b []byte) (Type, int, error) {
	d := newDecoder(b, "message")
	if err := d.prefix(); err != nil {
		return 0, 0, err
	}
	t := Type(le.Uint16(b[6:]))
	if t < TypeRouteRequest || t > TypeSnapshotIndex {
		return 0, 0, d.errAt("type", 6, ErrType, "got %d, want 1 to 6", uint16(t))
	}
	n := le.Uint32(b[8:])
	if uint64(n) > math.MaxInt {
		return 0, 0, d.errAt("body_length", 8, ErrTooLong, "%d bytes does not fit this machine's int", n)
	}
	return t, int(n), nil
}

var le = binary.LittleEndian

// nativeLE reports whether the machine stores integers little-endian, as the wire does: then
// arrays of u32, u64 and Candidate records move between message and Go slices with one memmove.
var nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// decoder reads one message. Offsets are from the start of the message, header included, which
// is also what errors report.
type decoder struct {
	b   []byte // the whole message
	off int
	msg string // message kind for errors
	// Indices that errors put into field names; -1 outside an event or a multimodal block.
	ev, blk int
}

func newDecoder(b []byte, msg string) decoder {
	return decoder{b: b, msg: msg, ev: -1, blk: -1}
}

// errAt builds the error for field at off. Only failures call it, so the formatting it does
// costs nothing on valid input.
//
//go:noinline
func (d *decoder) errAt(field string, off int, err error, format string, args ...any) error {
	switch {
	case d.blk >= 0:
		field = fmt.Sprintf("events[%d].mm[%d].%s", d.ev, d.blk, field)
	case d.ev >= 0:
		field = fmt.Sprintf("events[%d].%s", d.ev, field)
	}
	return &Error{Msg: d.msg, Field: field, Offset: off, Err: err, Detail: fmt.Sprintf(format, args...)}
}

//go:noinline
func (d *decoder) short(field string, n int) error {
	return d.errAt(field, d.off, ErrTruncated, "need %d bytes, have %d", n, len(d.b)-d.off)
}

// prefix checks what every message starts with: enough bytes for a header, magic, version.
func (d *decoder) prefix() error {
	b := d.b
	if len(b) < HeaderSize {
		field, off := "body_length", 8
		switch {
		case len(b) < 4:
			field, off = "magic", 0
		case len(b) < 6:
			field, off = "version", 4
		case len(b) < 8:
			field, off = "type", 6
		}
		return d.errAt(field, off, ErrTruncated, "the header needs %d bytes, have %d", HeaderSize, len(b))
	}
	if string(b[:4]) != Magic {
		return d.errAt("magic", 0, ErrMagic, "got %q, want %q", b[:4], Magic)
	}
	if v := le.Uint16(b[4:]); v != Version {
		return d.errAt("version", 4, ErrVersion, "got version %d, this decoder supports version %d", v, Version)
	}
	return nil
}

// header checks the header of a message of type want whose body must fill the rest of b.
func (d *decoder) header(want Type) error {
	if err := d.prefix(); err != nil {
		return err
	}
	b := d.b
	if t := Type(le.Uint16(b[6:])); t != want {
		return d.errAt("type", 6, ErrType, "got %d (%v), want %d (%v)", uint16(t), t, uint16(want), want)
	}
	n, have := uint64(le.Uint32(b[8:])), uint64(len(b)-HeaderSize)
	if n > have {
		return d.errAt("body_length", 8, ErrTruncated, "body_length %d, have %d bytes after the header", n, have)
	}
	if n < have {
		return d.errAt("body_length", 8, ErrTrailing, "%d bytes after the %d-byte body", have-n, n)
	}
	d.off = HeaderSize
	return nil
}

// end checks that the body has been read to its last byte.
func (d *decoder) end() error {
	if d.off != len(d.b) {
		return d.errAt("body", d.off, ErrTrailing, "%d bytes after the last field", len(d.b)-d.off)
	}
	return nil
}

// field names a fixed-size field of a fixed layout, for errors.
type field struct {
	name string
	size int
}

// fixed returns the next n bytes: a run of fixed-size fields, listed in layout, whose sizes sum
// to n. One length check covers them all; if the message ends inside the run, the error names
// the field it ends in.
func (d *decoder) fixed(layout []field, n int) ([]byte, error) {
	if len(d.b)-d.off < n {
		return nil, d.cut(layout)
	}
	return d.take(n), nil
}

func (d *decoder) cut(layout []field) error {
	for _, f := range layout {
		if len(d.b)-d.off < f.size {
			return d.short(f.name, f.size)
		}
		d.off += f.size
	}
	panic("wire: layout longer than its run")
}

// zero checks that the reserved bytes p, at offset off, are zero.
func (d *decoder) zero(field string, off int, p []byte) error {
	for i, c := range p {
		if c != 0 {
			return d.errAt(field, off, ErrInvalid, "reserved byte %d is %#02x, must be 0", i, c)
		}
	}
	return nil
}

// unset reports a value that is present although the flag that governs it is clear.
func (d *decoder) unset(field string, off int, v uint64, flag string) error {
	return d.errAt(field, off, ErrInvalid, "%#x while %s is clear, must be 0", v, flag)
}

func (d *decoder) u16(field string) (uint16, error) {
	if len(d.b)-d.off < 2 {
		return 0, d.short(field, 2)
	}
	v := le.Uint16(d.b[d.off:])
	d.off += 2
	return v, nil
}

func (d *decoder) u32(field string) (uint32, error) {
	if len(d.b)-d.off < 4 {
		return 0, d.short(field, 4)
	}
	v := le.Uint32(d.b[d.off:])
	d.off += 4
	return v, nil
}

func (d *decoder) u64(field string) (uint64, error) {
	if len(d.b)-d.off < 8 {
		return 0, d.short(field, 8)
	}
	v := le.Uint64(d.b[d.off:])
	d.off += 8
	return v, nil
}

// str reads a str field: u16 length, then that many bytes. The string aliases d.b.
func (d *decoder) str(field string) (string, error) {
	start := d.off
	n, err := d.u16(field)
	if err != nil {
		return "", err
	}
	if n > MaxString {
		return "", d.errAt(field, start, ErrTooLong, "%d bytes, max %d", n, MaxString)
	}
	if len(d.b)-d.off < int(n) {
		return "", d.errAt(field, start, ErrTruncated, "need %d bytes, have %d", 2+int(n), len(d.b)-start)
	}
	if n == 0 {
		return "", nil
	}
	s := unsafe.String(&d.b[d.off], int(n))
	d.off += int(n)
	return s, nil
}

// count reads a u32 element count and checks, before anyone allocates for it, that the size-byte
// elements of the array that follows fit in what is left of the message.
func (d *decoder) count(field, array string, size int) (int, error) {
	n, err := d.u32(field)
	if err != nil {
		return 0, err
	}
	return d.fits(field, array, n, size)
}

func (d *decoder) fits(field, array string, n uint32, size int) (int, error) {
	if need, have := uint64(n)*uint64(size), uint64(len(d.b)-d.off); need > have {
		return 0, d.errAt(array, d.off, ErrTruncated, "%s %d needs %d bytes, have %d", field, n, need, have)
	}
	return int(n), nil
}

// take returns the next n bytes, which the caller has checked are there.
func (d *decoder) take(n int) []byte {
	s := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return s
}

// appendU32s appends the little-endian u32s of src to dst.
func appendU32s(dst []uint32, src []byte) []uint32 {
	n := len(src) / 4
	if n == 0 {
		return dst
	}
	l := len(dst)
	dst = slices.Grow(dst, n)[:l+n]
	if nativeLE {
		copyU32sNative(dst[l:], src)
	} else {
		copyU32sPortable(dst[l:], src)
	}
	return dst
}

// appendU64s appends the little-endian u64s of src to dst.
func appendU64s(dst []uint64, src []byte) []uint64 {
	n := len(src) / 8
	if n == 0 {
		return dst
	}
	l := len(dst)
	dst = slices.Grow(dst, n)[:l+n]
	if nativeLE {
		copyU64sNative(dst[l:], src)
	} else {
		copyU64sPortable(dst[l:], src)
	}
	return dst
}

func copyU32sNative(dst []uint32, src []byte) {
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 4*len(dst)), src)
}

func copyU32sPortable(dst []uint32, src []byte) {
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] = le.Uint32(src[4*i:])
	}
}

func copyU64sNative(dst []uint64, src []byte) {
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 8*len(dst)), src)
}

func copyU64sPortable(dst []uint64, src []byte) {
	src = src[:8*len(dst)]
	for i := range dst {
		dst[i] = le.Uint64(src[8*i:])
	}
}

// Encoding. Every Append function computes the exact size first and grows dst once, so the
// appends below never reallocate.

func appendHeader(dst []byte, t Type, body int) []byte {
	dst = append(dst, Magic...)
	dst = le.AppendUint16(dst, Version)
	dst = le.AppendUint16(dst, uint16(t))
	// A body over 4 GiB cannot be announced; the clamped length makes the decoder reject it.
	return le.AppendUint32(dst, uint32(min(uint64(body), 1<<32-1)))
}

// strSize is the encoded size of s; see appendStr.
func strSize(s string) int { return 2 + min(len(s), 1<<16-1) }

// appendStr writes s as a str. A string over MaxString is written with its true length (or
// 65535, the most a u16 holds) so that the decoder rejects it as too long instead of receiving
// a shortened value.
func appendStr(dst []byte, s string) []byte {
	s = s[:min(len(s), 1<<16-1)]
	dst = le.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// appendCount writes a u32 count; an impossible count (over 2^32-1 elements) is the caller's
// to flag as unrepresentable.
func appendCount(dst []byte, n int) []byte {
	return le.AppendUint32(dst, uint32(min(uint64(n), 1<<32-1)))
}

func appendTokens(dst []byte, s []uint32) []byte {
	if nativeLE {
		return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s))...)
	}
	for _, v := range s {
		dst = le.AppendUint32(dst, v)
	}
	return dst
}

func appendHashes(dst []byte, s []uint64) []byte {
	if nativeLE {
		return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s))...)
	}
	for _, v := range s {
		dst = le.AppendUint64(dst, v)
	}
	return dst
}

// tooMany reports whether a list is too long for a u32 count.
func tooMany(n int) bool { return uint64(n) > 1<<32-1 }
