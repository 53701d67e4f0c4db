package wire

// Engine payloads: the msgpack KV-event batches vLLM and SGLang publish on ZMQ, and the ZMQ
// frames around them. SPEC.md §10 describes every accepted shape; this file follows it.
//
// Decoding walks the payload once with msgp's zero-copy byte readers: no reflection, no
// intermediate values, and nothing allocated once an EngineBatch has grown to the batch sizes
// seen. Errors are built only on failure, so their formatting costs valid input nothing.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unsafe"

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
	// block from the index.
	Filtered int

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
	b.hashes, b.tokens, b.mmData = b.hashes[:0], b.tokens[:0], b.mmData[:0]
	clear(b.mm)
	b.mm = b.mm[:0]

	d := engineDecoder{p: payload, ev: -1}
	rest, err := d.batch(b, payload)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return d.errAt(rest, "payload", -1, -1, ErrTrailing, "%d bytes after the batch", len(rest))
	}
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

// evField is a field of an engine event, as positions and map keys name them.
type evField uint8

const (
	fSkip evField = iota // a position or key this decoder ignores
	fHashes
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroup
	fSpecKind
	fSpecWindow
)

var evFieldNames = [...]string{
	fSkip: "", fHashes: "block_hashes", fParent: "parent_block_hash", fTokens: "token_ids",
	fBlockSize: "block_size", fLoRAID: "lora_id", fMedium: "medium", fLoRAName: "lora_name",
	fExtraKeys: "extra_keys", fGroup: "group_idx", fSpecKind: "kv_cache_spec_kind",
	fSpecWindow: "kv_cache_spec_sliding_window",
}

// Positional layouts: element i of an event array holds field [i]; element 0 is the tag.
// Elements past the end of a layout are ignored.
var (
	storedLayoutEngine  = [...]evField{fSkip, fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtraKeys, fGroup, fSpecKind, fSpecWindow}
	removedLayoutEngine = [...]evField{fSkip, fHashes, fMedium, fGroup}
)

// sglangMetaPos is where SGLang's BlockStoredWithMetadata puts its metadata struct (a map
// holding cache_salt), the position that is lora_name in vLLM's layout.
const sglangMetaPos = 7

// Fields each kind reads, and must have.
const (
	storedFields   = 1<<fHashes | 1<<fParent | 1<<fTokens | 1<<fBlockSize | 1<<fLoRAID | 1<<fMedium | 1<<fLoRAName | 1<<fExtraKeys | 1<<fGroup | 1<<fSpecKind | 1<<fSpecWindow
	removedFields  = 1<<fHashes | 1<<fMedium | 1<<fGroup | 1<<fSpecKind
	storedRequired = 1<<fHashes | 1<<fTokens | 1<<fBlockSize
)

func mapField(k kvevent.Kind, key []byte) evField {
	var f evField
	switch string(key) {
	case "block_hashes":
		f = fHashes
	case "parent_block_hash":
		f = fParent
	case "token_ids":
		f = fTokens
	case "block_size":
		f = fBlockSize
	case "lora_id":
		f = fLoRAID
	case "medium":
		f = fMedium
	case "lora_name":
		f = fLoRAName
	case "extra_keys":
		f = fExtraKeys
	case "group_idx":
		f = fGroup
	case "kv_cache_spec_kind":
		f = fSpecKind
	case "kv_cache_spec_sliding_window":
		f = fSpecWindow
	default:
		return fSkip
	}
	if allowed(k)&(1<<f) == 0 {
		return fSkip
	}
	return f
}

func allowed(k kvevent.Kind) uint16 {
	switch k {
	case kvevent.Stored:
		return storedFields
	case kvevent.Removed:
		return removedFields
	}
	return 0
}

func engineKind(tag []byte) kvevent.Kind {
	switch string(tag) {
	case "BlockStored":
		return kvevent.Stored
	case "BlockRemoved":
		return kvevent.Removed
	case "AllBlocksCleared":
		return kvevent.Cleared
	}
	return 0
}

