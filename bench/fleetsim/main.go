// Command fleetsim replays a request trace on simulated inference workers routed by
// kvrouterd's router in process (package bench/fleet), once per routing mode, and prints per
// mode: TTFT and end-to-end latency, prefix hit rate against the infinite-cache bound, output
// throughput and load imbalance.
//
//	go run ./bench/fleetsim --trace ../shared/traces/mooncake/conversation_trace.jsonl --workers 8
//
// With --e2e (a daemon started in process for each mode) or --addr and --nats-url (a running
// kvrouterd), the workers are routed by the daemon over HTTP and their KV events published to
// its NATS stream (package bench/e2e), on a simulated clock held to --pace simulated seconds per
// wall second; the table then also shows the route calls' HTTP latency, the errors, how far
// behind its pace the simulation fell, and how long the daemon took to apply the last events.
//
//	go run ./bench/fleetsim --trace ../shared/traces/mooncake/conversation_trace.jsonl --limit 600 --e2e --pace 10
//
// --modes also takes the simulated policies of the routers users would otherwise run (llmd,
// sglang, gie: package bench/fleet's peers, docs/peers.md), in process:
//
//	go run ./bench/fleetsim --trace ../shared/traces/mooncake/conversation_trace.jsonl --modes kv,llmd,sglang,gie --time-scale 0.2
//
// --router-queue-threshold puts the router queue (unbounded, --router-queue-policy) in front of
// the in-process router; a daemon is routed without it.
//
//	go run ./bench/fleetsim --trace ../shared/traces/mooncake/conversation_trace.jsonl --modes kv --time-scale 0.12 --router-queue-threshold 4 --router-queue-policy wspt
//
// The features of large fleets, in process: --prefill-workers splits the fleet into prefill
// and decode pools (--disagg-policy for conditional disaggregation), --host-blocks gives each
// worker a host-memory tier (--host-cache-hit-weight credits it in the router's cost),
// --event-delay holds KV events back from the router, --router-predicted-ttl-secs turns on
// predict-on-route, and --burst replaces the trace with the generated burst workload.
//
//	go run ./bench/fleetsim --trace ../shared/traces/mooncake/conversation_trace.jsonl --modes kv --time-scale 0.15 --host-blocks 65536 --host-cache-hit-weight 0.75
//	go run ./bench/fleetsim --burst --modes kv --event-delay 50ms --router-predicted-ttl-secs 5
//
// --stream replays without holding the workload: the trace file is read as requests come due
// (its rows must be in time order), or the built-in workload generated so (--requests sets its
// length), and only the requests in flight are kept; the table's figures then come from
// histograms (quantiles within 0.8 %), the infinite-cache bound is not counted, sessions are
// replayed closed-loop, and the process's peak RSS is printed at the end.
//
//	go run ./bench/fleetsim --stream --requests 10000000 --modes kv
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/e2e"
	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
)

