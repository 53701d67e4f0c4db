package radix_test

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/memstat"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/puzpuzpuz/xsync/v4"
)

// BenchmarkIndexVsXsyncMap backs the choice of a hand-written table over xsync's concurrent map
// (docs/decisions.md): the same 10^6 blocks with one holder each, heap bytes per block, a random
// lookup, and a holder change. xsync.Map keeps a heap object per key and replaces it on update.
func BenchmarkIndexVsXsyncMap(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	b.Run("impl=radix", func(b *testing.B) {
		before := memstat.HeapInUse()
		ix, _ := radix.New(radix.Config{BlockSize: 16})
		s0, _ := ix.Acquire(radix.WorkerKey{ID: 1})
		s1, _ := ix.Acquire(radix.WorkerKey{ID: 2})
		for _, k := range keys {
			ix.Add(k, s0)
		}
		bytes := float64(memstat.HeapInUse()-before) / n
		b.ReportAllocs()
		b.ResetTimer()
		hits := 0
		for i := range b.N {
			k := keys[i&(n-1)]
			if ix.Has(k, s0) {
				hits++
			}
			if i&7 == 0 { // one write in eight: a second holder comes and goes
				ix.Add(k, s1)
				ix.Remove(k, s1)
			}
		}
		b.ReportMetric(bytes, "B/block")
		runtime.KeepAlive(hits)
	})
	b.Run("impl=xsync", func(b *testing.B) {
		before := memstat.HeapInUse()
		m := xsync.NewMap[uint64, uint64]()
		for _, k := range keys {
			m.Store(k, 1)
		}
		bytes := float64(memstat.HeapInUse()-before) / n
		b.ReportAllocs()
		b.ResetTimer()
		hits := 0
		for i := range b.N {
			k := keys[i&(n-1)]
			if v, ok := m.Load(k); ok && v&1 != 0 {
				hits++
			}
			if i&7 == 0 {
				m.Compute(k, func(v uint64, _ bool) (uint64, xsync.ComputeOp) { return v | 2, xsync.UpdateOp })
				m.Compute(k, func(v uint64, _ bool) (uint64, xsync.ComputeOp) { return v &^ 2, xsync.UpdateOp })
			}
		}
		b.ReportMetric(bytes, "B/block")
		runtime.KeepAlive(hits)
	})
}