// evState is what an event's fields say beyond the kvevent.Event they fill.
type evState struct {
	seen     uint16 // fields read, by evField bit
	group    bool   // group_idx present and not 0
	spec     bool   // kv_cache_spec_kind present
	mainSpec bool   // ... and one of the main attention kinds
	nExtra   int    // entries of extra_keys
	extraAt  []byte // where extra_keys starts, for the count check
}

// filtered reports whether the event belongs to a KV-cache group the index does not track:
// the spec kind decides when present, else a nonzero group index.
func (st *evState) filtered() bool {
	if st.spec {
		return !st.mainSpec
	}
	return st.group
}

func (d *engineDecoder) event(out *EngineBatch, b []byte) ([]byte, error) {
	var e kvevent.Event
	var st evState
	var r []byte
	var err error
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		r, err = d.arrayEvent(out, &e, &st, b)
	case msgp.MapType:
		r, err = d.mapEvent(out, &e, &st, b)
	default:
		return nil, d.bad(b, "", -1, -1, "an event: array or map", nil)
	}
	if err != nil {
		return nil, err
	}
	switch {
	case e.Kind == 0:
		out.Skipped++
	case st.filtered():
		out.Filtered++
	default:
		out.Events = append(out.Events, e)
	}
	return r, nil
}

// arrayEvent reads ["BlockStored", block_hashes, ...]: e.Kind stays 0 for an unknown tag.
func (d *engineDecoder) arrayEvent(out *EngineBatch, e *kvevent.Event, st *evState, b []byte) ([]byte, error) {
	n, r, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, d.bad(b, "", -1, -1, "an event array", err)
	}
	if n == 0 {
		return nil, d.errAt(b, "type", -1, -1, ErrInvalid, "empty event array, want the type tag first")
	}
	if err := d.count(b, r, "", -1, -1, n, 1); err != nil {
		return nil, err
	}
	tag, r, err := d.str(r, "type", -1, -1)
	if err != nil {
		return nil, err
	}
	e.Kind = engineKind(tag)
	var layout []evField
	switch e.Kind {
	case kvevent.Stored:
		layout = storedLayoutEngine[:]
	case kvevent.Removed:
		layout = removedLayoutEngine[:]
	}
	for i := 1; i < int(n); i++ {
		f := fSkip
		if i < len(layout) {
			f = layout[i]
		}
		if f == fLoRAName && i == sglangMetaPos {
			if t := msgp.NextType(r); t == msgp.MapType || t == msgp.ArrayType {
				f = fSkip
			}
		}
		if f == fSkip {
			if r, err = d.skip(r, "", i, -1); err != nil {
				return nil, err
			}
			continue
		}
		if r, err = d.field(out, e, st, f, r); err != nil {
			return nil, err
		}
	}
	return r, d.complete(e, st, b)
}

// mapEvent reads {"type": "BlockStored", "block_hashes": ..., ...}. The tag is found first,
// wherever it is (msgspec writes it first), so that the other keys are read as that kind's.
func (d *engineDecoder) mapEvent(out *EngineBatch, e *kvevent.Event, st *evState, b []byte) ([]byte, error) {
	n, body, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return nil, d.bad(b, "", -1, -1, "an event map", err)
	}
	if err := d.count(b, body, "", -1, -1, n, 2); err != nil {
		return nil, err
	}
	r := body
	var tag []byte
	for range n {
		var k []byte
		if k, r, err = d.key(r, ""); err != nil {
			return nil, err
		}
		if string(k) == "type" {
			if tag, _, err = d.str(r, "type", -1, -1); err != nil {
				return nil, err
			}
			break
		}
		if r, err = d.skipValue(r, k); err != nil {
			return nil, err
		}
	}
	if tag == nil {
		return nil, d.errAt(b, "type", -1, -1, ErrInvalid, "the event map has no type key")
	}
	if e.Kind = engineKind(tag); e.Kind == 0 {
		return d.skip(b, "", -1, -1)
	}
	r = body
	types := 0
	for range n {
		var k []byte
		if k, r, err = d.key(r, ""); err != nil {
			return nil, err
		}
		f := mapField(e.Kind, k)
		if f == fSkip {
			if string(k) == "type" {
				if types++; types > 1 {
					return nil, d.errAt(r, "type", -1, -1, ErrInvalid, "duplicate key")
				}
			}
			if r, err = d.skipValue(r, k); err != nil {
				return nil, err
			}
			continue
		}
		if r, err = d.field(out, e, st, f, r); err != nil {
			return nil, err
		}
	}
	return r, d.complete(e, st, b)
}

