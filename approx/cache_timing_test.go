package approx

import (
	"math"
	"testing"
	"time"
)

// BenchmarkCacheRecord records 128-block requests at the default cap of 2^20 residencies, past
// the first prune, so that pruning is in the numbers. Families of requests share a prompt:
//   - churn: 96 shared blocks, then 32 of the request's own, which pruning must take out again;
//   - shared: all 128 blocks shared, mostly refreshes;
//   - oneshot: churn, pruning from the cap to the target in one call, as Dynamo does.
//
// worst-µs is the slowest call: a whole prune for oneshot (about 20 ms); otherwise the growth of
// a worker's map to a new peak, or the machine's noise.
func BenchmarkCacheRecord(b *testing.B) {
	for _, bc := range []struct {
		name                      string
		workers, families, unique int
		oneshot                   bool
	}{
		{"workers=8/churn", 8, 64, 32, false},
		{"workers=1000/churn", 1000, 4000, 32, false},
		{"workers=1000/shared", 1000, 10000, 0, false},
		{"workers=1000/oneshot", 1000, 4000, 32, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := newCache(b, Config{})
			if bc.oneshot {
				c.step = math.MaxInt32
			}
			s := newSteady(bc.workers, bc.families, bc.unique)
			var added, evicted []Residency
			var now int64
			step := func() {
				now += int64(10 * time.Microsecond)
				w, seqs := s.next()
				added, evicted = c.Record(w, seqs, now, added[:0], evicted[:0])
			}
			// Until a prune has run to the end (the slab, maps and buffers have grown), or for
			// a working set that stays below the cap, 100,000 requests (2,000 with -short).
			limit := 100_000
			if testing.Short() {
				limit = 2000
			}
			for pruned, n := false, 0; (!pruned || c.pruning) && n < limit; n++ {
				step()
				pruned = pruned || len(evicted) > 0
			}
			var worst time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				step()
				worst = max(worst, time.Since(t0))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*128), "ns/block")
			b.ReportMetric(float64(worst.Nanoseconds())/1e3, "worst-µs")
		})
	}
}
