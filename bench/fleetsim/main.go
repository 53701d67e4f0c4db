// Command fleetsim replays a request trace on simulated inference workers routed by
// kvrouterd's router in process (package bench/fleet), once per routing mode, and prints per
// mode: TTFT and end-to-end latency, prefix hit rate against the infinite-cache bound, output
// throughput and load imbalance.
//
//	go run ./bench/fleetsim --trace ../shared/traces/mooncake/conversation_trace.jsonl --workers 8
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/scoring"
)

func main() {
	var (
		path      = flag.String("trace", "", "Mooncake JSON-lines trace; empty: the built-in synthetic workload")
		workers   = flag.Int("workers", 8, "simulated workers")
		modes     = flag.String("modes", "kv,round_robin,random,least_loaded", "routing modes to compare, comma-separated")
		timeScale = flag.Float64("time-scale", 1, "multiply arrival times (below 1: more load)")
		limit     = flag.Int("limit", 0, "first N trace rows (0: all)")
		blockSize = flag.Int("block-size", 64, "engine block size in tokens")
		blocks    = flag.Int("kv-blocks", 16384, "KV cache per worker, in blocks")
		seed      = flag.Uint64("seed", 1, "seed of the router's tie-breaks")
	)
	flag.Parse()
	t0 := time.Now()
	var reqs []trace.Request
	var err error
	if *path != "" {
		reqs, err = trace.LoadMooncake(*path, trace.MooncakeOptions{TimeScale: *timeScale, Limit: *limit})
	} else {
		reqs = trace.Scale(trace.Synthetic(trace.DefaultSynthetic()), *timeScale)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(1)
	}
	bound := trace.CountHits(reqs, *blockSize)
	fmt.Printf("# %d requests, loaded in %v; infinite-cache bound at block size %d: %.1f %% of full blocks\n",
		len(reqs), time.Since(t0).Round(time.Millisecond), *blockSize, 100*bound.FullBound())
	fmt.Println("| mode | TTFT mean / p50 / p99 ms | e2e mean / p99 s | hit rate | of bound | output tok/s | imbalance | refused | sim time |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	wc := sim.DefaultWorkerConfig()
	wc.BlockSize, wc.Blocks = *blockSize, *blocks
	for _, name := range strings.Split(*modes, ",") {
		mode, err := scoring.ParseMode(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
			os.Exit(2)
		}
		t1 := time.Now()
		res, err := fleet.Run(fleet.Config{Workers: *workers, Mode: mode, Worker: wc, Seed: *seed}, reqs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
			os.Exit(1)
		}
		tm, t50, t99 := stats(res.TTFT)
		em, _, e99 := stats(res.E2E)
		fmt.Printf("| %s | %.0f / %.0f / %.0f | %.1f / %.1f | %.1f %% | %.0f %% | %.0f | %.2f | %d | %v |\n",
			name, ms(tm), ms(t50), ms(t99), em.Seconds(), e99.Seconds(), 100*res.HitRate(),
			100*res.HitRate()/bound.TokenBound(), float64(res.OutputTokens)/res.Makespan.Seconds(),
			res.Imbalance(), res.Refused, time.Since(t1).Round(time.Millisecond))
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// stats returns the mean, median and 99th percentile of the positive durations.
func stats(ds []time.Duration) (mean, p50, p99 time.Duration) {
	var v []time.Duration
	for _, d := range ds {
		if d > 0 {
			v = append(v, d)
		}
	}
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	var sum time.Duration
	for _, d := range v {
		sum += d
	}
	return sum / time.Duration(len(v)), v[len(v)/2], v[min(len(v)-1, len(v)*99/100)]
}
