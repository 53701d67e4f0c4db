package enginetest

// Payloads the engines publish that wire.AppendEngineBatch does not write.

import (
	"bytes"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvrouterd/kvrouterd/wire"
)

// SGLangEAGLE is the batch an SGLang worker running EAGLE publishes once its radix cache
// holds tokens, built as SGLang builds it: the key is the tokens' pairs (token i, token i+1)
// (convert_to_bigram_key), cut to whole pages; the new node's pages become one BlockStored each
// (_record_store_event), the first a root, each later one chained to the page before by its
// signed int64 hash, holding the page's pairs as token_ids, block_size the page size, lora_id
// nil, medium "GPU"; msgspec writes the array-like structs and the batch [ts, events,
// attn_dp_rank] with every field.
func SGLangEAGLE(tokens []uint32, pageSize int, hash0 int64) []byte {
	pages := (len(tokens) - 1) / pageSize
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 1747000003.5)
	b = msgp.AppendArrayHeader(b, uint32(pages))
	for p := range pages {
		b = msgp.AppendArrayHeader(b, 7)
		b = msgp.AppendString(b, "BlockStored")
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendInt64(b, hash0-int64(p))
		if p == 0 {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendInt64(b, hash0-int64(p-1))
		}
		b = msgp.AppendArrayHeader(b, uint32(pageSize))
		for i := p * pageSize; i < (p+1)*pageSize; i++ {
			b = msgp.AppendArrayHeader(b, 2)
			b = msgp.AppendUint32(b, tokens[i])
			b = msgp.AppendUint32(b, tokens[i+1])
		}
		b = msgp.AppendInt(b, pageSize)
		b = msgp.AppendNil(b)
		b = msgp.AppendString(b, "GPU")
	}
	return msgp.AppendInt(b, 0)
}

// WithMedium encodes b in form f with every "GPU" medium renamed medium, a name of three
// letters (every form writes the medium as the same msgpack string).
func WithMedium(b *wire.EngineBatch, f wire.EngineForm, medium string) []byte {
	return bytes.ReplaceAll(wire.AppendEngineBatch(nil, b, f), []byte("\xa3GPU"), append([]byte{0xa3}, medium...))
}
