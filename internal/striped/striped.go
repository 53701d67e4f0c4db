// Package striped keeps histograms that many cores update at once, in stripes: an observation
// adds to one stripe, chosen by a hint the caller has at hand (a connection's id), and a read
// sums the stripes. Two cores observing through different hints write different cache lines,
// where one shared histogram would move its lines between them on every observation
// (BenchmarkObserveParallel compares the two). Striped counters are xsync.Counter's.
//
// Reads are for scrapes: each stripe is read atomically, the whole is not a snapshot (a read
// racing updates sees some of them), but counts never go back.
package striped

import (
	"math"
	"runtime"
	"sync/atomic"
)

// line is the span kept between two stripes: two cache lines, since cores prefetch lines in
// pairs.
const line = 128

// stripes is how many stripes each value has: the Ps rounded up to a power of two, at least 8
// (hints collide less) and at most 64.
var stripes = func() int {
	n := 8
	for n < runtime.GOMAXPROCS(0) && n < 64 {
		n *= 2
	}
	return n
}()

// padded is the uint64s a stripe of w words takes, padded to a whole line.
func padded(w int) int { return (w*8 + line - 1) / line * line / 8 }

// Histogram is a striped histogram of float64 observations over fixed upper bounds, counted as
// Prometheus counts them (an observation falls in the first bucket whose bound is ≥ it; the
// last bucket is +Inf). Its methods are safe for concurrent use.
type Histogram struct {
	upper  []float64
	stride int             // words per stripe: a count per bucket, +Inf's, the sum's bits
	v      []atomic.Uint64 // stripe s at v[s*stride:]
}

// NewHistogram returns an empty histogram over the ascending finite upper bounds upper.
func NewHistogram(upper []float64) *Histogram {
	h := &Histogram{upper: append([]float64(nil), upper...), stride: padded(len(upper) + 2)}
	h.v = make([]atomic.Uint64, stripes*h.stride)
	return h
}

// Upper returns the finite upper bounds; the caller must not change them.
func (h *Histogram) Upper() []float64 { return h.upper }

// Observe counts v in the stripe of hint.
func (h *Histogram) Observe(hint uint64, v float64) {
	b := len(h.upper)
	for i, u := range h.upper {
		if v <= u {
			b = i
			break
		}
	}
	st := h.v[int(hint&uint64(stripes-1))*h.stride:]
	st[b].Add(1)
	sum := &st[len(h.upper)+1]
	for {
		old := sum.Load()
		if sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// Read returns the observations' count and sum, and adds each bucket's count (not cumulative;
// the last is +Inf's) to counts, which must have len(Upper())+1 elements.
func (h *Histogram) Read(counts []uint64) (n uint64, sum float64) {
	nb := len(h.upper) + 1
	for s := range stripes {
		st := h.v[s*h.stride:]
		for b := range nb {
			c := st[b].Load()
			counts[b] += c
			n += c
		}
		sum += math.Float64frombits(st[nb].Load())
	}
	return n, sum
}
