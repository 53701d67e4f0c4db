package wire

// Engine events: the fields of BlockStored, BlockRemoved and AllBlocksCleared in vLLM's
// positional arrays and tagged maps and SGLang's, filtered by storage medium and KV-cache group,
// and their conversion to index events (SPEC.md §10.3, §10.4).

import (
	"encoding/binary"
	"math"
	"slices"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/tinylib/msgp/msgp"
	"github.com/zeebo/xxh3"
)

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
	fSalt   // map form only: Dynamo's publishers name it; vLLM's tuples carry it in extra_keys
	fMMKeys // map form only: TensorRT-LLM's multimodal segments per block
)

var evFieldNames = [...]string{
	fSkip: "", fHashes: "block_hashes", fParent: "parent_block_hash", fTokens: "token_ids",
	fBlockSize: "block_size", fLoRAID: "lora_id", fMedium: "medium", fLoRAName: "lora_name",
	fExtraKeys: "extra_keys", fGroup: "group_idx", fSpecKind: "kv_cache_spec_kind",
	fSpecWindow: "kv_cache_spec_sliding_window", fSalt: "cache_salt", fMMKeys: "mm_keys",
}

// Positional layouts: element i of an event array holds field [i]; element 0 is the tag. The
// elements after a layout's fixed fields, up to its tail length, hold the group fields, read by
// type (engineDecoder.tail); elements past them are ignored.
var (
	storedLayoutEngine  = [...]evField{fSkip, fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtraKeys}
	removedLayoutEngine = [...]evField{fSkip, fHashes, fMedium}
)

// Tail lengths, as Dynamo reads them: BlockStored's block_mm_infos (Dynamo's own producers),
// group_idx, kv_cache_spec_kind and kv_cache_spec_sliding_window; BlockRemoved's last three.
const (
	storedTail  = 4
	removedTail = 3
)

// sglangMetaPos is where SGLang's BlockStoredWithMetadata puts its metadata struct (a map
// holding cache_salt), the position that is lora_name in vLLM's layout.
const sglangMetaPos = 7

// Fields each kind reads, and must have.
const (
	storedFields   = 1<<fHashes | 1<<fParent | 1<<fTokens | 1<<fBlockSize | 1<<fLoRAID | 1<<fMedium | 1<<fLoRAName | 1<<fExtraKeys | 1<<fGroup | 1<<fSpecKind | 1<<fSpecWindow | 1<<fSalt | 1<<fMMKeys
	removedFields  = 1<<fHashes | 1<<fMedium | 1<<fGroup | 1<<fSpecKind | 1<<fSpecWindow
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
	case "cache_salt":
		f = fSalt
	case "mm_keys":
		f = fMMKeys
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
	seen    uint16 // fields read, by evField bit
	meta    evMeta // group fields and unknown medium, for the batch's group filter
	nExtra  int    // entries of extra_keys
	extraAt []byte // where extra_keys starts, for the count check
	// mmKeys are the blocks' multimodal hashes as mm_keys gave them (nil: none), and nMMKeys
	// its entries, for the count check.
	mmKeys  [][]uint64
	nMMKeys int
	mmAt    []byte
	// salts are the first two cache salts extra_keys' first block tags (see saltKey), for
	// when the event names none itself.
	salts [2][]byte
}

// saltKey is the prefix under which Dynamo's vLLM handler passes a request's cache salt into
// vLLM, which puts it among the extra keys of the request's first block; an untagged string
// there is a LoRA name or a multimodal identifier, never a salt.
const saltKey = "dynamo-cache-salt:"

