package sim

import (
	"fmt"
	"testing"
)

func BenchmarkWorkerStep(b *testing.B) {
	for _, load := range []int{16, 128, 512} {
		b.Run(fmt.Sprintf("inflight=%d", load), func(b *testing.B) {
			s := newSteady(WorkerConfig{}, load)
			for range 5000 {
				s.step()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				s.step()
			}
			b.ReportMetric(float64(s.w.Running()), "running")
		})
	}
}
