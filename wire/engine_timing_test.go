package wire_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// storedEngineBatch makes a batch of stored events only, each chained onto the previous one,
// with token ids drawn from a 150k vocabulary.
func storedEngineBatch(r *rand.Rand, events, blocks, blockSize int) *wire.EngineBatch {
	b := &wire.EngineBatch{TS: 1.7e9, HasRank: true}
	var parent uint64
	for i := range events {
		e := kvevent.Event{Kind: kvevent.Stored, BlockSize: blockSize, Parent: parent, HasParent: i > 0}
		for range blocks {
			e.Hashes = append(e.Hashes, r.Uint64())
		}
		for range blocks * blockSize {
			e.Tokens = append(e.Tokens, r.Uint32N(150000))
		}
		parent = e.Hashes[len(e.Hashes)-1]
		b.Events = append(b.Events, e)
	}
	return b
}

// BenchmarkDecodeEngineBatch decodes a batch of 32 stored events of 16 blocks of 16 tokens
// (256 tokens an event), the size of a busy engine step, in each engine form.
func BenchmarkDecodeEngineBatch(b *testing.B) {
	const events, blocks, blockSize = 32, 16, 16
	batch := storedEngineBatch(rand.New(rand.NewPCG(1, 1)), events, blocks, blockSize)
	nblocks := 0
	for i := range batch.Events {
		nblocks += len(batch.Events[i].Hashes)
	}
	for _, c := range []struct {
		name string
		form wire.EngineForm
	}{
		{"array/uint", wire.EngineForm{}},
		{"array/int64", wire.EngineForm{Hashes: wire.HashInt64}},
		{"array/bytes32", wire.EngineForm{Hashes: wire.HashBytes32}},
		{"map/uint", wire.EngineForm{MapBatch: true, MapEvents: true}},
	} {
		b.Run(fmt.Sprintf("%s/events=%d", c.name, events), func(b *testing.B) {
			payload := wire.AppendEngineBatch(nil, batch, c.form)
			var out wire.EngineBatch
			if err := out.Decode(payload); err != nil { // grow out's arenas
				b.Fatal(err)
			}
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if err := out.Decode(payload); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(nblocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
	// The same blocks as SGLang publishes them under EAGLE: token ids as overlapping pairs.
	b.Run(fmt.Sprintf("sglang-eagle/events=%d", events), func(b *testing.B) {
		payload := appendEaglePayload(nil, batch)
		var out wire.EngineBatch
		if err := out.Decode(payload); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for b.Loop() {
			if err := out.Decode(payload); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(nblocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
	})
}

// appendEaglePayload writes batch's stored events as SGLang does under EAGLE (SPEC.md §10.4):
// [ts, events, attn_dp_rank], each event positional with its tokens as pairs (token i,
// token i+1), the last pair's second token the first of the next event, hashes as int64.
func appendEaglePayload(dst []byte, batch *wire.EngineBatch) []byte {
	dst = msgp.AppendArrayHeader(dst, 3)
	dst = msgp.AppendFloat64(dst, batch.TS)
	dst = msgp.AppendArrayHeader(dst, uint32(len(batch.Events)))
	for i, e := range batch.Events {
		dst = msgp.AppendArrayHeader(dst, 7)
		dst = msgp.AppendString(dst, "BlockStored")
		dst = msgp.AppendArrayHeader(dst, uint32(len(e.Hashes)))
		for _, h := range e.Hashes {
			dst = msgp.AppendInt64(dst, int64(h))
		}
		if e.HasParent {
			dst = msgp.AppendInt64(dst, int64(e.Parent))
		} else {
			dst = msgp.AppendNil(dst)
		}
		after := uint32(0)
		if i+1 < len(batch.Events) {
			after = batch.Events[i+1].Tokens[0]
		}
		dst = msgp.AppendArrayHeader(dst, uint32(len(e.Tokens)))
		for j, t := range e.Tokens {
			next := after
			if j+1 < len(e.Tokens) {
				next = e.Tokens[j+1]
			}
			dst = msgp.AppendArrayHeader(dst, 2)
			dst = msgp.AppendUint32(dst, t)
			dst = msgp.AppendUint32(dst, next)
		}
		dst = msgp.AppendInt(dst, e.BlockSize)
		dst = msgp.AppendNil(dst)
		dst = msgp.AppendString(dst, "GPU")
	}
	return msgp.AppendInt(dst, 0)
}

// BenchmarkAppendEngineBatch encodes the same batch, as a fake publisher would.
func BenchmarkAppendEngineBatch(b *testing.B) {
	batch := storedEngineBatch(rand.New(rand.NewPCG(1, 1)), 32, 16, 16)
	buf := wire.AppendEngineBatch(nil, batch, wire.EngineForm{})
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = wire.AppendEngineBatch(buf[:0], batch, wire.EngineForm{})
	}
}