// salt returns the cache salt extra_keys carried, as Dynamo reads it: the first tagged one,
// passing over once an item that is the LoRA name itself.
func (st *evState) salt(lora string) string {
	s := st.salts[0]
	if lora != "" && string(s) == lora {
		s = st.salts[1]
	}
	if s == nil {
		return ""
	}
	return alias(s[len(saltKey):])
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
	if e.Kind == 0 {
		out.Skipped++
		return r, nil
	}
	// Kept for now: which group the event belongs to is decided once the batch's rank is
	// known (EngineBatch.filterGroups).
	out.Events = append(out.Events, e)
	out.meta = append(out.meta, st.meta)
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
	tail := 0
	switch e.Kind {
	case kvevent.Stored:
		layout, tail = storedLayoutEngine[:], storedTail
	case kvevent.Removed:
		layout, tail = removedLayoutEngine[:], removedTail
	}
	for i := 1; i < int(n); i++ {
		if i >= len(layout) && i < len(layout)+tail {
			if r, err = d.tail(st, r, i, e.Kind == kvevent.Stored); err != nil {
				return nil, err
			}
			continue
		}
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
		for f := fHashes; f <= fMMKeys; f++ {
			if miss&(1<<f) != 0 {
				return d.errAt(at, evFieldNames[f], -1, -1, ErrInvalid, "missing from the %v event", e.Kind)
			}
		}
	}
	if st.nExtra != 0 && st.nExtra != len(e.Hashes) {
		return d.errAt(st.extraAt, "extra_keys", -1, -1, ErrInvalid, "%d entries for %d blocks, want one per block", st.nExtra, len(e.Hashes))
	}
	if st.nMMKeys != 0 && st.nMMKeys != len(e.Hashes) {
		return d.errAt(st.mmAt, "mm_keys", -1, -1, ErrInvalid, "%d entries for %d blocks, want one per block", st.nMMKeys, len(e.Hashes))
	}
	if st.mmKeys != nil {
		e.MM = st.mmKeys // what the engine says of its blocks' segments, over extra_keys'
	}
	if e.Kind == kvevent.Stored && e.Salt == "" {
		e.Salt = st.salt(e.LoRA)
	}
	if len(e.Salt) > MaxString {
		return d.errAt(at, "cache_salt", -1, -1, ErrTooLong, "%d bytes, max %d", len(e.Salt), MaxString)
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
			st.meta.unknown, st.meta.medium = true, alias(s) // the device tier, counted
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
	case fMMKeys:
		st.mmAt = b
		return d.mmKeys(out, st, b)
	case fSalt:
		if isNil(b) {
			return b[1:], nil // none: extra_keys may still carry one
		}
		s, r, err := d.str(b, name, -1, -1)
		e.Salt = alias(s)
		return r, err
	case fGroup:
		v, ok, r, err := d.groupIndex(b, name, -1)
		st.meta.group, st.meta.hasGroup = v, ok
		return r, err
	case fSpecWindow:
		_, _, r, err := d.groupIndex(b, name, -1) // checked as Dynamo reads it, not used
		return r, err
	case fSpecKind:
		if isNil(b) {
			return b[1:], nil
		}
		s, r, err := d.str(b, name, -1, -1)
		if err != nil {
			return nil, err
		}
		st.meta.kind = parseSpecKind(s)
		return r, nil
	}
	return d.skip(b, name, -1, -1) // lora_id: any value
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

// tokens reads token_ids into the token arena: token ids, or SGLang's EAGLE pairs if the first
// element is an array.
func (d *engineDecoder) tokens(out *EngineBatch, b []byte) ([]uint32, []byte, error) {
	const name = "token_ids"
	n, r, err := d.array(b, name)
	if err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, r, nil
	}
	if c := r[0]; c&0xf0 == 0x90 || c == 0xdc || c == 0xdd { // an array: d.array left r non-empty
		return d.bigramTokens(out, r, n)
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
		case msgp.NextType(r) == msgp.StrType:
			if t, r, err = d.placeholder(r, j); err != nil {
				return nil, nil, err
			}
		default:
			if t, r, err = d.token(r, j, -1); err != nil {
				return nil, nil, err
			}
		}
		out.tokens = append(out.tokens, t)
	}
	return out.tokens[start:len(out.tokens):len(out.tokens)], r, nil
}