// complete checks what can only be checked once all of an event's fields are read.
func (d *engineDecoder) complete(e *kvevent.Event, st *evState, at []byte) error {
	var required uint16
	switch e.Kind {
	case kvevent.Stored:
		required = storedRequired
	case kvevent.Removed:
		required = 1 << fHashes
	}
	if miss := required &^ st.seen; miss != 0 {
		for f := fHashes; f <= fSpecWindow; f++ {
			if miss&(1<<f) != 0 {
				return d.errAt(at, evFieldNames[f], -1, -1, ErrInvalid, "missing from the %v event", e.Kind)
			}
		}
	}
	if st.nExtra != 0 && st.nExtra != len(e.Hashes) {
		return d.errAt(st.extraAt, "extra_keys", -1, -1, ErrInvalid, "%d entries for %d blocks, want one per block", st.nExtra, len(e.Hashes))
	}
	return nil
}

// field reads the value of field f of the event.
func (d *engineDecoder) field(out *EngineBatch, e *kvevent.Event, st *evState, f evField, b []byte) ([]byte, error) {
	name := evFieldNames[f]
	if st.seen&(1<<f) != 0 {
		return nil, d.errAt(b, name, -1, -1, ErrInvalid, "duplicate key")
	}
	st.seen |= 1 << f
	switch f {
	case fHashes:
		h, r, err := d.hashes(out, b)
		e.Hashes = h
		return r, err
	case fParent:
		if isNil(b) {
			return b[1:], nil
		}
		h, r, err := d.hash(b, name, -1)
		e.Parent, e.HasParent = h, err == nil
		return r, err
	case fTokens:
		t, r, err := d.tokens(out, b)
		e.Tokens = t
		return r, err
	case fBlockSize:
		v, r, err := d.unsigned(b, name, min(math.MaxUint32, math.MaxInt))
		e.BlockSize = int(v)
		return r, err
	case fMedium:
		if isNil(b) {
			e.Tier = kvevent.Device
			return b[1:], nil
		}
		s, r, err := d.str(b, name, -1, -1)
		if err != nil {
			return nil, err
		}
		tier, ok := kvevent.ParseMedium(alias(s))
		if !ok {
			return nil, d.errAt(b, name, -1, -1, ErrInvalid, "unknown storage medium %q", s)
		}
		e.Tier = tier
		return r, nil
	case fLoRAName:
		if isNil(b) {
			e.LoRA = ""
			return b[1:], nil
		}
		s, r, err := d.str(b, name, -1, -1)
		e.LoRA = alias(s)
		return r, err
	case fExtraKeys:
		st.extraAt = b
		return d.extraKeys(out, e, st, b)
	case fGroup:
		if isNil(b) {
			return b[1:], nil
		}
		var v int64
		var r []byte
		var err error
		switch msgp.NextType(b) {
		case msgp.IntType:
			v, r, err = msgp.ReadInt64Bytes(b)
		case msgp.UintType:
			var u uint64
			u, r, err = msgp.ReadUint64Bytes(b)
			v = int64(min(u, 1))
		default:
			return nil, d.bad(b, name, -1, -1, "nil or an integer", nil)
		}
		if err != nil {
			return nil, d.bad(b, name, -1, -1, "nil or an integer", err)
		}
		st.group = v != 0
		return r, nil
	case fSpecKind:
		if isNil(b) {
			return b[1:], nil
		}
		s, r, err := d.str(b, name, -1, -1)
		if err != nil {
			return nil, err
		}
		st.spec = true
		switch string(s) {
		case "full_attention", "mla_attention", "sink_full_attention":
			st.mainSpec = true
		}
		return r, nil
	}
	return d.skip(b, name, -1, -1) // lora_id, kv_cache_spec_sliding_window: any value
}

