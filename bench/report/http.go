package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/loadgen"
)

// http runs package loadgen's suite: kvrouterd's route endpoint against a no-op fasthttp
// handler with the same client, at 8 and 1,000 workers, every candidate and 8 per answer.
func (r *report) http() error {
	c := loadgen.Defaults()
	c.Seed = r.cfg.Seed
	c.Duration, c.Warmup = loadgen.SuiteDuration, loadgen.SuiteWarmup
	if r.cfg.Quick {
		c.Duration, c.Warmup = time.Second, 300*time.Millisecond
	}
	rows, err := loadgen.RunSuite(context.Background(), c, func(res loadgen.Result) {
		r.logf("http: %s, %d workers, cap %d, rate %.0f: %.0f req/s, p50 %.0f µs, p99 %.0f µs, others' CPU %.0f %%",
			res.Target, res.Workers, res.MaxCandidates, res.Rate, res.RPS, res.P50, res.P99, res.Others)
	}, nil)
	r.mdf("\n## HTTP route against a no-op handler\n\n")
	r.mdf("Package `bench/loadgen` (also `go run ./bench/kvrload --suite`): %d-block queries, block size %d, %d connections "+
		"of one fasthttp client in this process, kvrouterd (router and server in process, on a loopback port) and a no-op "+
		"fasthttp handler answering a fixed two-candidate route response, in turn, and the no-op handler again answering as "+
		"many candidates as kvrouterd (*same size*: the router's cost without that of moving the answer); runs of %v after %v of warm-up. Each "+
		"iteration routes, then completes the request. Saturation is a closed loop; half saturation an open loop at half "+
		"kvrouterd's saturated rate, latency timed from each request's scheduled start (from when its connection woke, if it was idle: a timerfd per connection). Client and server share the machine: "+
		"on 2 cores the client takes about half of it.\n\n", c.Blocks, c.BlockSize, c.Conns, c.Duration, c.Warmup)
	r.mdf("| workers | candidates per answer | no-op req/s | route req/s | ratio | no-op req/s, same size | ratio, same size | route p50 / p99 at half saturation µs | no-op p50 / p99 at the same rate µs | route / no-op p99 at a quarter µs | others' CPU |\n")
	r.mdf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range rows {
		cands := "all"
		if row.MaxCandidates > 0 {
			cands = fmt.Sprint(row.MaxCandidates)
		}
		r.mdf("| %d | %s | %.0f | %.0f | %.2f | %.0f | %.2f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f %% |\n", row.Workers, cands, row.NoopSat.RPS,
			row.RouteSat.RPS, row.Ratio(), row.NoopSame.RPS, row.SameRatio(), row.RouteHalf.P50, row.RouteHalf.P99, row.NoopHalf.P50, row.NoopHalf.P99,
			row.RouteQuarter.P99, row.NoopQuarter.P99, row.Others())
		cond := fmt.Sprintf("%d workers, %s candidates per answer; %d-block queries, block size %d; %d connections; %v runs; client and server on one machine (%s)",
			row.Workers, cands, c.Blocks, c.BlockSize, c.Conns, c.Duration, machine())
		r.headline(mdPrinter.Sprintf("HTTP route / no-op throughput, %d workers, %s candidates; route p99 at half saturation", row.Workers, cands),
			mdPrinter.Sprintf("%.2f (same-size answer %.2f); %.0f µs", row.Ratio(), row.SameRatio(), row.RouteHalf.P99), "≥ 0.7; ≤ 200 µs", r.command("http"))
		key := fmt.Sprintf("http.w%d.c%d.", row.Workers, row.MaxCandidates)
		r.add(key+"noop_rps", row.NoopSat.RPS, "requests/s", cond)
		r.add(key+"route_rps", row.RouteSat.RPS, "requests/s", cond)
		r.add(key+"ratio", row.Ratio(), "route/no-op", cond)
		r.add(key+"noop_same_rps", row.NoopSame.RPS, "requests/s", cond)
		r.add(key+"ratio_same", row.SameRatio(), "route/no-op answering as many candidates", cond)
		r.add(key+"route_half_p50", row.RouteHalf.P50, "µs", cond)
		r.add(key+"route_half_p99", row.RouteHalf.P99, "µs", cond)
		r.add(key+"noop_half_p99", row.NoopHalf.P99, "µs", cond)
		r.add(key+"route_quarter_p99", row.RouteQuarter.P99, "µs", cond)
		r.add(key+"noop_quarter_p99", row.NoopQuarter.P99, "µs", cond)
		r.add(key+"others_cpu", row.Others(), "%", cond)
	}
	r.mdf("\nTargets: ratio ≥ 0.7, route p99 ≤ 200 µs at half saturation. A row with a high *others' CPU* measured the neighbours too.\n")
	return err
}