func main() {
	var (
		path      = flag.String("trace", "", "JSON-lines trace (Mooncake's form, with hash ids of --block-size tokens or token ids; see bench/trace); empty: the built-in synthetic workload")
		workers   = flag.Int("workers", 8, "simulated workers")
		modes     = flag.String("modes", "kv,round_robin,random,least_loaded", "routing modes to compare, comma-separated: kvrouterd's (kv, round_robin, random, least_loaded), Dynamo's cost formulas and presets in kvrouterd (dynamo_v1, dynamo_main, dynamo_agentic, dynamo_load_aware), or a simulated peer's policy (llmd, sglang, gie; in process only)")
		timeScale = flag.Float64("time-scale", 1, "multiply arrival times (below 1: more load)")
		limit     = flag.Int("limit", 0, "first N trace rows (0: all)")
		traceBS   = flag.Int("block-size", 0, "tokens per hash id of --trace (0: the trace's block_size, else Mooncake's 512)")
		timeUnit  = flag.String("time-unit", "", "unit of --trace's numeric timestamps: ms or s (empty: the trace's time_unit, else ms); ISO-8601 strings need none")
		blockSize = flag.Int("engine-block-size", 64, "the simulated engines' KV block size in tokens")
		blocks    = flag.Int("kv-blocks", 16384, "KV cache per worker, in blocks")
		seed      = flag.Uint64("seed", 1, "seed of the router's tie-breaks")
		weight    = flag.Float64("overlap-weight", 1, "the router's overlap score weight")
		cacheW    = flag.Float64("router-cache-weight", 0, "--router-cost ttft's cache weight (0: the router's default; negative: none)")
		speeds    = flag.String("worker-speeds", "", "a heterogeneous fleet: comma-separated speeds of the first workers relative to the others (0.5,0.5: two at half speed)")
		costName  = flag.String("router-cost", "ttft", "the kv mode's cost formula: ttft (kvrouterd's default), v1 or main (as kvrouterd's --router-cost); the modes dynamo_v1, dynamo_main, dynamo_agentic and dynamo_load_aware set their own")
		temp      = flag.Float64("temperature", 0, "the router's softmax temperature (0: the lowest cost)")
		inProc    = flag.Bool("e2e", false, "route through a kvrouterd started in process (HTTP + embedded NATS) instead of the router alone")
		addr      = flag.String("addr", "", "route through the running kvrouterd at this HTTP host:port (needs --nats-url)")
		natsURL   = flag.String("nats-url", "", "the NATS server the kvrouterd of --addr takes events from; its embedded one takes the publisher user: nats://$(cat data/nats/publisher.auth)@127.0.0.1:4222")
		prefix    = flag.String("nats-subject-prefix", ingest.DefaultPrefix, "subject prefix of the kvrouterd of --addr")
		stream    = flag.String("nats-stream", ingest.DefaultStream, "event stream of the kvrouterd of --addr")
		pace      = flag.Float64("pace", 0, "simulated seconds per wall second; 0: unpaced (in process only: a daemon needs a pace)")
		qThresh   = flag.Float64("router-queue-threshold", -1, "turns the router queue on (in process only): a rank is busy above this × max_num_batched_tokens of prompt tokens booked and not prefilled; negative: off")
		qPolicy   = flag.String("router-queue-policy", "fcfs", "the router queue's order: fcfs, wspt or lcfs")
		ttftSLO   = flag.Duration("ttft-slo", 0, "with --router-queue-threshold: also hold a request while no rank is predicted to give its first token within this (0: off)")
		prefillN  = flag.Int("prefill-workers", 0, "disaggregated: this many of --workers prefill, the others decode (in process only)")
		dPolicy   = flag.String("disagg-policy", "none", "conditional disaggregation: none, isl_bounding (Dynamo's thresholds)")
		hostN     = flag.Int("host-blocks", 0, "host-memory tier per worker, in blocks (0: none)")
		hostW     = flag.Float64("host-cache-hit-weight", -1, "the router's credit for host-tier blocks (negative: its default, 0.75)")
		evDelay   = flag.Duration("event-delay", 0, "delay between a worker's step and the router getting its KV events")
		predTTL   = flag.Float64("router-predicted-ttl-secs", 0, "predict-on-route's TTL in seconds (0: off)")
		replay    = flag.String("replay", "auto", "open (every request at its trace time), closed (a session's next turn after its previous answer ends, plus the trace's gap) or auto (closed when the trace has sessions)")
		burst     = flag.Bool("burst", false, "the generated burst workload (groups of siblings over a shared prefix) instead of --trace")
		streamed  = flag.Bool("stream", false, "read the workload as requests come due and keep only those in flight: any length in bounded memory (in process only)")
		nReqs     = flag.Int("requests", 0, "length of the built-in workload, in requests on average (0: its ten minutes, about 2,400)")
	)
	flag.Parse()
	e2eMode := *inProc || *addr != ""
	var queue *router.QueueConfig
	if *qThresh >= 0 {
		p, err := router.ParseQueuePolicy(*qPolicy)
		if err != nil || e2eMode {
			fmt.Fprintln(os.Stderr, "fleetsim: --router-queue-threshold: the queue runs in process only, with fcfs, wspt or lcfs")
			os.Exit(2)
		}
		// Unbounded: every request is served and measured.
		queue = &router.QueueConfig{Threshold: *qThresh, Policy: p, MaxRequests: 1 << 30, MaxWait: 1000 * time.Hour, TTFTSLO: *ttftSLO}
	}
	if *addr != "" && (*inProc || *natsURL == "") {
		fmt.Fprintln(os.Stderr, "fleetsim: --addr needs --nats-url, and excludes --e2e")
		os.Exit(2)
	}
	if e2eMode && !(*pace > 0) {
		fmt.Fprintln(os.Stderr, "fleetsim: a daemon applies events as they arrive: give --pace (simulated seconds per wall second)")
		os.Exit(2)
	}
	wc := sim.DefaultWorkerConfig()
	wc.BlockSize, wc.Blocks, wc.HostBlocks = *blockSize, *blocks, *hostN
	syn := trace.DefaultSynthetic()
	if *nReqs > 0 {
		syn.Duration = time.Duration(float64(*nReqs) / syn.Rate * float64(time.Second))
	}
	var dc *router.DisaggConfig
	if *dPolicy != "none" {
		p, err := router.ParseDisaggPolicy(*dPolicy)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim: --disagg-policy:", err)
			os.Exit(2)
		}
		dc = &router.DisaggConfig{Policy: p}
	}
	var credit *scoring.TierCredit
	var speedList []float64
	for _, f := range strings.FieldsFunc(*speeds, func(r rune) bool { return r == ',' }) {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			fmt.Fprintf(os.Stderr, "fleetsim: --worker-speeds: %q is not a speed > 0\n", f)
			os.Exit(2)
		}
		speedList = append(speedList, v)
	}
	cost, err := scoring.ParseCost(*costName)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim: --router-cost:", err)
		os.Exit(2)
	}
	if *hostW >= 0 {
		c := scoring.DefaultTierCredit()
		c.Host = *hostW
		credit = &c
	}
	if *streamed {
		if e2eMode || *burst || *limit != 0 || *replay != "auto" {
			fmt.Fprintln(os.Stderr, "fleetsim: --stream runs in process, over --trace or the built-in workload, whole, with sessions closed-loop: drop --e2e, --addr, --burst, --limit and --replay")
			os.Exit(2)
		}
		streamRun(syn, *path, *traceBS, *timeUnit, *timeScale, *modes, func(name string) fleet.Config {
			fc, err := modeConfig(name, fleet.Config{Workers: *workers, Worker: wc, Seed: *seed, OverlapWeight: *weight, Cost: cost, CacheWeight: *cacheW, Speeds: speedList, Temperature: *temp,
				Queue: queue, PrefillWorkers: *prefillN, Disagg: dc, TierCredit: credit, EventDelay: *evDelay,
				PredictedTTL: time.Duration(*predTTL * float64(time.Second)), ClosedLoop: true})
			if err != nil {
				fmt.Fprintln(os.Stderr, "fleetsim:", err)
				os.Exit(2)
			}
			return fc
		})
		return
	}
	t0 := time.Now()
	var reqs []trace.Request
	if *burst {
		reqs = trace.Scale(trace.Burst(trace.DefaultBurst()), *timeScale)
	} else if *path != "" {
		opt := trace.MooncakeOptions{TimeScale: *timeScale, Limit: *limit, BlockSize: *traceBS}
		if opt.TimeUnit, err = trace.ParseTimeUnit(*timeUnit); err == nil {
			reqs, err = trace.LoadMooncake(*path, opt)
		}
	} else {
		reqs = trace.Scale(trace.Synthetic(syn), *timeScale)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(1)
	}
	closed := false
	switch *replay {
	case "open":
	case "closed":
		closed = true
	case "auto":
		closed = slices.ContainsFunc(reqs, func(q trace.Request) bool { return q.Session != 0 })
	default:
		fmt.Fprintf(os.Stderr, "fleetsim: --replay %q: want open, closed or auto\n", *replay)
		os.Exit(2)
	}
	bound := trace.InfiniteBound(reqs, *blockSize)
	loop := "open loop (every request at its trace time)"
	if closed {
		loop = "closed loop (a session's next turn after its previous answer, plus the trace's gap)"
	}
	fmt.Printf("# %d requests, loaded in %v; infinite-cache bound at block size %d: %.1f %% of prompt tokens; replayed %s\n",
		len(reqs), time.Since(t0).Round(time.Millisecond), *blockSize, 100*bound, loop)
	head, rule := "| mode | TTFT mean / p50 / p99 ms | ITL mean ms | e2e mean / p99 s | hit rate device + host | of bound | output tok/s | imbalance | refused | sim time |",
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	if e2eMode {
		where := "a kvrouterd in process per mode (router, HTTP on loopback, embedded NATS)"
		if *addr != "" {
			where = "the kvrouterd at " + *addr + ", NATS " + *natsURL
		}
		fmt.Printf("# end to end through %s, pace %g\n", where, *pace)
		head += " HTTP route p50 / p99 µs | errors route / call / publish | max lag | drain |"
		rule += "---:|---:|---:|---:|"
	}
	fmt.Println(head)
	fmt.Println(rule)
	for _, name := range strings.Split(*modes, ",") {
		t1 := time.Now()
		fc := fleet.Config{Workers: *workers, Worker: wc, Seed: *seed, Pace: *pace, OverlapWeight: *weight, Cost: cost, CacheWeight: *cacheW, Speeds: speedList, Temperature: *temp,
			Queue: queue, PrefillWorkers: *prefillN, Disagg: dc, TierCredit: credit, EventDelay: *evDelay,
			PredictedTTL: time.Duration(*predTTL * float64(time.Second)), ClosedLoop: closed}
		if _, ok := fleet.ParsePeer(name); ok && e2eMode {
			fmt.Fprintf(os.Stderr, "fleetsim: %s: a simulated peer routes in process only\n", name)
			os.Exit(2)
		}
		if fc, err = modeConfig(name, fc); err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
			os.Exit(2)
		}
		var (
			res *fleet.Result
			er  *e2e.Result
		)
		if e2eMode {
			target := e2e.Target{Addr: *addr, NATSURL: *natsURL, Prefix: *prefix, Stream: *stream}
			er, err = e2e.Run(e2e.Config{Fleet: fc, Target: target}, reqs)
			if er != nil {
				res = &er.Result
			}
		} else {
			res, err = fleet.Run(fc, reqs)
		}
		if res == nil {
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
			os.Exit(1)
		}
		if err != nil { // the run is complete; the daemon did not catch up or clean up
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
		}
		tm, t50, t99 := stats(res.TTFT)
		em, _, e99 := stats(res.E2E)
		im, _, _ := stats(res.ITL(reqs))
		of := "—" // a trace without prefix sharing has no bound to be a share of
		if bound > 0 {
			of = fmt.Sprintf("%.0f %%", 100*(res.HitRate()+res.HostHitRate())/bound)
		}
		fmt.Printf("| %s | %.0f / %.0f / %.0f | %.1f | %.1f / %.1f | %.1f + %.1f %% | %s | %.0f | %.2f | %d | %v |",
			name, ms(tm), ms(t50), ms(t99), ms(im), em.Seconds(), e99.Seconds(), 100*res.HitRate(), 100*res.HostHitRate(),
			of, float64(res.OutputTokens)/res.Makespan.Seconds(),
			res.Imbalance(), res.Refused, time.Since(t1).Round(time.Millisecond))
		if er != nil {
			_, r50, r99 := stats(res.RouteLatency)
			fmt.Printf(" %.0f / %.0f | %d / %d / %d | %.1f ms | %.1f ms |", us(r50), us(r99), res.RouteFailures, res.CallErrors,
				er.Published.Errors, ms(res.MaxLag), ms(er.Drain))
		}
		fmt.Println()
		if len(res.PredErr) > 0 {
			e := make([]float64, len(res.PredErr))
			signed := slices.Clone(res.PredErr)
			for i, v := range res.PredErr {
				e[i] = math.Abs(v)
			}
			slices.Sort(e)
			slices.Sort(signed)
			fmt.Fprintf(os.Stderr, "fleetsim: %s: prediction |error| median %.1f %% p90 %.1f %%; signed median %+.1f %%\n", name, 100*e[len(e)/2], 100*e[len(e)*9/10], 100*signed[len(e)/2])
		}
		fmt.Fprintf(os.Stderr, "fleetsim: %s: workers' step time %.0f %% prefill; %d requests split into prefill and decode stages\n", name,
			100*float64(res.PrefillBusy)/float64(max(1, res.PrefillBusy+res.DecodeBusy)), res.Split)
		if queue != nil {
			fmt.Fprintf(os.Stderr, "fleetsim: %s: %d requests waited in the router queue (%s, threshold %g), at most %d at once\n",
				name, res.Queued, queue.Policy, queue.Threshold, res.MaxQueued)
		}
		if res.RouteErr != "" {
			fmt.Fprintf(os.Stderr, "fleetsim: %s: %d route failures; the first: %s\n", name, res.RouteFailures, res.RouteErr)
		}
		if er != nil && er.Published.FirstErr != "" {
			fmt.Fprintf(os.Stderr, "fleetsim: %s: %d event batches not stored; the first: %s\n", name, er.Published.Errors, er.Published.FirstErr)
		}
	}
}

