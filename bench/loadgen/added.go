package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// addedSatRuns is how many closed-loop runs of the no-op target RunAdded takes the median of as
// its saturated rate.
const addedSatRuns = 3

// AddedRow is one case of RunAdded's matrix: a worker count and an offered rate, the runs of
// kvrouterd and of the no-op target at that rate; a plain value.
type AddedRow struct {
	Workers int
	// Candidates is the candidates of every answer, kvrouterd's (its max_candidates, capped by
	// the workers) and the no-op's alike.
	Candidates int
	Percent    int     // the offered rate, in percent of NoopSat
	NoopSat    float64 // the no-op target's saturated rate, the median of its closed-loop runs
	Rate       float64 // offered route requests per second
	// Route and Noop are the runs, paired: run i of each went right after the other, so that a
	// slow spell of the machine tends to fall on both.
	Route, Noop []Result
}

// Spread is a median over runs with its range; a plain value.
type Spread struct {
	Median, Min, Max float64
	N                int
}

// spreadOf is the spread of xs (the zero Spread for none).
func spreadOf(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := slices.Sorted(slices.Values(xs))
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Spread{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// of is the spread of f over runs.
func of(runs []Result, f func(*Result) float64) Spread {
	xs := make([]float64, len(runs))
	for i := range runs {
		xs[i] = f(&runs[i])
	}
	return spreadOf(xs)
}

// added is the spread over the pairs of runs of f(route) − f(noop): the latency kvrouterd adds.
// It is the median of the differences, not the difference of the medians.
func (r *AddedRow) added(f func(*Result) float64) Spread {
	xs := make([]float64, min(len(r.Route), len(r.Noop)))
	for i := range xs {
		xs[i] = f(&r.Route[i]) - f(&r.Noop[i])
	}
	return spreadOf(xs)
}

func p50(r *Result) float64 { return r.P50 }
func p99(r *Result) float64 { return r.P99 }

// P50 and P99 are the percentile's spreads over the runs: kvrouterd's, the no-op's, and the
// difference of each pair of runs.
func (r *AddedRow) P50() (route, noop, added Spread) {
	return of(r.Route, p50), of(r.Noop, p50), r.added(p50)
}

func (r *AddedRow) P99() (route, noop, added Spread) {
	return of(r.Route, p99), of(r.Noop, p99), r.added(p99)
}

// Applied is the spread of the event stream's applied rate over kvrouterd's runs, in blocks per
// second.
func (r *AddedRow) Applied() Spread {
	return of(r.Route, func(x *Result) float64 { return x.EventsApplied })
}

// Residencies is the spread of the index's size when kvrouterd's windows began.
func (r *AddedRow) Residencies() Spread {
	return of(r.Route, func(x *Result) float64 { return float64(x.Residencies) })
}

// Errors is the measured failures of the row's runs.
func (r *AddedRow) Errors() int64 {
	var n int64
	for _, x := range slices.Concat(r.Route, r.Noop) {
		n += x.Errors
	}
	return n
}

// Others is the most CPU, in percent of the machine, other processes took during any of the
// row's runs (-1 when unknown): a row where it is high measured them too.
func (r *AddedRow) Others() float64 {
	o := -1.0
	for _, x := range slices.Concat(r.Route, r.Noop) {
		o = max(o, x.Others)
	}
	return o
}

// answer is the candidates of every answer of the added-latency runs with n workers.
func (c *Config) answer(n int) int {
	if c.AddedCandidates > 0 {
		return min(c.AddedCandidates, n)
	}
	return n
}

// addedRun is the configuration of one run of RunAdded.
func (c *Config) addedRun(target string, workers int, rate float64) Config {
	rc := *c
	rc.Target, rc.Workers, rc.Rate, rc.LatencyLog = target, workers, rate, nil
	rc.MaxCandidates, rc.NoopCandidates = c.AddedCandidates, 0
	if target == "noop" {
		rc.Addr, rc.MaxCandidates, rc.NoopCandidates, rc.Residencies, rc.EventRate = "", 0, c.answer(workers), 0, 0
	}
	return rc
}

// CheckAdded reports the first setting of c that RunAdded refuses, naming a field as Check does.
func (c *Config) CheckAdded(name func(field string) string) error {
	if name == nil {
		name = func(f string) string { return f }
	}
	switch {
	case len(c.AddedWorkers) == 0:
		return fmt.Errorf("%s: want at least one worker count", name("AddedWorkers"))
	case len(c.AddedPercents) == 0:
		return fmt.Errorf("%s: want at least one rate", name("AddedPercents"))
	case c.AddedRuns < 1:
		return fmt.Errorf("%s %d: want at least one run", name("AddedRuns"), c.AddedRuns)
	case c.AddedCandidates < 0 || c.AddedCandidates > 1<<16-1:
		return fmt.Errorf("%s %d: want 0 (all) to 65535", name("AddedCandidates"), c.AddedCandidates)
	}
	for _, p := range c.AddedPercents {
		if p < 1 || p > 100 {
			return fmt.Errorf("%s %d: want 1 to 100", name("AddedPercents"), p)
		}
	}
	for _, n := range c.AddedWorkers {
		for _, target := range []string{"kvrouterd", "noop"} {
			rc := c.addedRun(target, n, 1)
			if err := rc.Check(name); err != nil {
				return fmt.Errorf("%s with %d workers: %w", target, n, err)
			}
		}
	}
	return nil
}

// RunAdded measures the latency kvrouterd adds to a route over the no-op target: for each worker
// count of c.AddedWorkers, the no-op target's saturated rate (the median of addedSatRuns
// closed-loop runs), then c.AddedRuns pairs of open-loop runs of kvrouterd and of the no-op
// target at each c.AddedPercents of it, every answer of both carrying c.answer candidates. The
// kvrouterd runs are of one in-process Router per worker count, its index padded to
// c.Residencies and fed c.EventRate blocks per second of events while it is loaded; the no-op
// runs are of one no-op server per worker count, nothing streaming. Every run takes c.Warmup and
// c.Duration; c.Target, c.Workers, c.Rate, c.MaxCandidates and c.NoopCandidates are set per run.
// The order of a pair alternates from one run to the next.
//
// Each run's Result is passed to progress (if not nil) as it comes, on the calling goroutine, and
// log gets progress lines. A run that fails its error budget does not stop the matrix; its error
// is returned at the end, joined with the others. A run that could not be done, or ctx being
// done, stops it. Rows are returned for every case with a completed pair of runs.
func RunAdded(ctx context.Context, c Config, progress func(Result), log io.Writer) ([]AddedRow, error) {
	if err := c.CheckAdded(nil); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if log == nil {
		log = io.Discard
	}
	var rows []AddedRow
	var errs []error
	for _, n := range c.AddedWorkers {
		more, err := runAdded(ctx, &c, n, progress, log)
		rows = append(rows, more...)
		if err != nil {
			errs = append(errs, err)
		}
		if ctx.Err() != nil || errors.Is(err, errStop) {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return rows, errors.Join(errs...)
}

// errStop marks an error after which RunAdded does not go on.
var errStop = errors.New("loadgen: stopped")

// runAdded runs RunAdded's cases for n workers.
func runAdded(ctx context.Context, c *Config, n int, progress func(Result), log io.Writer) (rows []AddedRow, err error) {
	rc, nc := c.addedRun("kvrouterd", n, 0), c.addedRun("noop", n, 0)
	w := newWorkload(&rc)
	t0 := time.Now()
	route, err := start(&rc, w)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStop, err)
	}
	fmt.Fprintf(log, "# kvrouterd at %s: %d workers, %d residencies, ready in %v\n", route.addr, n,
		route.router.Stats().Events.Residencies, time.Since(t0).Round(time.Millisecond))
	noop, err := start(&nc, w)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStop, errors.Join(err, route.stop()))
	}
	defer func() {
		if e := errors.Join(route.stop(), noop.stop()); e != nil {
			err = errors.Join(err, fmt.Errorf("%w: stopping the targets: %w", errStop, e))
		}
	}()
	var errs []error
	one := func(t *target, rc Config) (Result, bool) {
		res, err := measure(ctx, t, w, &rc)
		if err != nil {
			err = fmt.Errorf("%w: %w", errStop, err)
		}
		return res, settle(ctx, res, err, &errs, progress)
	}
	var sats []float64
	for range addedSatRuns {
		res, ok := one(noop, nc)
		if !ok {
			return nil, errors.Join(errs...)
		}
		sats = append(sats, res.RPS)
	}
	sat := spreadOf(sats).Median
	if sat <= 0 {
		return nil, errors.Join(append(errs, fmt.Errorf("%w: noop, %d workers: no request succeeded at saturation", errStop, n))...)
	}
	for _, p := range c.AddedPercents {
		rows = append(rows, AddedRow{Workers: n, Candidates: c.answer(n), Percent: p, NoopSat: sat, Rate: sat * float64(p) / 100})
	}
	for i := range c.AddedRuns {
		for j := range rows {
			r := &rows[j]
			rc.Rate, nc.Rate = r.Rate, r.Rate
			var a, b Result
			var ok bool
			if i%2 == 0 {
				if a, ok = one(noop, nc); ok {
					b, ok = one(route, rc)
				}
			} else if b, ok = one(route, rc); ok {
				a, ok = one(noop, nc)
			}
			if !ok {
				if i == 0 {
					rows = rows[:j]
				}
				return rows, errors.Join(errs...)
			}
			r.Noop, r.Route = append(r.Noop, a), append(r.Route, b)
		}
	}
	return rows, errors.Join(errs...)
}
