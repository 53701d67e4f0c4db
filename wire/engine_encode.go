package wire

// Encoding engine payloads in every form engines use, for tests and fake publishers.

import (
	"encoding/binary"
	"math"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/tinylib/msgp/msgp"
)

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
// "DISK", "EXTERNAL"), lora_name (nil for "") and, when MM is not nil or Salt not empty,
// extra_keys holding one (identifier, 0) pair per multimodal hash, the identifier being the hash
// in 16 hex digits and 48 zeros, and the first block's the salt tagged "dynamo-cache-salt:". Each event's Rank and ID, and b's counts (Skipped, Filtered, UnknownMedium),
// are not written.
//
// Values the format cannot carry are written so that Decode rejects them (a negative block
// size, an unknown tier as an int medium) or skips them (an unknown kind becomes an unknown
// type tag).
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
		if e.MM != nil || e.Salt != "" && len(e.Hashes) > 0 {
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
		if salted := e.Salt != "" && len(e.Hashes) > 0; e.MM != nil || salted {
			// vLLM's extra keys, one entry per block; a cache salt among the first block's,
			// tagged as Dynamo's vLLM handler passes it.
			w.key("extra_keys")
			blocks := len(e.MM)
			if salted {
				blocks = len(e.Hashes)
			}
			w.dst = msgp.AppendArrayHeader(w.dst, uint32(min(uint64(blocks), math.MaxUint32)))
			for i := range blocks {
				var x []uint64
				if i < len(e.MM) {
					x = e.MM[i]
				}
				items := len(x)
				if i == 0 && salted {
					items++
				}
				if items == 0 {
					w.dst = msgp.AppendNil(w.dst)
					continue
				}
				w.dst = msgp.AppendArrayHeader(w.dst, uint32(min(uint64(items), math.MaxUint32)))
				if i == 0 && salted {
					w.dst = msgp.AppendString(w.dst, saltKey+e.Salt)
				}
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
	// An int, which Decode rejects: a str it does not know would be read back as the device.
	return msgp.AppendUint8(dst, uint8(t))
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