// alias returns the bytes of s as a string without copying: it shares the payload.
func alias(s []byte) string {
	if len(s) == 0 {
		return ""
	}
	return unsafe.String(&s[0], len(s))
}

// array reads the header of the array that field name holds, checking that its elements can
// fit in what follows.
func (d *engineDecoder) array(b []byte, name string) (uint32, []byte, error) {
	if msgp.NextType(b) != msgp.ArrayType {
		return 0, nil, d.bad(b, name, -1, -1, "array", nil)
	}
	n, r, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return 0, nil, d.bad(b, name, -1, -1, "array", err)
	}
	if err := d.count(b, r, name, -1, -1, n, 1); err != nil {
		return 0, nil, err
	}
	return n, r, nil
}

// hashes reads block_hashes into the hash arena.
func (d *engineDecoder) hashes(out *EngineBatch, b []byte) ([]uint64, []byte, error) {
	const name = "block_hashes"
	n, r, err := d.array(b, name)
	if err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, r, nil
	}
	start := len(out.hashes)
	out.hashes = slices.Grow(out.hashes, int(n))
	for j := range int(n) {
		var h uint64
		if h, r, err = d.hash(r, name, j); err != nil {
			return nil, nil, err
		}
		out.hashes = append(out.hashes, h)
	}
	return out.hashes[start:len(out.hashes):len(out.hashes)], r, nil
}

// hash reads one block hash: an unsigned int, a signed one (its 64 bits), or bin (its last 8
// bytes big-endian; fewer than 8 are left-padded with zeros).
func (d *engineDecoder) hash(b []byte, field string, j int) (uint64, []byte, error) {
	const want = "a hash: int or bin"
	if len(b) > 0 && b[0] < 0x80 { // positive fixint: small test hashes
		return uint64(b[0]), b[1:], nil
	}
	var h uint64
	var r []byte
	var err error
	switch msgp.NextType(b) {
	case msgp.UintType:
		h, r, err = msgp.ReadUint64Bytes(b)
	case msgp.IntType:
		var v int64
		v, r, err = msgp.ReadInt64Bytes(b)
		h = uint64(v)
	case msgp.BinType:
		var v []byte
		v, r, err = msgp.ReadBytesZC(b)
		h = beTail(v)
	default:
		return 0, nil, d.bad(b, field, j, -1, want, nil)
	}
	if err != nil {
		return 0, nil, d.bad(b, field, j, -1, want, err)
	}
	return h, r, nil
}

// beTail is the big-endian value of the last 8 bytes of v, or of all of v if shorter.
func beTail(v []byte) uint64 {
	if len(v) >= 8 {
		return binary.BigEndian.Uint64(v[len(v)-8:])
	}
	var h uint64
	for _, c := range v {
		h = h<<8 | uint64(c)
	}
	return h
}

