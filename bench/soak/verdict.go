package main

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Sample, a plain value, is one reading of the daemon, taken every Config.Interval.
type Sample struct {
	At         float64 // seconds since the load started
	RSS        int64   // VmRSS of /proc/PID/status, bytes
	Goroutines int     // go_goroutines of /metrics
	FDs        int     // entries of /proc/PID/fd
	HeapInuse  int64   // go_memstats_heap_inuse_bytes of /metrics
	// HeapGoal is go_memstats_next_gc_bytes, the heap size at which the next collection
	// starts: twice the heap live after the last one (GOGC 100), so a smooth reading of the
	// live heap, for the reader: not judged.
	HeapGoal    int64
	Active      int // kvrouterd_active_requests: bookings held
	Residencies int // kvrouterd_index_residencies over every model
	Evicted     int // kvrouterd_index_evicted_blocks_total (with MaxIndexBytes)
}

// Tolerance, a plain value, is what the verdict lets the daemon grow between the first and the
// last third of the samples taken after warm-up, and the absolute bounds on its goroutines and
// file descriptors.
type Tolerance struct {
	// RSS may grow by the larger of RSSFrac of the first third's median and RSSBytes.
	RSSFrac  float64
	RSSBytes int64
	// The heap in use may grow by the larger of HeapFrac of the first third's median and
	// HeapBytes.
	HeapFrac  float64
	HeapBytes int64
	// Goroutines may grow by the larger of GoroutineFrac of the first third's median and
	// GoroutineCount, and never exceed IdleGoroutines + GoroutineHeadroom.
	GoroutineFrac     float64
	GoroutineCount    int
	IdleGoroutines    int // go_goroutines of the daemon before the load started
	GoroutineHeadroom int
	// File descriptors may grow by the larger of FDFrac of the first third's median and
	// FDCount, and never exceed IdleFDs + FDHeadroom.
	FDFrac     float64
	FDCount    int
	IdleFDs    int // the daemon's open descriptors before the load started
	FDHeadroom int
}

// DefaultTolerance is the verdict's tolerance for a soak whose warm-up lasts settle or longer;
// docs/performance.md ("Soak") says why each value.
var DefaultTolerance = Tolerance{
	RSSFrac: 0.10, RSSBytes: 8 << 20,
	HeapFrac: 0.10, HeapBytes: 8 << 20,
	GoroutineFrac: 0.10, GoroutineCount: 10, GoroutineHeadroom: 100,
	FDFrac: 0.10, FDCount: 10, FDHeadroom: 100,
}

// settle is how long a fresh daemon's RSS climbs under the soak's load before it levels: the
// 30-minute run of docs/performance.md went from 42 MiB at 5 s to 66 MiB at 60 s and about
// 75 MiB at five minutes, and then stayed between 60 and 94 MiB with its medians level. A
// soak whose warm-up ends sooner judges part of that climb: 3-minute and 30-second runs
// measured the last third's median 8 to 11 MiB above the first's without a leak, so they are
// allowed youngRSSBytes, and youngHeapBytes of heap in use (the climb is the heap's: the event
// stream's block cache stepping up to its 8 MiB buffer, docs/performance.md).
const (
	settle         = 5 * time.Minute
	youngRSSBytes  = 24 << 20
	youngHeapBytes = 16 << 20
)

// Stats, a plain value, are the minimum, median and maximum of a run of samples.
type Stats struct{ Min, Median, Max float64 }

func stats(v []float64) Stats {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return Stats{s[0], m, s[n-1]}
}

// Growth, a plain value, compares one quantity's first and last thirds after warm-up.
type Growth struct {
	First, Last Stats
	Limit       float64 // the largest Last.Median that passes
	// Slope is the Theil–Sen slope over every sample after warm-up, per minute: the median of
	// the slopes between pairs of samples, which the collector's sawtooth and a snapshot's
	// spike barely move. For the reader: the thirds decide.
	Slope float64
}

// Verdict, a plain value, is the judgment of a soak's samples.
type Verdict struct {
	RSS, Heap, Goroutines, FDs Growth
	MaxGoroutines, MaxFDs      int // the absolute bounds
	Failures                   []string
}

