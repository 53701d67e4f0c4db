package prefetch

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// BenchmarkMemory shows what prefetching is for, on a 64 MiB array (beyond any cache here), in
// ns per load (docs/decisions.md quotes it):
//   - chase: each load's address comes from the previous load: one full memory latency each;
//   - windows: 16 independent loads, then work that depends on all of them: the loads overlap,
//     but each window still waits out a full latency;
//   - prefetched: the next window's lines are prefetched before this window's work, so the
//     latency hides behind it (what the index walk and event application do).
func BenchmarkMemory(b *testing.B) {
	const n = 8 << 20 // 64 MiB of uint64
	arr := make([]uint64, n)
	perm := rand.New(rand.NewPCG(1, 2)).Perm(n)
	for i := range arr {
		arr[perm[i]] = uint64(perm[(i+1)%n])
	}
	addr := func(i int) uint64 { x := uint64(i) * 0x9e3779b97f4a7c15; return (x ^ x>>29) & (n - 1) }
	const w = 16
	var sink uint64
	b.Run("chase", func(b *testing.B) {
		x := uint64(0)
		for range b.N {
			x = arr[x]
		}
		sink += x
	})
	b.Run("windows", func(b *testing.B) {
		s := uint64(0)
		var tmp [w]uint64
		for i := 0; i < b.N; i += w {
			for j := range w {
				tmp[j] = arr[(addr(i+j)+s)&(n-1)]
			}
			for j := range w {
				s += tmp[j] >> 62 // the next window depends on this one (the values are < 2^62)
			}
		}
		sink += s
	})
	b.Run("prefetched", func(b *testing.B) {
		s := uint64(0)
		var next [w]unsafe.Pointer
		for j := range w {
			next[j] = unsafe.Pointer(&arr[addr(j)])
		}
		for i := 0; i < b.N; i += w {
			cur := next
			for j := range w {
				next[j] = unsafe.Pointer(&arr[addr(i+w+j)])
			}
			Lines(next[:])
			for j := range w {
				s += *(*uint64)(cur[j]) >> 62
			}
		}
		sink += s
	})
	_ = sink
}