// tokens reads token_ids into the token arena.
func (d *engineDecoder) tokens(out *EngineBatch, b []byte) ([]uint32, []byte, error) {
	const name = "token_ids"
	n, r, err := d.array(b, name)
	if err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, r, nil
	}
	start := len(out.tokens)
	out.tokens = slices.Grow(out.tokens, int(n))
	for j := range int(n) {
		// The encodings of non-negative ints below 2^32, inline: tokens are most of a payload.
		var t uint32
		switch {
		case len(r) > 0 && r[0] < 0x80:
			t, r = uint32(r[0]), r[1:]
		case len(r) >= 2 && r[0] == 0xcc:
			t, r = uint32(r[1]), r[2:]
		case len(r) >= 3 && r[0] == 0xcd:
			t, r = uint32(binary.BigEndian.Uint16(r[1:])), r[3:]
		case len(r) >= 5 && r[0] == 0xce:
			t, r = binary.BigEndian.Uint32(r[1:]), r[5:]
		default:
			if t, r, err = d.token(r, j); err != nil {
				return nil, nil, err
			}
		}
		out.tokens = append(out.tokens, t)
	}
	return out.tokens[start:len(out.tokens):len(out.tokens)], r, nil
}

// token reads a token id in any other integer encoding (signed ones, uint64), or fails.
func (d *engineDecoder) token(b []byte, j int) (uint32, []byte, error) {
	const want = "a token id from 0 to 2^32-1"
	if t := msgp.NextType(b); t != msgp.IntType && t != msgp.UintType {
		return 0, nil, d.bad(b, "token_ids", j, -1, want, nil)
	}
	v, r, err := msgp.ReadUint64Bytes(b)
	if err != nil {
		return 0, nil, d.bad(b, "token_ids", j, -1, want, err)
	}
	if v > math.MaxUint32 {
		return 0, nil, d.errAt(b, "token_ids", j, -1, ErrInvalid, "%d, want %s", v, want)
	}
	return uint32(v), r, nil
}

// extraKeys reads extra_keys: nil, or one entry per block, each nil or a list of items. The
// items that identify a multimodal object become the block's MM hashes (see mmItem); LoRA
// names, cache salts, prompt-embedding digests and anything else are skipped.
func (d *engineDecoder) extraKeys(out *EngineBatch, e *kvevent.Event, st *evState, b []byte) ([]byte, error) {
	const name = "extra_keys"
	if isNil(b) {
		return b[1:], nil
	}
	if msgp.NextType(b) != msgp.ArrayType {
		return nil, d.bad(b, name, -1, -1, "nil or an array", nil)
	}
	n, r, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, d.bad(b, name, -1, -1, "nil or an array", err)
	}
	if err := d.count(b, r, name, -1, -1, n, 1); err != nil {
		return nil, err
	}
	st.nExtra = int(n)
	start := len(out.mm)
	any := false
	for j := range int(n) {
		if isNil(r) {
			r = r[1:]
			out.mm = append(out.mm, nil)
			continue
		}
		at := r
		if msgp.NextType(r) != msgp.ArrayType {
			return nil, d.bad(r, name, j, -1, "nil or an array of extra keys", nil)
		}
		m, rr, err := msgp.ReadArrayHeaderBytes(r)
		if err != nil {
			return nil, d.bad(r, name, j, -1, "nil or an array of extra keys", err)
		}
		if err := d.count(at, rr, name, j, -1, m, 1); err != nil {
			return nil, err
		}
		r = rr
		first := len(out.mmData)
		for k := range int(m) {
			var h uint64
			var ok bool
			if h, ok, r, err = d.mmItem(r, j, k); err != nil {
				return nil, err
			}
			if ok {
				out.mmData = append(out.mmData, h)
			}
		}
		if len(out.mmData) == first {
			out.mm = append(out.mm, nil)
			continue
		}
		any = true
		out.mm = append(out.mm, out.mmData[first:len(out.mmData):len(out.mmData)])
	}
	if !any {
		clear(out.mm[start:])
		out.mm = out.mm[:start]
		e.MM = nil
		return r, nil
	}
	e.MM = out.mm[start:len(out.mm):len(out.mm)]
	return r, nil
}