// Pass reports whether nothing grew past its tolerance.
func (v Verdict) Pass() bool { return len(v.Failures) == 0 }

// errFewSamples: thirds of fewer than two samples have no meaningful median.
var errFewSamples = errors.New("soak: fewer than 6 samples after warm-up: run longer or sample more often")

// judge decides from the samples taken after warm-up whether the daemon's RSS, heap in use,
// goroutines or file descriptors grew. Each quantity's median over the last third of the
// samples is compared with its median over the first third: a median over several seconds of
// samples is blind to the garbage collector's sawtooth and to one snapshot's transient
// buffers, and the gap between the thirds' centres (two thirds of the judged time) leaves a
// steady leak room to show. The goroutines and descriptors also have absolute bounds, which
// catch a leak that grew during warm-up and then stopped.
func judge(after []Sample, tol Tolerance) (Verdict, error) {
	var v Verdict
	n := len(after)
	if n < 6 {
		return v, errFewSamples
	}
	third := n / 3
	grow := func(name string, get func(Sample) float64, frac, least float64, unit func(float64) string) Growth {
		vals := make([]float64, n)
		for i, s := range after {
			vals[i] = get(s)
		}
		g := Growth{First: stats(vals[:third]), Last: stats(vals[n-third:]), Slope: theilSen(after, vals)}
		g.Limit = g.First.Median + max(frac*g.First.Median, least)
		if g.Last.Median > g.Limit {
			v.Failures = append(v.Failures, fmt.Sprintf("%s grew: median %s in the last third, %s in the first (limit %s)",
				name, unit(g.Last.Median), unit(g.First.Median), unit(g.Limit)))
		}
		return g
	}
	mib := func(x float64) string { return fmt.Sprintf("%.1f MiB", x/(1<<20)) }
	count := func(x float64) string { return fmt.Sprintf("%.0f", x) }
	v.RSS = grow("RSS", func(s Sample) float64 { return float64(s.RSS) }, tol.RSSFrac, float64(tol.RSSBytes), mib)
	v.Heap = grow("heap in use", func(s Sample) float64 { return float64(s.HeapInuse) }, tol.HeapFrac, float64(tol.HeapBytes), mib)
	v.Goroutines = grow("goroutines", func(s Sample) float64 { return float64(s.Goroutines) }, tol.GoroutineFrac, float64(tol.GoroutineCount), count)
	v.FDs = grow("file descriptors", func(s Sample) float64 { return float64(s.FDs) }, tol.FDFrac, float64(tol.FDCount), count)
	bound := func(name string, get func(Sample) int, idle, headroom int) int {
		most := idle + headroom
		for _, s := range after {
			if x := get(s); x > most {
				v.Failures = append(v.Failures, fmt.Sprintf("%d %s at %.0fs: more than %d (%d idle + %d)",
					x, name, s.At, most, idle, headroom))
				break
			}
		}
		return most
	}
	v.MaxGoroutines = bound("goroutines", func(s Sample) int { return s.Goroutines }, tol.IdleGoroutines, tol.GoroutineHeadroom)
	v.MaxFDs = bound("file descriptors", func(s Sample) int { return s.FDs }, tol.IdleFDs, tol.FDHeadroom)
	return v, nil
}

// maxSlopePairs bounds the pairs theilSen looks at: every pair of up to 400 samples, a
// regular subsample of longer runs.
const maxSlopePairs = 400

// theilSen returns the median of the slopes between pairs of samples at different times, per
// minute, vals[i] being samples[i]'s value.
func theilSen(samples []Sample, vals []float64) float64 {
	step := max(1, (len(samples)+maxSlopePairs-1)/maxSlopePairs)
	var slopes []float64
	for i := 0; i < len(samples); i += step {
		for j := i + step; j < len(samples); j += step {
			if dt := samples[j].At - samples[i].At; dt > 0 {
				slopes = append(slopes, (vals[j]-vals[i])/dt*60)
			}
		}
	}
	if len(slopes) == 0 {
		return 0
	}
	return stats(slopes).Median
}
