package radix_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

func BenchmarkHashBlocks(b *testing.B) {
	for _, bs := range []int{16, 64} {
		b.Run(fmt.Sprintf("bs=%d", bs), func(b *testing.B) {
			const blocks = 128
			tokens := make([]uint32, blocks*bs)
			r := rand.New(rand.NewPCG(1, 1))
			for i := range tokens {
				tokens[i] = r.Uint32N(150000)
			}
			var h radix.Hasher
			buf := make([]uint64, 0, blocks)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				buf = h.AppendSequence(buf[:0], tokens, bs, radix.BaseSeed)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
		})
	}
}

// fleet is an index filled like a serving fleet's: every worker holds conversations that start
// with one of a few shared system prompts; a quarter of the conversations are also held by a
// second worker (a session that moved). Queries are whole cached conversations, so every query
// block is walked: ns/block is not flattered by early stops.
type fleet struct {
	ix          *radix.Index
	queries     [][]uint64
	residencies int64
	queryBlocks int
}

const (
	systemPrompts = 16
	systemBlocks  = 8
	convBlocks    = 56 // conversation length after the system prompt
)

func buildFleet(tb testing.TB, residencies, workers int) *fleet {
	r := rand.New(rand.NewPCG(uint64(residencies), uint64(workers)))
	ix := newIndex(tb, 16)
	slots := make([]radix.Slot, workers)
	for w := range slots {
		slots[w] = acquire(tb, ix, uint64(w))
	}
	prompts := make([][]uint64, systemPrompts)
	for p := range prompts {
		prompts[p] = make([]uint64, systemBlocks)
		for i := range prompts[p] {
			prompts[p][i] = r.Uint64()
		}
		radix.ChainInPlace(prompts[p], 0, false)
	}
	f := &fleet{ix: ix}
	perWorker := residencies / workers
	conv := min(convBlocks, max(perWorker-systemBlocks, 1))
	held := make([]int, workers)
	for w := 0; w < workers; {
		if held[w] >= perWorker {
			w++
			continue
		}
		p := prompts[r.IntN(systemPrompts)]
		q := make([]uint64, systemBlocks+conv)
		copy(q, p)
		for i := systemBlocks; i < len(q); i++ {
			q[i] = radix.SeqHash(q[i-1], r.Uint64())
		}
		holders := []int{w}
		if r.IntN(4) == 0 && workers > 1 {
			holders = append(holders, r.IntN(workers))
		}
		for _, h := range holders {
			for _, k := range q {
				if ix.Add(k, slots[h]) {
					held[h]++
				}
			}
		}
		if len(f.queries) < 1<<14 || r.IntN(8) == 0 {
			f.queries = append(f.queries, q)
		}
	}
	if len(f.queries) > 1<<14 {
		r.Shuffle(len(f.queries), func(i, j int) { f.queries[i], f.queries[j] = f.queries[j], f.queries[i] })
		f.queries = f.queries[:1<<14]
	}
	f.residencies = ix.Stats().Residencies
	f.queryBlocks = systemBlocks + conv
	return f
}

var cachedFleet struct {
	key string
	f   *fleet
}

// getFleet builds a fleet once for all the runs of a sub-benchmark (10^7 residencies take a few
// seconds), keeping only the last one alive.
func getFleet(b *testing.B, residencies, workers int) *fleet {
	key := fmt.Sprint(residencies, workers)
	if cachedFleet.key != key {
		cachedFleet.f = nil
		runtime.GC()
		cachedFleet.f, cachedFleet.key = buildFleet(b, residencies, workers), key
	}
	return cachedFleet.f
}

func BenchmarkIndexMatch(b *testing.B) {
	for _, res := range []int{1e4, 1e6, 1e7} {
		for _, workers := range []int{8, 1000} {
			b.Run(fmt.Sprintf("residencies=%.0e/workers=%d", float64(res), workers), func(b *testing.B) {
				if testing.Short() && res > 1e6 {
					b.Skip("10^7 residencies take seconds to build; not in -short")
				}
				f := getFleet(b, res, workers)
				var m radix.Match
				b.ReportAllocs()
				b.ResetTimer()
				blocks, workers := 0, 0
				for i := range b.N {
					q := f.queries[i%len(f.queries)]
					f.ix.Match(q, &m)
					blocks += len(q)
					workers += len(m.Slots)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(blocks), "ns/block")
				b.ReportMetric(float64(workers)/float64(b.N), "workers/query")
				b.ReportMetric(float64(f.residencies), "residencies")
			})
		}
	}
}

// BenchmarkIndexMatchTiers is BenchmarkIndexMatch with a host tier in use: the second half of
// every query's conversation has been offloaded (moved from each holder's device to its host
// tier), so every match extends the device depth through the host tier. tiered/query is how
// many slots an extension was reported for.
func BenchmarkIndexMatchTiers(b *testing.B) {
	for _, workers := range []int{8, 1000} {
		b.Run(fmt.Sprintf("residencies=1e+06/workers=%d", workers), func(b *testing.B) {
			cachedFleet.f, cachedFleet.key = nil, "" // this fleet is changed: build its own
			runtime.GC()
			f := buildFleet(b, 1e6, workers)
			host := f.ix.EnsureTier(kvevent.Host)
			var hold []radix.Slot
			moved := map[uint64]bool{}
			for _, q := range f.queries {
				for _, k := range q[len(q)/2:] {
					if moved[k] {
						continue
					}
					moved[k] = true
					hold = f.ix.AppendHolders(hold[:0], k)
					for _, s := range hold {
						f.ix.Remove(k, s)
						host.Add(k, s)
					}
				}
			}
			var m radix.Match
			b.ReportAllocs()
			b.ResetTimer()
			blocks, tiered := 0, 0
			for i := range b.N {
				q := f.queries[i%len(f.queries)]
				f.ix.Match(q, &m)
				blocks += len(q)
				tiered += len(m.Tiers)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(blocks), "ns/block")
			b.ReportMetric(float64(tiered)/float64(b.N), "tiered/query")
		})
	}
}