// bigramTokens reads the n elements of token_ids that SGLang writes under EAGLE speculative
// decoding: its radix cache then keys KV slot i by the pair (token i, token i+1), and a page's
// BlockStored holds the page's pairs, each overlapping the next by one token. The tokens whose
// KV the page holds are the pairs' first elements, which are what the events get; the second
// element of the last pair, the token after the page, is checked against nothing and dropped
// (SPEC.md §10.4).
func (d *engineDecoder) bigramTokens(out *EngineBatch, b []byte, n uint32) ([]uint32, []byte, error) {
	start := len(out.tokens)
	out.tokens = slices.Grow(out.tokens, int(n))
	r := b
	var next uint32 // the second token of pair j-1, which pair j must start with
	for j := range int(n) {
		var first, second uint32
		var firstAt []byte
		// fixarray(2), as msgspec writes a tuple of two, of ints in the encodings of ids below
		// 2^32, inline: pairs are most of such a payload. Anything else the slow way.
		ok := false
		if len(r) > 0 && r[0] == 0x92 {
			q := r[1:]
			switch {
			case len(q) > 0 && q[0] < 0x80:
				first, q, ok = uint32(q[0]), q[1:], true
			case len(q) >= 3 && q[0] == 0xcd:
				first, q, ok = uint32(q[1])<<8|uint32(q[2]), q[3:], true
			case len(q) >= 5 && q[0] == 0xce:
				first, q, ok = binary.BigEndian.Uint32(q[1:]), q[5:], true
			case len(q) >= 2 && q[0] == 0xcc:
				first, q, ok = uint32(q[1]), q[2:], true
			}
			if ok {
				switch {
				case len(q) > 0 && q[0] < 0x80:
					second, q = uint32(q[0]), q[1:]
				case len(q) >= 3 && q[0] == 0xcd:
					second, q = uint32(q[1])<<8|uint32(q[2]), q[3:]
				case len(q) >= 5 && q[0] == 0xce:
					second, q = binary.BigEndian.Uint32(q[1:]), q[5:]
				case len(q) >= 2 && q[0] == 0xcc:
					second, q = uint32(q[1]), q[2:]
				default:
					ok = false
				}
			}
			if ok {
				firstAt, r = r[1:], q
			}
		}
		if !ok {
			var err error
			if first, second, firstAt, r, err = d.pair(r, j); err != nil {
				return nil, nil, err
			}
		}
		if j > 0 && first != next {
			return nil, nil, d.errAt(firstAt, "token_ids", j, 0, ErrInvalid,
				"%d, want %d, the second token of the pair before: EAGLE pairs overlap by one token", first, next)
		}
		next = second
		out.tokens = append(out.tokens, first)
	}
	return out.tokens[start:len(out.tokens):len(out.tokens)], r, nil
}

// pair reads token pair j in any encoding, or fails; firstAt is where its first token starts.
func (d *engineDecoder) pair(b []byte, j int) (first, second uint32, firstAt, r []byte, err error) {
	const want = "a token pair (EAGLE bigram): an array of 2 token ids"
	if msgp.NextType(b) != msgp.ArrayType {
		return 0, 0, nil, nil, d.bad(b, "token_ids", j, -1, want, nil)
	}
	m, r, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return 0, 0, nil, nil, d.bad(b, "token_ids", j, -1, want, err)
	}
	if m != 2 {
		return 0, 0, nil, nil, d.errAt(b, "token_ids", j, -1, ErrInvalid, "array of %d elements, want %s", m, want)
	}
	firstAt = r
	if first, r, err = d.token(r, j, 0); err != nil {
		return 0, 0, nil, nil, err
	}
	if second, r, err = d.token(r, j, 1); err != nil {
		return 0, 0, nil, nil, err
	}
	return first, second, firstAt, r, nil
}

// Dynamo's placeholder token for a multimodal object (pad_value_for_mm_hash, SGLang's
// _compute_pad_value): 10^6 plus the low 30 bits of the object's hash.
const (
	mmPadShift = 1_000_000
	mmPadMask  = 1<<30 - 1
)

// placeholder reads token id j given as a str: TensorRT-LLM writes a position that holds a
// multimodal object's embedding as that object's identifier. It becomes the object's
// placeholder token, as Dynamo rewrites the positions of an object to route by it (SPEC.md
// §10.4).
func (d *engineDecoder) placeholder(b []byte, j int) (uint32, []byte, error) {
	s, r, err := msgp.ReadStringZC(b)
	if err != nil {
		return 0, nil, d.bad(b, "token_ids", j, -1, "a token id or a multimodal identifier (str)", err)
	}
	h, ok := mmIdentifier(s)
	if !ok {
		return 0, nil, d.errAt(b, "token_ids", j, -1, ErrInvalid, "empty str, want a token id or a multimodal identifier")
	}
	return uint32(mmPadShift + h&mmPadMask), r, nil
}

// mmIdentifier is the hash Dynamo routes a multimodal object by: the first 16 hex digits of a
// 64-hex-digit identifier, XXH3-64 of any other; false for an empty one.
func mmIdentifier(s []byte) (uint64, bool) {
	if h, ok := mmHash(s); ok {
		return h, true
	}
	if len(s) == 0 {
		return 0, false
	}
	return xxh3.Hash(s), true
}

