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
