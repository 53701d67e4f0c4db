// Command soak runs kvrouterd — the real binary, as a process of its own — under a steady mixed
// load for a set time, and fails if the daemon's resident memory, heap in use, goroutines or
// file descriptors grow after a warm-up: `make soak` (SOAK=30m for a long run), and a
// 30-second version in `go test`.
//
// The load is paced, loopback only, and bounded: two models of eight workers each (every
// fourth with two data-parallel ranks), a fixed set of prompts per model (documents shared by
// several questions), and per worker rank a cache of a fixed number of blocks, evicted oldest
// first. Against it the soak sends routes (binary and JSON, with sessions for session
// affinity), matches, the lifecycle of each routed request (prefill done, completion; some
// completed without a prefill-done, some twice, some never, to expire), KV events (stored,
// removed, cleared) through the NATS stream and through /v1/events in binary and JSON, load
// reports, and malformed requests that must be refused; a worker leaves (DELETE
// /v1/workers/{id}) or comes back every two seconds, about a quarter of them away at a time
// (with --fresh-ids under a new id, as an engine whose instance id is drawn at start). A
// routed prompt is stored by the worker rank the router chose, so that later routes find it.
// Through the front door (--frontend-addr; --frontdoor sets its rate, 0 turns it off) go
// chat and text completions, streamed and whole, and clients that give up before the answer
// or after its first event, to a fake vLLM in the soak's process (front.go) that three workers
// in four name as their http_endpoint, churning with the others; one of its answers in 100
// breaks off mid-stream and one in 100 is a 500, and in turn each of those workers fails
// everything for 15 s of every 40, /health included, so that the front door migrates,
// ejects and probes all along. Its answers are counted by outcome; one that is neither 2xx
// nor an error the engine or the client caused fails the soak.
//
// Every Interval the soak reads the daemon's VmRSS from /proc/PID/status, its open file
// descriptors from /proc/PID/fd, and go_goroutines and go_memstats_heap_inuse_bytes from
// /metrics, and prints them with the heap goal (twice the live heap), the bookings held and
// the index's residencies. After the run it compares, for each of the four, the median of the
// last third of the samples taken after warm-up with the median of the first third
// (verdict.go), checks the goroutines and descriptors against absolute bounds, prints each
// one's Theil–Sen slope, and exits 1 if any grew past its tolerance or more than 1% of the
// calls failed. A warm-up shorter than five minutes ends before a fresh daemon's RSS settles,
// and such a soak allows more growth (a gross-leak check); SOAK=15m and longer judge at the
// fine tolerance. docs/performance.md ("Soak") gives the reasons for the tolerances and the
// runs. --profiles DIR saves the daemon's heap profiles at the warm-up's end and the load's
// end, for `go tool pprof -base DIR/heap-warm.pb.gz BIN DIR/heap-end.pb.gz`.
//
//	go run ./bench/soak                    # three minutes, one of warm-up
//	go run ./bench/soak --duration 30m     # make soak SOAK=30m
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var cfg Config
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.StringVar(&cfg.Bin, "bin", "", "kvrouterd binary to run (default: build ./cmd/kvrouterd)")
	fs.DurationVar(&cfg.Duration, "duration", 3*time.Minute, "load time, warm-up included")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "time not judged (default: a third of --duration, at most 5m)")
	fs.DurationVar(&cfg.Interval, "interval", 0, "time between samples (default: --duration / 360, from 1s to 5s)")
	fs.Float64Var(&cfg.Routes, "routes", 150, "routes and matches per second")
	fs.Float64Var(&cfg.Batches, "batches", 30, "event batches per second")
	front := fs.Float64("frontdoor", 20, "front-door requests per second (--frontend-addr, to a fake engine in the soak); 0: none")
	fs.IntVar(&cfg.Workers, "workers", 8, "workers per model")
	fs.IntVar(&cfg.Models, "models", 2, "models")
	fs.DurationVar(&cfg.Churn, "churn", 2*time.Second, "a worker leaves or comes back this often")
	fs.BoolVar(&cfg.FreshIDs, "fresh-ids", false, "a worker comes back under a new id, as an engine whose instance id is drawn at start")
	fs.IntVar(&cfg.Capacity, "capacity", 0, "blocks each worker rank holds before its engine evicts (default 256)")
	fs.Int64Var(&cfg.MaxIndexBytes, "max-index-bytes", 0, "the daemon's --max-index-bytes (0: none); below capacity × workers × models × 64 B the soak runs at the bound")
	fs.Int64Var(&cfg.StreamBytes, "stream-bytes", 0, "the daemon's --nats-max-bytes (0: 120000, about the largest with the file store's smallest blocks; -1: the daemon's default)")
	fs.StringVar(&cfg.Profiles, "profiles", "", "directory for the daemon's heap profiles at the warm-up's end and the load's end (served by its --admin-addr)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		os.Exit(2)
	}
	cfg.Front = *front
	if *front <= 0 {
		cfg.Front = -1
	}
	cfg.Log = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if !report(os.Stdout, res) {
		os.Exit(1)
	}
}

