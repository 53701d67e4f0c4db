package main

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// suiteRow is the runs of the matrix for one worker count and candidate cap. The no-op target's
// saturation run does not depend on the cap and is shared by the rows of one worker count.
type suiteRow struct {
	Workers, MaxCands   int
	NoopSat, RouteSat   result
	RouteHalf, NoopHalf result
	HalfRate            float64
}

// runSuite runs, for each worker count of c.SuiteWorkers: noop at saturation, then per cap of
// c.SuiteCandidates kvrouterd at saturation, and kvrouterd and noop in an open loop at half
// kvrouterd's saturated rate. Each result is printed as it comes. A run that fails its error
// budget does not stop the suite; the error is returned at the end. Rows are returned for every
// (workers, cap) whose runs completed.
func runSuite(ctx context.Context, c config, out, log io.Writer) ([]suiteRow, error) {
	var rows []suiteRow
	var errs []error
	one := func(target string, workers, cands int, rate float64) (result, bool) {
		rc := c
		rc.Target, rc.Workers, rc.MaxCandidates, rc.Rate = target, workers, cands, rate
		if target == "noop" {
			rc.Addr = ""
		}
		res, err := runOne(ctx, rc, log)
		if err != nil {
			errs = append(errs, err)
			return res, false
		}
		printResult(out, &res, c.JSON)
		if err := res.failed(); err != nil {
			errs = append(errs, err)
		}
		return res, ctx.Err() == nil
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
			row := suiteRow{Workers: n, MaxCands: k, NoopSat: noop}
			if row.RouteSat, ok = one("kvrouterd", n, k, 0); !ok {
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
			rows = append(rows, row)
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return rows, errors.Join(errs...)
}

// writeTable prints the rows as a markdown table; latencies in µs. The last column is the most CPU
// other processes took during any of the row's runs: a row where it is high measured them too.
func writeTable(w io.Writer, rows []suiteRow) {
	fmt.Fprintln(w, "| workers | candidates | noop req/s | route req/s | route/noop | route p50/p99 µs (sat) | half rate req/s | route p50/p99 µs (half) | noop p50/p99 µs (half) | errors | others' CPU % |")
	fmt.Fprintln(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rows {
		ratio := 0.0
		if r.NoopSat.RPS > 0 {
			ratio = r.RouteSat.RPS / r.NoopSat.RPS
		}
		errs := r.NoopSat.Errors + r.RouteSat.Errors + r.RouteHalf.Errors + r.NoopHalf.Errors
		others := max(r.NoopSat.Others, r.RouteSat.Others, r.RouteHalf.Others, r.NoopHalf.Others)
		fmt.Fprintf(w, "| %d | %s | %.0f | %.0f | %.2f | %.0f / %.0f | %.0f | %.0f / %.0f | %.0f / %.0f | %d | %.0f |\n",
			r.Workers, candidates(r.MaxCands), r.NoopSat.RPS, r.RouteSat.RPS, ratio, r.RouteSat.P50, r.RouteSat.P99,
			r.HalfRate, r.RouteHalf.P50, r.RouteHalf.P99, r.NoopHalf.P50, r.NoopHalf.P99, errs, others)
	}
}
