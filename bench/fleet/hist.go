package fleet

import (
	"math/bits"
	"time"
)

// histSub is the number of buckets per power of two: a bucket is at most 1/histSub of its
// values wide, so a quantile read from its middle is within 1/(2·histSub) (0.8 %) of the value.
const histSub = 64

// Hist is a histogram of positive durations in fixed memory (32 KiB) whatever their count:
// values below histSub ns exactly, the others in buckets histSub to a power of two. Its
// quantiles are within 0.8 % of the exact ones (nearest rank, as the report's). The zero value is
// empty and ready; a Hist is used by one goroutine.
type Hist struct {
	n      int64
	sum    float64 // ns
	max    time.Duration
	counts [64 * histSub]int64
}

func histBucket(d time.Duration) int {
	v := uint64(d)
	if v < histSub {
		return int(v)
	}
	e := bits.Len64(v) - 1 // ≥ 6
	return (e-5)*histSub + int(v>>(e-6))&(histSub-1)
}

// histMid is the middle of bucket b.
func histMid(b int) time.Duration {
	if b < histSub {
		return time.Duration(b)
	}
	e, m := b/histSub+5, uint64(b%histSub)
	lo := (histSub + m) << (e - 6)
	return time.Duration(lo + (uint64(1)<<(e-6))/2)
}

// Add counts d; d ≤ 0 (a request never served) is not counted.
func (h *Hist) Add(d time.Duration) {
	if d <= 0 {
		return
	}
	h.n++
	h.sum += float64(d)
	h.max = max(h.max, d)
	h.counts[histBucket(d)]++
}

// N is the number of values counted.
func (h *Hist) N() int64 { return h.n }

// Mean is the values' mean (exact), 0 when empty.
func (h *Hist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile is the value of rank ⌊q·N⌋ (0-based, the last at most) in sorted order, within
// 0.8 %; 0 when empty.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := min(h.n-1, int64(q*float64(h.n)))
	for b, c := range h.counts {
		if rank < c {
			return min(histMid(b), h.max)
		}
		rank -= c
	}
	return h.max
}
