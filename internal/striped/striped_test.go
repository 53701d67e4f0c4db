package striped

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/puzpuzpuz/xsync/v4"
)

// TestHistogramAsPrometheus: observations spread over every stripe count into the same buckets,
// count and sum as a Prometheus histogram's over the same bounds, bounds themselves included.
func TestHistogramAsPrometheus(t *testing.T) {
	upper := prometheus.ExponentialBuckets(0.01, 3, 17)
	h := NewHistogram(upper)
	p := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x", Buckets: upper})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		v := rng.ExpFloat64() * 10
		switch i % 7 {
		case 0:
			v = upper[rng.IntN(len(upper))] // on a bound: that bucket
		case 1:
			v = -v
		case 2:
			v = 1e9 // past the last bound: +Inf's
		}
		h.Observe(uint64(i), v)
		p.Observe(v)
	}
	var m dto.Metric
	if err := p.Write(&m); err != nil {
		t.Fatal(err)
	}
	counts := make([]uint64, len(upper)+1)
	n, sum := h.Read(counts)
	if n != m.GetHistogram().GetSampleCount() {
		t.Fatalf("count %d, Prometheus %d", n, m.GetHistogram().GetSampleCount())
	}
	if want := m.GetHistogram().GetSampleSum(); sum < want*(1-1e-9) || sum > want*(1+1e-9) {
		t.Fatalf("sum %v, Prometheus %v", sum, want)
	}
	var cum uint64
	for b, pb := range m.GetHistogram().GetBucket() {
		cum += counts[b]
		if pb.GetUpperBound() != upper[b] || pb.GetCumulativeCount() != cum {
			t.Fatalf("bucket ≤ %v: %d cumulative, Prometheus %d (≤ %v)", upper[b], cum, pb.GetCumulativeCount(), pb.GetUpperBound())
		}
	}
	if cum+counts[len(upper)] != n {
		t.Fatalf("the buckets hold %d, +Inf %d, of %d", cum, counts[len(upper)], n)
	}
}

// TestConcurrent: observations from many goroutines, each hint its own or shared, all count
// (and -race finds no race between them and reads).
func TestConcurrent(t *testing.T) {
	h := NewHistogram([]float64{1, 2, 3})
	const goroutines, each = 16, 5000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				hint := uint64(g)
				if i%3 == 0 {
					hint = 0 // contended
				}
				h.Observe(hint, float64(i%4)+0.5)
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			h.Read(make([]uint64, 4))
		}
	})
	wg.Wait()
	counts := make([]uint64, 4)
	n, sum := h.Read(counts)
	if n != goroutines*each || sum != goroutines*each/4*(0.5+1.5+2.5+3.5) {
		t.Fatalf("histogram count %d sum %v", n, sum)
	}
	for b, k := range counts {
		if k != goroutines*each/4 {
			t.Fatalf("bucket %d holds %d, want %d", b, k, goroutines*each/4)
		}
	}
}

// TestObserveAllocatesNothing: Observe is for hot paths.
func TestObserveAllocatesNothing(t *testing.T) {
	h := NewHistogram(prometheus.LinearBuckets(0, 0.05, 21))
	if n := testing.AllocsPerRun(1000, func() { h.Observe(7, 0.33) }); n != 0 {
		t.Fatalf("%v allocations per update", n)
	}
}

// BenchmarkObserveParallel: one Observe (21 bounds) and one counter Add per call, from every P,
// each goroutine with its own hint, the counter an xsync.Counter (what the server counts
// requests with), against a Prometheus histogram and counter.
func BenchmarkObserveParallel(b *testing.B) {
	upper := prometheus.LinearBuckets(0, 0.05, 21)
	b.Run("striped", func(b *testing.B) {
		c, h := xsync.NewCounter(), NewHistogram(upper)
		var next sync.Mutex
		hint := uint64(0)
		b.RunParallel(func(pb *testing.PB) {
			next.Lock()
			hint++
			mine := hint
			next.Unlock()
			for pb.Next() {
				c.Inc()
				h.Observe(mine, 0.33)
			}
		})
	})
	b.Run("prometheus", func(b *testing.B) {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c"})
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: upper})
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Inc()
				h.Observe(0.33)
			}
		})
	})
}
