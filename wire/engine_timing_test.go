package wire_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

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
