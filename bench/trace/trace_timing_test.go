package trace

import (
	"os"
	"path/filepath"
	"testing"
)

func BenchmarkLoadMooncake(b *testing.B) {
	for _, name := range []string{"conversation", "synthetic"} {
		b.Run(name, func(b *testing.B) {
			path := filepath.Join(traceDir(), name+"_trace.jsonl")
			if _, err := os.Stat(path); err != nil {
				b.Skipf("trace %s absent", path)
			}
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				reqs, err := LoadMooncake(path, MooncakeOptions{})
				if err != nil {
					b.Fatal(err)
				}
				n += len(reqs)
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}

func BenchmarkMooncakeAppendTokens(b *testing.B) {
	ids := make([]uint64, 24) // the conversation trace's mean prompt, 24 blocks
	for i := range ids {
		ids[i] = uint64(i)
	}
	dst := make([]uint32, 0, len(ids)*MooncakeBlock)
	var opt MooncakeOptions
	b.SetBytes(int64(4 * cap(dst)))
	b.ReportAllocs()
	for b.Loop() {
		dst = opt.AppendTokens(dst[:0], ids, cap(dst))
	}
}

func BenchmarkHitBound(b *testing.B) {
	reqs := Synthetic(DefaultSynthetic())
	b.ReportAllocs()
	for b.Loop() {
		HitBound(reqs, 64)
	}
}