// mmItem reads one extra key. A multimodal object is identified by a 64-hex-digit string,
// alone (older vLLM) or first in an (identifier, offset) array (newer vLLM); its hash is the
// value of the first 16 hex digits, as Dynamo computes it.
func (d *engineDecoder) mmItem(b []byte, j, k int) (uint64, bool, []byte, error) {
	const name = "extra_keys"
	switch msgp.NextType(b) {
	case msgp.StrType:
		s, r, err := msgp.ReadStringZC(b)
		if err != nil {
			return 0, false, nil, d.bad(b, name, j, k, "an extra key", err)
		}
		h, ok := mmHash(s)
		return h, ok, r, nil
	case msgp.ArrayType:
		m, r, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return 0, false, nil, d.bad(b, name, j, k, "an extra key", err)
		}
		if err := d.count(b, r, name, j, k, m, 1); err != nil {
			return 0, false, nil, err
		}
		var h uint64
		ok := false
		for i := range int(m) {
			if i == 0 && msgp.NextType(r) == msgp.StrType {
				var s []byte
				s, r, err = msgp.ReadStringZC(r)
				if err != nil {
					return 0, false, nil, d.bad(b, name, j, k, "an extra key", err)
				}
				h, ok = mmHash(s)
				continue
			}
			if r, err = d.skip(r, name, j, k); err != nil {
				return 0, false, nil, err
			}
		}
		return h, ok, r, nil
	}
	r, err := d.skip(b, name, j, k)
	return 0, false, r, err
}

// mmHash parses a multimodal identifier: exactly 64 hex digits (either case), of which the
// first 16 are the hash.
func mmHash(s []byte) (uint64, bool) {
	if len(s) != 64 {
		return 0, false
	}
	var h uint64
	for i, c := range s {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		if i < 16 {
			h = h<<4 | uint64(v)
		}
	}
	return h, true
}

// ZMQ frames.

// ParseEngineSeq reads the sequence frame of an engine's ZMQ message: a u64, big-endian, in
// exactly 8 bytes. Publishers number their batches from 0 and start again from 0 when they
// restart.
func ParseEngineSeq(frame []byte) (uint64, error) {
	if len(frame) != 8 {
		return 0, &Error{Msg: "engine frames", Field: "seq", Offset: 0, Err: ErrInvalid,
			Detail: fmt.Sprintf("%d bytes, want 8 (big-endian u64)", len(frame))}
	}
	return binary.BigEndian.Uint64(frame), nil
}

// ParseReplayReply reads one message of the replay socket's answer: [seq, payload] (older
// releases), [topic, seq, payload] (newer ones, or a DEALER that keeps the empty delimiter
// frame), or ["", topic, seq, payload]. end reports the marker that closes the answer: seq
// EngineSeqEnd and an empty payload. payload aliases the last frame. Errors are *Error with
// Msg "engine frames" and Offset -1 (a frame index is in Field).
func ParseReplayReply(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	bad := func(field string, format string, args ...any) error {
		return &Error{Msg: "engine frames", Field: field, Offset: -1, Err: ErrInvalid, Detail: fmt.Sprintf(format, args...)}
	}
	switch n := len(frames); {
	case n == 2, n == 3:
	case n == 4 && len(frames[0]) == 0:
	default:
		return 0, nil, false, bad("frames", "%d frames, want [seq, payload], [topic, seq, payload] or [\"\", topic, seq, payload]", n)
	}
	n := len(frames)
	sf := frames[n-2]
	if len(sf) != 8 {
		return 0, nil, false, bad(fmt.Sprintf("frames[%d].seq", n-2), "%d bytes, want 8 (big-endian u64)", len(sf))
	}
	seq, payload = binary.BigEndian.Uint64(sf), frames[n-1]
	if seq == EngineSeqEnd {
		if len(payload) != 0 {
			return 0, nil, false, bad(fmt.Sprintf("frames[%d].payload", n-1), "%d bytes after the end marker's seq, want none", len(payload))
		}
		return seq, nil, true, nil
	}
	return seq, payload, false, nil
}

