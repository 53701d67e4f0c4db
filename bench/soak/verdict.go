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
	HeapInuse  int64   // go_memstats_heap_inuse_bytes, for the reader: not judged
	// HeapGoal is go_memstats_next_gc_bytes, the heap size at which the next collection
	// starts: twice the heap live after the last one (GOGC 100), so a smooth reading of the
	// live heap, for the reader: not judged.
	HeapGoal    int64
	Active      int // kvrouterd_active_requests: bookings held
	Residencies int // kvrouterd_index_residencies over every model
	Evicted     int // kvrouterd_index_evicted_blocks_total (with MaxIndexBytes)
}

// Tolerance, a plain value, is what the verdict lets the daemon grow between the first and the
// last third of the samples taken after warm-up, and the absolute bound on its goroutines.
type Tolerance struct {
	// RSS may grow by the larger of RSSFrac of the first third's median and RSSBytes.
	RSSFrac  float64
	RSSBytes int64
	// Goroutines may grow by the larger of GoroutineFrac of the first third's median and
	// GoroutineCount, and never exceed IdleGoroutines + GoroutineHeadroom.
	GoroutineFrac     float64
	GoroutineCount    int
	IdleGoroutines    int // go_goroutines of the daemon before the load started
	GoroutineHeadroom int
}

// DefaultTolerance is the verdict's tolerance for a soak whose warm-up lasts settle or longer;
// docs/performance.md ("Soak") says why each value.
var DefaultTolerance = Tolerance{
	RSSFrac: 0.10, RSSBytes: 8 << 20,
	GoroutineFrac: 0.10, GoroutineCount: 10, GoroutineHeadroom: 100,
}

// settle is how long a fresh daemon's RSS climbs under the soak's load before it levels: the
// 30-minute run of docs/performance.md went from 42 MiB at 5 s to 66 MiB at 60 s and about
// 75 MiB at five minutes, and then stayed between 60 and 94 MiB with its medians level. A
// soak whose warm-up ends sooner judges part of that climb: 3-minute and 30-second runs
// measured the last third's median 8 to 11 MiB above the first's without a leak, so they are
// allowed youngRSSBytes.
const (
	settle        = 5 * time.Minute
	youngRSSBytes = 24 << 20
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
}

// Verdict, a plain value, is the judgment of a soak's samples.
type Verdict struct {
	RSS, Goroutines Growth
	MaxGoroutines   int // the absolute bound
	Failures        []string
}

// Pass reports whether nothing grew past its tolerance.
func (v Verdict) Pass() bool { return len(v.Failures) == 0 }

// errFewSamples: thirds of fewer than two samples have no meaningful median.
var errFewSamples = errors.New("soak: fewer than 6 samples after warm-up: run longer or sample more often")

// judge decides from the samples taken after warm-up whether the daemon's RSS or goroutines
// grew. Each quantity's median over the last third of the samples is compared with its median
// over the first third: a median over several seconds of samples is blind to the garbage
// collector's sawtooth and to one snapshot's transient buffers, and the gap between the thirds'
// centres (two thirds of the judged time) leaves a steady leak room to show. The goroutines
// also have an absolute bound, which catches a leak that grew during warm-up and then stopped.
func judge(after []Sample, tol Tolerance) (Verdict, error) {
	var v Verdict
	n := len(after)
	if n < 6 {
		return v, errFewSamples
	}
	third := n / 3
	first, last := after[:third], after[n-third:]
	rss := func(s []Sample) []float64 {
		out := make([]float64, len(s))
		for i, x := range s {
			out[i] = float64(x.RSS)
		}
		return out
	}
	gor := func(s []Sample) []float64 {
		out := make([]float64, len(s))
		for i, x := range s {
			out[i] = float64(x.Goroutines)
		}
		return out
	}
	v.RSS = Growth{First: stats(rss(first)), Last: stats(rss(last))}
	v.RSS.Limit = v.RSS.First.Median + max(tol.RSSFrac*v.RSS.First.Median, float64(tol.RSSBytes))
	if v.RSS.Last.Median > v.RSS.Limit {
		v.Failures = append(v.Failures, fmt.Sprintf("RSS grew: median %.1f MiB in the last third, %.1f MiB in the first (limit %.1f MiB)",
			v.RSS.Last.Median/(1<<20), v.RSS.First.Median/(1<<20), v.RSS.Limit/(1<<20)))
	}
	v.Goroutines = Growth{First: stats(gor(first)), Last: stats(gor(last))}
	v.Goroutines.Limit = v.Goroutines.First.Median + max(tol.GoroutineFrac*v.Goroutines.First.Median, float64(tol.GoroutineCount))
	if v.Goroutines.Last.Median > v.Goroutines.Limit {
		v.Failures = append(v.Failures, fmt.Sprintf("goroutines grew: median %.0f in the last third, %.0f in the first (limit %.0f)",
			v.Goroutines.Last.Median, v.Goroutines.First.Median, v.Goroutines.Limit))
	}
	v.MaxGoroutines = tol.IdleGoroutines + tol.GoroutineHeadroom
	for _, s := range after {
		if s.Goroutines > v.MaxGoroutines {
			v.Failures = append(v.Failures, fmt.Sprintf("%d goroutines at %.0fs: more than %d (%d idle + %d)",
				s.Goroutines, s.At, v.MaxGoroutines, tol.IdleGoroutines, tol.GoroutineHeadroom))
			break
		}
	}
	return v, nil
}
