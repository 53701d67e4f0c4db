package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/kvrouterd/kvrouterd/bench/loadgen"
)

// printResult prints r as one line, then its first errors if any, then with asJSON its JSON.
// candidates= is the answer's size: kvrouterd's cap, or the no-op's fixed answer.
func printResult(w io.Writer, r *loadgen.Result, asJSON bool) {
	rate := "sat"
	if r.Rate > 0 {
		rate = strconv.FormatFloat(r.Rate, 'f', 0, 64)
	}
	cands := candidates(r.MaxCandidates)
	if r.Target == "noop" {
		cands = strconv.Itoa(min(2, r.Workers))
		if r.NoopCandidates > 0 {
			cands = strconv.Itoa(r.NoopCandidates)
		}
	}
	fmt.Fprintf(w, "target=%-9s workers=%-4d candidates=%-4s blocks=%d conns=%d rate=%-6s req/s=%-8.0f p50=%.1fµs p90=%.1fµs p99=%.1fµs p99.9=%.1fµs max=%.1fµs errors=%d cpu/req=%.1fµs others=%.0f%%\n",
		r.Target, r.Workers, cands, r.Blocks, r.Conns, rate, r.RPS, r.P50, r.P90, r.P99, r.P999, r.Max, r.Errors, r.CPUPerReq, r.Others)
	if r.EventRate > 0 || r.Residencies > 0 {
		fmt.Fprintf(w, "  events=%.0f blocks/s (asked %.0f) residencies=%d skipped batches=%d\n", r.EventsApplied, r.EventRate, r.Residencies, r.EventsSkipped)
	}
	if r.FirstErr != "" {
		fmt.Fprintf(w, "  first error: %s\n", r.FirstErr)
	}
	if r.WarmupErrors > 0 {
		fmt.Fprintf(w, "  %d errors during the warmup (not counted); first: %s\n", r.WarmupErrors, r.WarmupErr)
	}
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintf(w, "%s\n", b)
	}
}

// writeTable prints the rows as a markdown table; latencies in µs. "same size" is the no-op
// answering as many candidates as kvrouterd. The last column is the most CPU other processes took
// during any of the row's runs: a row where it is high measured them too.
func writeTable(w io.Writer, rows []loadgen.SuiteRow) {
	fmt.Fprintln(w, "| workers | candidates | noop req/s | route req/s | route/noop | noop req/s (same size) | route/noop (same size) | route p50/p99 µs (sat) | half rate req/s | route p50/p99 µs (half) | noop p50/p99 µs (half) | route p50/p99 µs (quarter) | noop p50/p99 µs (quarter) | errors | others' CPU % |")
	fmt.Fprintln(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %d | %s | %.0f | %.0f | %.2f | %.0f | %.2f | %.0f / %.0f | %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %d | %.0f |\n",
			r.Workers, candidates(r.MaxCandidates), r.NoopSat.RPS, r.RouteSat.RPS, r.Ratio(), r.NoopSame.RPS, r.SameRatio(),
			r.RouteSat.P50, r.RouteSat.P99, r.HalfRate, r.RouteHalf.P50, r.RouteHalf.P99, r.NoopHalf.P50, r.NoopHalf.P99,
			r.RouteQuarter.P50, r.RouteQuarter.P99, r.NoopQuarter.P50, r.NoopQuarter.P99, r.Errors(), r.Others())
	}
}

// candidates names a --max-candidates value.
func candidates(n int) string {
	if n == 0 {
		return "all"
	}
	return strconv.Itoa(n)
}

// writeAdded prints RunAdded's rows as a markdown table: each cell a median over the row's runs
// with its range; latencies in µs, the event stream in M blocks/s. "added" is the median of the
// paired runs' differences (kvrouterd − noop), not the difference of the medians.
func writeAdded(w io.Writer, rows []loadgen.AddedRow, c *loadgen.Config) {
	fmt.Fprintf(w, "Latency kvrouterd adds over the no-op handler; open loop, %d connections, %d-block prompts of %d tokens; medians of the runs (range).\n\n",
		c.Conns, c.Blocks, c.BlockSize)
	fmt.Fprintln(w, "| workers | candidates | load (of no-op sat.) | rate req/s | residencies | events M blocks/s (asked) | route p50 µs | no-op p50 µs | added p50 µs | route p99 µs | no-op p99 µs | added p99 µs | runs | errors | others' CPU % |")
	fmt.Fprintln(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for i := range rows {
		r := &rows[i]
		r50, n50, a50 := r.P50()
		r99, n99, a99 := r.P99()
		fmt.Fprintf(w, "| %d | %d | %d %% of %.0f | %.0f | %s | %s (%.2f) | %s | %s | %s | %s | %s | %s | %d | %d | %.0f |\n",
			r.Workers, r.Candidates, r.Percent, r.NoopSat, r.Rate, spread(r.Residencies(), 1, 0), spread(r.Applied(), 1e-6, 2), c.EventRate/1e6,
			spread(r50, 1, 1), spread(n50, 1, 1), spread(a50, 1, 1), spread(r99, 1, 0), spread(n99, 1, 0), spread(a99, 1, 0),
			r50.N, r.Errors(), r.Others())
	}
}

// spread formats s scaled by k with prec decimals: "median (min–max)", or the median alone when
// the range is one value.
func spread(s loadgen.Spread, k float64, prec int) string {
	f := func(x float64) string { return strconv.FormatFloat(x*k, 'f', prec, 64) }
	if f(s.Min) == f(s.Max) {
		return f(s.Median)
	}
	return f(s.Median) + " (" + f(s.Min) + "–" + f(s.Max) + ")"
}