// Encoding, for tests and fake publishers.

// EngineForm selects how AppendEngineBatch lays a batch out among the forms engines use; a
// plain value, safe to copy and share.
type EngineForm struct {
	MapBatch  bool     // {"ts", "events", "data_parallel_rank"} instead of [ts, events, data_parallel_rank]
	MapEvents bool     // {"type": "BlockStored", ...} instead of ["BlockStored", ...]
	Hashes    HashForm // how block hashes are written
}

// HashForm is how AppendEngineBatch writes a block hash; a plain value.
type HashForm uint8

const (
	// HashUint: a msgpack unsigned integer, in its shortest encoding (vLLM's int hashes).
	HashUint HashForm = iota
	// HashInt64: the hash's bits as a signed integer, negative ones as msgpack int and the
	// others unsigned, as Python encoders write an int (SGLang).
	HashInt64
	// HashBytes32: 32 bytes of bin, 24 zero bytes then the hash big-endian (vLLM's sha256
	// digests, whose int form is their last 8 bytes).
	HashBytes32
)

// AppendEngineBatch appends b to dst as an engine's msgpack payload in form f and returns the
// extended slice. It writes what msgspec writes for vLLM's structs with omit_defaults:
// data_parallel_rank only if b.HasRank; stored events with lora_id nil, medium ("GPU", "CPU",
// "DISK", "EXTERNAL"), lora_name (nil for "") and, when MM is not nil, extra_keys holding
// one (identifier, 0) pair per multimodal hash, the identifier being the hash in 16 hex digits
// and 48 zeros. Each event's Rank and ID, and b's Skipped and Filtered, are not written.
//
// Values the format cannot carry are written so that Decode rejects them (a negative block
// size, an unknown tier) or skips them (an unknown kind becomes an unknown type tag).
func AppendEngineBatch(dst []byte, b *EngineBatch, f EngineForm) []byte {
	n := uint32(2)
	if b.HasRank {
		n = 3
	}
	if f.MapBatch {
		dst = msgp.AppendMapHeader(dst, n)
		dst = msgp.AppendString(dst, "ts")
	} else {
		dst = msgp.AppendArrayHeader(dst, n)
	}
	dst = msgp.AppendFloat64(dst, b.TS)
	if f.MapBatch {
		dst = msgp.AppendString(dst, "events")
	}
	dst = msgp.AppendArrayHeader(dst, uint32(min(uint64(len(b.Events)), math.MaxUint32)))
	for i := range b.Events {
		dst = appendEngineEvent(dst, &b.Events[i], f)
	}
	if b.HasRank {
		if f.MapBatch {
			dst = msgp.AppendString(dst, "data_parallel_rank")
		}
		dst = msgp.AppendUint32(dst, b.Rank)
	}
	return dst
}

// eventWriter writes an event's fields as array elements or as map pairs.
type eventWriter struct {
	dst  []byte
	keys bool
}

func (w *eventWriter) key(k string) {
	if w.keys {
		w.dst = msgp.AppendString(w.dst, k)
	}
}

