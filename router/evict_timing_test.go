package router

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/memstat"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// BenchmarkMaxIndexBytes measures how well --max-index-bytes bounds memory: a router bounded to
// 64 MiB (1,048,576 residencies at ResidencyBytes; -short: 4 MiB) takes six times that in stores, chains of
// 16 blocks whose first 8 come from prefixes the workers share, while matches mark a tenth of
// the chains; the heap is measured when the bound is first reached, after three times the bound
// in stores, and at the end (all of it evicting since the bound). It reports the heap against
// the bound, the heap per residency, and how the heap moved while the stream went on at the
// bound: at first, as the tables fill with dead entries up to their load limits, and then.
func BenchmarkMaxIndexBytes(b *testing.B) {
	for _, workers := range []int{8, 1000} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			bound := int64(64 << 20)
			if testing.Short() {
				bound = 4 << 20 // the suite's smoke run
			}
			for range b.N {
				before := memstat.HeapInUse()
				r := New(Config{Shards: 2, MaxIndexBytes: bound, Logger: quiet()})
				for id := range uint64(workers) {
					if err := r.Register(Registration{ID: id + 1, Model: "m", BlockSize: 16}); err != nil {
						b.Fatal(err)
					}
				}
				rng := rand.New(rand.NewPCG(1, 2))
				budget := int64(bound / ResidencyBytes)
				var (
					ids     = make([]uint64, workers+1)
					batch   wire.EventBatch
					resp    wire.RouteResponse
					tokens  = make([]uint32, 16*16)
					stored  int64
					atBound uint64
				)
				var at3 uint64
				for stored < 6*budget {
					w := uint64(1 + rng.IntN(workers))
					prefix := uint32(rng.IntN(4096)) // 8 blocks shared by every chain of this prefix
					for i := range tokens[:8*16] {
						tokens[i] = prefix*131 + uint32(i)
					}
					for i := range tokens[8*16:] {
						tokens[8*16+i] = rng.Uint32()
					}
					// Engine hashes name content, as an engine's do: a shared block gets its own.
					ev := kvevent.Event{Kind: kvevent.Stored, Tokens: tokens}
					for i := range 8 {
						ev.Hashes = append(ev.Hashes, uint64(prefix)<<8|uint64(i)|1<<40)
					}
					for range 8 {
						ev.Hashes = append(ev.Hashes, rng.Uint64()|1<<50)
					}
					ids[w]++
					ev.ID = ids[w]
					batch = wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{ev}}
					if _, err := r.ApplyEvents(&batch, nil); err != nil {
						b.Fatal(err)
					}
					stored += 16
					if rng.IntN(10) == 0 {
						_ = r.Match(&wire.RouteRequest{Model: "m", Tokens: tokens}, &resp)
					}
					if atBound == 0 && r.set.Stats().Residencies >= budget-16 {
						atBound = memstat.HeapInUse() - before
					}
					if at3 == 0 && stored >= 3*budget {
						at3 = memstat.HeapInUse() - before
					}
				}
				after := memstat.HeapInUse() - before
				st := r.set.Stats()
				b.ReportMetric(float64(after)/(1<<20), "heap-MiB")
				b.ReportMetric(float64(after)/float64(bound), "heap/bound")
				b.ReportMetric(float64(after)/float64(st.Residencies), "B/residency")
				b.ReportMetric(float64(at3)/float64(atBound), "heap-3x/heap-at-bound")
				b.ReportMetric(float64(after)/float64(at3), "heap-6x/heap-3x")
				b.ReportMetric(float64(st.Residencies), "residencies")
				b.ReportMetric(float64(st.Evicted), "evicted")
				b.ReportMetric(float64(st.SkippedBlocks), "skipped")
				r.Close()
			}
		})
	}
}