// modeConfig is fc routed by mode name: kvrouterd's mode, or a simulated peer's policy, which
// has none of kvrouterd's features (the fleet's own settings stay).
func modeConfig(name string, fc fleet.Config) (fleet.Config, error) {
	if p, ok := fleet.ParsePeer(name); ok {
		fc.Peer, fc.Queue, fc.PrefillWorkers, fc.Disagg, fc.TierCredit, fc.PredictedTTL = p, nil, 0, nil, nil, 0
		return fc, nil
	}
	if p, ok := fleet.ParsePolicy(name); ok && name != "kv" {
		p.Apply(&fc)
		return fc, nil
	}
	var err error
	fc.Mode, err = scoring.ParseMode(name)
	return fc, err
}

// streamRun is --stream: each mode replays a source of its own, the trace at path or the
// built-in workload syn, and the table's figures come from the results' histograms.
func streamRun(syn trace.SyntheticConfig, path string, traceBS int, unit string, scale float64, modes string, config func(string) fleet.Config) {
	tu, err := trace.ParseTimeUnit(unit)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(2)
	}
	open := func() (trace.Source, func()) {
		if path == "" {
			return trace.ScaleSource(trace.SyntheticSource(syn), scale), func() {}
		}
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
			os.Exit(1)
		}
		return trace.MooncakeSource(f, trace.MooncakeOptions{TimeScale: scale, BlockSize: traceBS, TimeUnit: tu}), func() { f.Close() }
	}
	fmt.Println("# streamed: requests read as they come due, only those in flight held; figures from histograms (quantiles within 0.8 %); sessions closed-loop")
	fmt.Println("| mode | requests | TTFT mean / p50 / p99 ms | ITL mean ms | e2e mean / p99 s | hit rate device + host | output tok/s | imbalance | refused | most held at once | sim time |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, name := range strings.Split(modes, ",") {
		fc := config(name)
		src, done := open()
		t1 := time.Now()
		res, err := fleet.RunSource(fc, src)
		done()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim:", err)
			os.Exit(1)
		}
		fmt.Printf("| %s | %d | %.0f / %.0f / %.0f | %.1f | %.1f / %.1f | %.1f + %.1f %% | %.0f | %.2f | %d | %d | %v |\n",
			name, res.Requests, ms(res.TTFTHist.Mean()), ms(res.TTFTHist.Quantile(0.5)), ms(res.TTFTHist.Quantile(0.99)),
			ms(res.ITLHist.Mean()), res.E2EHist.Mean().Seconds(), res.E2EHist.Quantile(0.99).Seconds(),
			100*res.HitRate(), 100*res.HostHitRate(), float64(res.OutputTokens)/res.Makespan.Seconds(),
			res.Imbalance(), res.Refused, res.MaxInFlight, time.Since(t1).Round(time.Millisecond))
	}
	if hwm, err := peakRSS(); err == nil {
		fmt.Printf("# peak RSS %.0f MiB\n", float64(hwm)/(1<<20))
	}
}

// peakRSS is the process's peak resident set (VmHWM), in bytes; Linux only.
func peakRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb); err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

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