func appendEngineEvent(dst []byte, e *kvevent.Event, f EngineForm) []byte {
	var tag string
	n := uint32(1)
	switch e.Kind {
	case kvevent.Stored:
		tag, n = "BlockStored", 8
		if e.MM != nil {
			n++
		}
	case kvevent.Removed:
		tag, n = "BlockRemoved", 3
	case kvevent.Cleared:
		tag = "AllBlocksCleared"
	default:
		tag = e.Kind.String()
	}
	w := eventWriter{dst: dst, keys: f.MapEvents}
	if f.MapEvents {
		w.dst = msgp.AppendMapHeader(w.dst, n)
	} else {
		w.dst = msgp.AppendArrayHeader(w.dst, n)
	}
	w.key("type")
	w.dst = msgp.AppendString(w.dst, tag)
	switch e.Kind {
	case kvevent.Stored:
		w.key("block_hashes")
		w.dst = appendEngineHashes(w.dst, e.Hashes, f.Hashes)
		w.key("parent_block_hash")
		if e.HasParent {
			w.dst = appendEngineHash(w.dst, e.Parent, f.Hashes)
		} else {
			w.dst = msgp.AppendNil(w.dst)
		}
		w.key("token_ids")
		w.dst = msgp.AppendArrayHeader(w.dst, uint32(min(uint64(len(e.Tokens)), math.MaxUint32)))
		for _, t := range e.Tokens {
			w.dst = msgp.AppendUint32(w.dst, t)
		}
		w.key("block_size")
		if e.BlockSize >= 0 {
			w.dst = msgp.AppendUint64(w.dst, uint64(e.BlockSize))
		} else {
			w.dst = msgp.AppendInt64(w.dst, int64(e.BlockSize))
		}
		w.key("lora_id")
		w.dst = msgp.AppendNil(w.dst)
		w.key("medium")
		w.dst = appendMedium(w.dst, e.Tier)
		w.key("lora_name")
		if e.LoRA == "" {
			w.dst = msgp.AppendNil(w.dst)
		} else {
			w.dst = msgp.AppendString(w.dst, e.LoRA)
		}
		if e.MM != nil {
			w.key("extra_keys")
			w.dst = msgp.AppendArrayHeader(w.dst, uint32(min(uint64(len(e.MM)), math.MaxUint32)))
			for _, x := range e.MM {
				if len(x) == 0 {
					w.dst = msgp.AppendNil(w.dst)
					continue
				}
				w.dst = msgp.AppendArrayHeader(w.dst, uint32(min(uint64(len(x)), math.MaxUint32)))
				for _, h := range x {
					w.dst = appendMMKey(w.dst, h)
				}
			}
		}
	case kvevent.Removed:
		w.key("block_hashes")
		w.dst = appendEngineHashes(w.dst, e.Hashes, f.Hashes)
		w.key("medium")
		w.dst = appendMedium(w.dst, e.Tier)
	}
	return w.dst
}

func appendMedium(dst []byte, t kvevent.Tier) []byte {
	switch t {
	case kvevent.Device:
		return msgp.AppendString(dst, "GPU")
	case kvevent.Host:
		return msgp.AppendString(dst, "CPU")
	case kvevent.Disk:
		return msgp.AppendString(dst, "DISK")
	case kvevent.External:
		return msgp.AppendString(dst, "EXTERNAL")
	}
	return msgp.AppendString(dst, t.String()) // "tier(n)", which Decode rejects
}

func appendEngineHashes(dst []byte, hs []uint64, f HashForm) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(min(uint64(len(hs)), math.MaxUint32)))
	for _, h := range hs {
		dst = appendEngineHash(dst, h, f)
	}
	return dst
}

func appendEngineHash(dst []byte, h uint64, f HashForm) []byte {
	switch f {
	case HashInt64:
		if int64(h) < 0 {
			return msgp.AppendInt64(dst, int64(h))
		}
	case HashBytes32:
		var d [32]byte
		binary.BigEndian.PutUint64(d[24:], h)
		return msgp.AppendBytes(dst, d[:])
	}
	return msgp.AppendUint64(dst, h)
}

// appendMMKey writes the (identifier, offset) pair whose identifier Decode reads back as h.
func appendMMKey(dst []byte, h uint64) []byte {
	const digits = "0123456789abcdef"
	var id [64]byte
	for i := 15; i >= 0; i-- {
		id[i] = digits[h&15]
		h >>= 4
	}
	for i := 16; i < len(id); i++ {
		id[i] = '0'
	}
	dst = msgp.AppendArrayHeader(dst, 2)
	dst = msgp.AppendStringFromBytes(dst, id[:])
	return msgp.AppendUint64(dst, 0)
}
