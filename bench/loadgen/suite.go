package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// SuiteRow is the runs of the suite's matrix for one worker count and candidate cap; a plain
// value. The no-op target's saturation run does not depend on the cap and is shared by the rows
// of one worker count.
type SuiteRow struct {
	Workers, MaxCandidates int
	NoopSat, RouteSat      Result // closed loop, at saturation
	// NoopSame is the no-op target at saturation answering as many candidates as kvrouterd's
	// answers carry (Answer), so that both move answers of the same size.
	NoopSame            Result
	RouteHalf, NoopHalf Result  // open loop at HalfRate
	HalfRate            float64 // half RouteSat's achieved rate, in requests per second
	// RouteQuarter and NoopQuarter are the open loop at half HalfRate: where, on a machine that
	// client and server share, the two no longer compete for its cores.
	RouteQuarter, NoopQuarter Result
}

// Answer is the candidates in each of the row's kvrouterd answers.
func (r SuiteRow) Answer() int {
	if r.MaxCandidates > 0 {
		return min(r.MaxCandidates, r.Workers)
	}
	return r.Workers
}

// Ratio is kvrouterd's saturated throughput as a share of the no-op target's: the router's
// throughput cost. 0 when the no-op target served nothing.
func (r SuiteRow) Ratio() float64 {
	if r.NoopSat.RPS > 0 {
		return r.RouteSat.RPS / r.NoopSat.RPS
	}
	return 0
}

// SameRatio is kvrouterd's saturated throughput as a share of the no-op target's answering as
// many candidates: the router's cost without the cost of moving the answer the client asked for.
func (r SuiteRow) SameRatio() float64 {
	if r.NoopSame.RPS > 0 {
		return r.RouteSat.RPS / r.NoopSame.RPS
	}
	return 0
}

// Errors is the measured failures of the row's five runs.
func (r SuiteRow) Errors() int64 {
	return r.NoopSat.Errors + r.RouteSat.Errors + r.NoopSame.Errors + r.RouteHalf.Errors + r.NoopHalf.Errors +
		r.RouteQuarter.Errors + r.NoopQuarter.Errors
}

// Others is the most CPU, in percent of the machine, other processes took during any of the
// row's runs (-1 when unknown): a row where it is high measured them too.
func (r SuiteRow) Others() float64 {
	return max(r.NoopSat.Others, r.RouteSat.Others, r.NoopSame.Others, r.RouteHalf.Others, r.NoopHalf.Others,
		r.RouteQuarter.Others, r.NoopQuarter.Others)
}

// RunSuite runs, for each worker count of c.SuiteWorkers: noop at saturation, then per cap of
// c.SuiteCandidates kvrouterd at saturation, noop at saturation answering as many candidates,
// and kvrouterd and noop in an open loop at half kvrouterd's saturated rate, then at a quarter.
// A cap not below the worker count is skipped, as it is every worker. Every run takes c.Warmup and c.Duration (the reported suite's are SuiteWarmup and
// SuiteDuration); c.Target, c.Workers, c.Rate and c.MaxCandidates are set per run, and c.Addr
// is used for the kvrouterd runs only.
//
// Each run's Result is passed to progress (if not nil) as it comes, on the calling goroutine,
// and log gets Run's progress lines. A run that fails its error budget does not stop the suite;
// its error is returned at the end, joined with the others. A run that could not be done, or ctx
// being done, stops the suite. Rows are returned for every (workers, cap) whose runs completed.
func RunSuite(ctx context.Context, c Config, progress func(Result), log io.Writer) ([]SuiteRow, error) {
	if err := c.checkSuite(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if log == nil {
		log = io.Discard
	}
	var rows []SuiteRow
	var errs []error
	one := func(target string, workers, cands int, rate float64) (Result, bool) {
		res, err := run(ctx, c.suiteRun(target, workers, cands, rate), log)
		return res, settle(ctx, res, err, &errs, progress)
	}
suite:
	for _, n := range c.SuiteWorkers {
		noop, ok := one("noop", n, 0, 0)
		if !ok {
			break
		}
		for _, k := range c.SuiteCandidates {
			if k != 0 && k >= n {
				continue // the same as every worker
			}
			row := SuiteRow{Workers: n, MaxCandidates: k, NoopSat: noop}
			if row.RouteSat, ok = one("kvrouterd", n, k, 0); !ok {
				break suite
			}
			if row.NoopSame, ok = one("noop", n, row.Answer(), 0); !ok {
				break suite
			}
			row.HalfRate = row.RouteSat.RPS / 2
			if row.HalfRate <= 0 {
				errs = append(errs, fmt.Errorf("kvrouterd, %d workers: no request succeeded at saturation", n))
				break suite
			}
			if row.RouteHalf, ok = one("kvrouterd", n, k, row.HalfRate); !ok {
				break suite
			}
			if row.NoopHalf, ok = one("noop", n, 0, row.HalfRate); !ok {
				break suite
			}
			if row.RouteQuarter, ok = one("kvrouterd", n, k, row.HalfRate/2); !ok {
				break suite
			}
			if row.NoopQuarter, ok = one("noop", n, 0, row.HalfRate/2); !ok {
				break suite
			}
			rows = append(rows, row)
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return rows, errors.Join(errs...)
}

// settle takes one run of a suite: its failure err, or else its result's errors, into errs, and
// the result to progress. It reports whether the suite goes on.
func settle(ctx context.Context, res Result, err error, errs *[]error, progress func(Result)) bool {
	if err != nil {
		*errs = append(*errs, err)
		return false
	}
	if progress != nil {
		progress(res)
	}
	if err := res.Err(); err != nil {
		*errs = append(*errs, err)
	}
	return ctx.Err() == nil
}
