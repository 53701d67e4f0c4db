package u64map

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/memstat"
)

// BenchmarkMapVsBuiltin backs the choice of a hand-written engine-hash map over Go's map
// (docs/decisions.md): heap bytes per entry for workers of several sizes, and the cost of the
// steady churn of an engine's cache (one removal and one store per op).
func BenchmarkMapVsBuiltin(b *testing.B) {
	for _, size := range []int{1000, 30000, 1000000} {
		keys := make([]uint64, 2*size)
		r := rand.New(rand.NewPCG(uint64(size), 1))
		for i := range keys {
			keys[i] = r.Uint64() | 1
		}
		b.Run(fmt.Sprintf("impl=Map/entries=%d", size), func(b *testing.B) {
			before := memstat.HeapInUse()
			maps := make([]Map, 1e6/size)
			for i := range maps {
				for _, k := range keys[:size] {
					maps[i].Put(k, k)
				}
			}
			bytes := float64(memstat.HeapInUse()-before) / 1e6
			m := &maps[0]
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				m.Del(keys[i%(2*size)])
				m.Put(keys[(i+size)%(2*size)], 1)
			}
			b.ReportMetric(bytes, "B/entry")
		})
		b.Run(fmt.Sprintf("impl=builtin/entries=%d", size), func(b *testing.B) {
			before := memstat.HeapInUse()
			maps := make([]map[uint64]uint64, 1e6/size)
			for i := range maps {
				maps[i] = map[uint64]uint64{}
				for _, k := range keys[:size] {
					maps[i][k] = k
				}
			}
			bytes := float64(memstat.HeapInUse()-before) / 1e6
			m := maps[0]
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				delete(m, keys[i%(2*size)])
				m[keys[(i+size)%(2*size)]] = 1
			}
			b.ReportMetric(bytes, "B/entry")
		})
	}
}