// mmKeys reads TensorRT-LLM's mm_keys: nil, or one entry per block, each nil or a list of the
// multimodal segments the block holds. A segment is a tagged map {"type": "mm_key", "hash",
// "start_offset", "uuid"?}; an array whose first element is the hash, or the bare hash, is read
// as well. The block's MM hashes are its segments' distinct objects, hashed by mmIdentifier;
// offsets and uuids do not change a block's identity.
func (d *engineDecoder) mmKeys(out *EngineBatch, st *evState, b []byte) ([]byte, error) {
	const name = "mm_keys"
	if isNil(b) {
		return b[1:], nil
	}
	n, r, err := d.array(b, name)
	if err != nil {
		return nil, err
	}
	st.nMMKeys = int(n)
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
			return nil, d.bad(r, name, j, -1, "nil or an array of multimodal keys", nil)
		}
		m, rr, err := msgp.ReadArrayHeaderBytes(r)
		if err != nil {
			return nil, d.bad(r, name, j, -1, "nil or an array of multimodal keys", err)
		}
		if err := d.count(at, rr, name, j, -1, m, 1); err != nil {
			return nil, err
		}
		r = rr
		first := len(out.mmData)
		for k := range int(m) {
			var h uint64
			if h, r, err = d.mmKey(r, j, k); err != nil {
				return nil, err
			}
			if !slices.Contains(out.mmData[first:], h) {
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
		return r, nil
	}
	st.mmKeys = out.mm[start:len(out.mm):len(out.mm)]
	return r, nil
}

// mmKey reads segment k of block j of mm_keys and returns its object's hash.
func (d *engineDecoder) mmKey(b []byte, j, k int) (uint64, []byte, error) {
	const name, want = "mm_keys", "a multimodal key: a map with a hash (str)"
	var id []byte
	var r []byte
	var err error
	switch msgp.NextType(b) {
	case msgp.StrType:
		if id, r, err = msgp.ReadStringZC(b); err != nil {
			return 0, nil, d.bad(b, name, j, k, want, err)
		}
	case msgp.ArrayType, msgp.MapType:
		isMap := msgp.NextType(b) == msgp.MapType
		var n uint32
		if isMap {
			n, r, err = msgp.ReadMapHeaderBytes(b)
		} else {
			n, r, err = msgp.ReadArrayHeaderBytes(b)
		}
		if err != nil {
			return 0, nil, d.bad(b, name, j, k, want, err)
		}
		per := 1
		if isMap {
			per = 2
		}
		if err := d.count(b, r, name, j, k, n, per); err != nil {
			return 0, nil, err
		}
		found := false
		for i := range int(n) {
			hashHere := !isMap && i == 0
			if isMap {
				var key []byte
				if key, r, err = d.key(r, name); err != nil {
					return 0, nil, err
				}
				hashHere = string(key) == "hash"
			}
			if hashHere && !found {
				if msgp.NextType(r) != msgp.StrType {
					return 0, nil, d.bad(r, name, j, k, "the hash of a multimodal key: str", nil)
				}
				if id, r, err = msgp.ReadStringZC(r); err != nil {
					return 0, nil, d.bad(r, name, j, k, want, err)
				}
				found = true
				continue
			}
			if r, err = d.skip(r, name, j, k); err != nil {
				return 0, nil, err
			}
		}
		if !found {
			return 0, nil, d.errAt(b, name, j, k, ErrInvalid, "no hash, want %s", want)
		}
	default:
		return 0, nil, d.bad(b, name, j, k, want, nil)
	}
	h, ok := mmIdentifier(id)
	if !ok {
		return 0, nil, d.errAt(b, name, j, k, ErrInvalid, "empty hash, want %s", want)
	}
	return h, r, nil
}

// token reads token id j (element k of pair j, if k ≥ 0) in any integer encoding, or fails;
// callers read the common encodings inline.
func (d *engineDecoder) token(b []byte, j, k int) (uint32, []byte, error) {
	const want = "a token id from 0 to 2^32-1"
	if t := msgp.NextType(b); t != msgp.IntType && t != msgp.UintType {
		return 0, nil, d.bad(b, "token_ids", j, k, want, nil)
	}
	v, r, err := msgp.ReadUint64Bytes(b)
	if err != nil {
		return 0, nil, d.bad(b, "token_ids", j, k, want, err)
	}
	if v > math.MaxUint32 {
		return 0, nil, d.errAt(b, "token_ids", j, k, ErrInvalid, "%d, want %s", v, want)
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
			if j == 0 && msgp.NextType(r) == msgp.StrType {
				st.noteSalt(r)
			}
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

// noteSalt remembers the string item at b if it is a tagged cache salt that is not empty.
func (st *evState) noteSalt(b []byte) {
	v, _, err := msgp.ReadStringZC(b)
	if err != nil || len(v) <= len(saltKey) || string(v[:len(saltKey)]) != saltKey {
		return
	}
	if st.salts[0] == nil {
		st.salts[0] = v
	} else if st.salts[1] == nil {
		st.salts[1] = v
	}
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
				if h, ok = mmHash(s); !ok && len(s) > 0 {
					// Tagged with its offset, any identifier is a multimodal object's
					// (an external renderer's, say): Dynamo hashes it with XXH3-64.
					h, ok = xxh3.Hash(s), true
				}
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