// maxFailed is the share of the calls that may fail: a soak whose load the daemon refuses does
// not measure its steady state.
const maxFailed = 0.01

// report prints the verdict and the counts, and reports whether the soak passed.
func report(w io.Writer, res Result) bool {
	v := res.Verdict
	mib := func(s Stats) string {
		return fmt.Sprintf("%.1f / %.1f / %.1f MiB", s.Min/(1<<20), s.Median/(1<<20), s.Max/(1<<20))
	}
	num := func(s Stats) string { return fmt.Sprintf("%.0f / %.0f / %.0f", s.Min, s.Median, s.Max) }
	after := len(res.Samples) - res.Warm
	fmt.Fprintf(w, "\nidle (workers registered, no load): RSS %.1f MiB, heap in use %.1f MiB, %d goroutines, %d fds\n",
		float64(res.Idle.RSS)/(1<<20), float64(res.Idle.HeapInuse)/(1<<20), res.Idle.Goroutines, res.Idle.FDs)
	fmt.Fprintf(w, "judged: %d samples after %v of warm-up; thirds of %d samples (min / median / max); slope over all %d (Theil-Sen)\n",
		after, res.Config.Warmup, after/3, after)
	if res.Config.Warmup < settle {
		fmt.Fprintf(w, "warm-up shorter than %v, before a daemon's RSS settles: RSS may grow by %d MiB, heap in use by %d MiB (at least %v of warm-up: %d and %d MiB)\n",
			settle, res.Config.Tolerance.RSSBytes>>20, res.Config.Tolerance.HeapBytes>>20, settle, DefaultTolerance.RSSBytes>>20, DefaultTolerance.HeapBytes>>20)
	}
	fmt.Fprintf(w, "RSS         first third %s, last third %s, limit on the last median %.1f MiB; slope %+.2f MiB/min\n",
		mib(v.RSS.First), mib(v.RSS.Last), v.RSS.Limit/(1<<20), v.RSS.Slope/(1<<20))
	fmt.Fprintf(w, "heap in use first third %s, last third %s, limit on the last median %.1f MiB; slope %+.2f MiB/min\n",
		mib(v.Heap.First), mib(v.Heap.Last), v.Heap.Limit/(1<<20), v.Heap.Slope/(1<<20))
	fmt.Fprintf(w, "goroutines  first third %s, last third %s, limit on the last median %.0f, never above %d; slope %+.2f/min\n",
		num(v.Goroutines.First), num(v.Goroutines.Last), v.Goroutines.Limit, v.MaxGoroutines, v.Goroutines.Slope)
	fmt.Fprintf(w, "fds         first third %s, last third %s, limit on the last median %.0f, never above %d; slope %+.2f/min\n",
		num(v.FDs.First), num(v.FDs.Last), v.FDs.Limit, v.MaxFDs, v.FDs.Slope)
	fmt.Fprintf(w, "calls: %s\n", res.Counts)
	if res.Front != "" {
		fmt.Fprintf(w, "front door: %s\n", res.Front)
		fmt.Fprintf(w, "front door, the daemon's counters:\n%s", res.FrontMetrics)
	}
	pass := v.Pass()
	for _, f := range v.Failures {
		fmt.Fprintf(w, "FAIL: %s\n", f)
	}
	if res.Calls == 0 || float64(res.Failed) > maxFailed*float64(res.Calls) {
		fmt.Fprintf(w, "FAIL: %d of %d calls failed\n", res.Failed, res.Calls)
		pass = false
	}
	if res.FrontUnexpected > 0 {
		fmt.Fprintf(w, "FAIL: %d front-door answers neither 2xx nor an error the engine or the client caused\n", res.FrontUnexpected)
		pass = false
	}
	if pass {
		fmt.Fprintln(w, "PASS: neither RSS, heap in use, goroutines nor file descriptors grew after warm-up")
	}
	return pass
}
