// Command demo shows what kvrouterd does, through real sockets: kvrouterd with its OpenAI front
// door, four mock engines (cmd/kvr-mocker) registered with it, and a workload replayed through
// the front door at a loaded rate, once with kv routing (the daemon's
// default cost), once with Dynamo's v1 cost (--router-cost v1) and once round robin. It prints
// each mode's mean and p99 time to first token and inter-token latency, the simulator's figures
// for the same trace, fleet and rate (bench/fleet, the same worker model), the router's predicted
// TTFT against the measured one (X-Kvrouterd-Predicted-Ttft-Ms), and the hit available (the
// longest prefix cached anywhere) against the hit achieved (/metrics), and writes a plot. `make
// demo` runs it; about three minutes on 2 cores.
//
// The workload: the Mooncake conversation trace when it is found (--trace, else
// mooncake/conversation_trace.jsonl under $KVROUTERD_TRACES, ./traces — where `make traces`
// puts it — or ../shared/traces), else the built-in generated workload (bench/trace's Synthetic,
// the one the report's "generated" workload uses), so that a fresh clone runs it with nothing
// fetched; --generated picks the built-in one in any case.
//
// Time: the mock engines run their simulated clock --speedup times faster than wall time, and
// the trace is replayed as fast; every latency printed is in the engines' simulated time
// (wall time × speedup), which is what the simulator reports too.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/scoring"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

type config struct {
	trace     string
	generated bool
	requests  int
	timeScale float64
	speedup   float64
	workers   int
	blocks    int
	blockSize int
	orders    int
	out       string
}

func main() {
	var c config
	flag.StringVar(&c.trace, "trace", "", "Mooncake trace (JSON lines); empty: "+conversation+" under $KVROUTERD_TRACES, ./traces or ../shared/traces, else the built-in generated workload")
	flag.BoolVar(&c.generated, "generated", false, "replay the built-in generated workload even when the trace is there")
	flag.IntVar(&c.requests, "requests", 600, "the workload's first requests replayed")
	flag.Float64Var(&c.timeScale, "time-scale", 1, "multiplies the trace's arrival times (below 1: more load)")
	flag.Float64Var(&c.speedup, "speedup", 4, "simulated seconds per wall second, for the engines and the replay alike")
	flag.IntVar(&c.workers, "workers", 4, "mock engines")
	flag.IntVar(&c.blocks, "blocks", 16384, "each engine's KV cache, in blocks")
	flag.IntVar(&c.blockSize, "block-size", 16, "tokens per KV block")
	flag.IntVar(&c.orders, "sim-orders", 10, "simulator runs besides the trace's order, each with the requests of equal arrival time in another order (as concurrent clients deliver them)")
	flag.StringVar(&c.out, "out", "bench/out", "directory of demo.png")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// stats are one mode's latencies, in simulated time.
type stats struct {
	mode           string
	ttft, itl      []time.Duration // per request: its TTFT, its mean gap between tokens
	failed         int
	simTTFT        []time.Duration // the simulator's TTFTs for the same requests
	simHit, hit    float64         // the simulator's cache hit rate; the engines' (cached / prompt tokens)
	simMeans       []time.Duration // the simulator's mean TTFT with the trace's ties in other orders
	cached, prompt int64
	// predErr holds, per request the router predicted, |predicted − measured| / measured;
	// available and achieved are the router's hit counters (tokens) at the end, of prompt.
	predErr                        []float64
	available, achieved, promptAll float64
}

// conversation is where the Mooncake conversation trace lies in a traces directory.
const conversation = "mooncake/conversation_trace.jsonl"

// findTrace returns the Mooncake conversation trace's path in the first of the directories
// that has it, or "" when none does.
func findTrace() string {
	dirs := []string{"traces", "../shared/traces"}
	if d := os.Getenv("KVROUTERD_TRACES"); d != "" {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		p := filepath.Join(d, conversation)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// load returns the workload's first c.requests requests, arrivals scaled by c.timeScale, and
// its name.
func load(c config) ([]trace.Request, string, error) {
	path := c.trace
	if path == "" && !c.generated {
		path = findTrace()
	}
	if path != "" {
		reqs, err := trace.LoadMooncake(path, trace.MooncakeOptions{TimeScale: c.timeScale, Limit: c.requests})
		return reqs, filepath.Base(path), err
	}
	if !(c.timeScale > 0) {
		return nil, "", fmt.Errorf("--time-scale %v: want a positive number", c.timeScale)
	}
	g := trace.DefaultSynthetic()
	src := trace.SyntheticSource(g)
	var reqs []trace.Request
	for len(reqs) < c.requests {
		r, ok := src.Next()
		if !ok {
			break
		}
		reqs = append(reqs, r)
	}
	if !c.generated {
		fmt.Printf("No Mooncake trace found (%s under $KVROUTERD_TRACES, ./traces or ../shared/traces):\n"+
			"replaying the built-in generated workload instead (system prompts, multi-turn sessions, documents\n"+
			"read by several requests; %.0f requests a second). `make traces` fetches the Mooncake traces into\n"+
			"./traces, where the next `make demo` finds them.\n\n", conversation, g.Rate)
	}
	return trace.Scale(reqs, c.timeScale), "the built-in generated workload", nil
}

func run(c config) error {
	reqs, name, err := load(c)
	if err != nil {
		return err
	}
	if len(reqs) == 0 {
		return errors.New("the workload has no request (--requests)")
	}
	bin, err := os.MkdirTemp("", "kvr-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	for _, cmd := range []string{"kvrouterd", "kvr-mocker"} {
		b := exec.Command("go", "build", "-o", filepath.Join(bin, cmd), "./cmd/"+cmd)
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("building %s: %w", cmd, err)
		}
	}
	fmt.Printf("kvrouterd demo: %d requests of %s (time ×%.2f), %d mock engines of %d blocks of %d tokens, speedup %g\n\n",
		len(reqs), name, c.timeScale, c.workers, c.blocks, c.blockSize, c.speedup)
	var all []*stats
	for _, mode := range []string{"kv", "dynamo_v1", "round_robin"} {
		st, err := runMode(c, bin, mode, reqs)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		if err := simulate(c, mode, reqs, st); err != nil {
			return err
		}
		all = append(all, st)
	}
	fmt.Printf("%-12s %12s %12s %12s %12s %10s | %14s %10s %26s\n", "mode", "TTFT mean", "TTFT p99", "ITL mean", "ITL p99", "hit rate", "sim TTFT mean", "sim hit",
		fmt.Sprintf("sim, %d orders: median [range]", c.orders))
	fmt.Println()
	for _, s := range all {
		pe := "-"
		if len(s.predErr) > 0 {
			e := slices.Sorted(slices.Values(s.predErr))
			pe = fmt.Sprintf("%.0f %% (median |predicted − measured| / measured over %d requests)", 100*e[len(e)/2], len(e))
		}
		hits := "-"
		if s.promptAll > 0 {
			hits = fmt.Sprintf("available %.1f %%, achieved %.1f %% of prompt tokens", 100*s.available/s.promptAll, 100*s.achieved/s.promptAll)
		}
		fmt.Printf("%-12s predicted TTFT error %s; hit %s\n", s.mode, pe, hits)
	}
	fmt.Println()
	for _, s := range all {
		spread := "-"
		if len(s.simMeans) > 0 {
			sorted := slices.Sorted(slices.Values(s.simMeans))
			spread = fmt.Sprintf("%s [%s – %s]", ms(sorted[len(sorted)/2]), ms(sorted[0]), ms(sorted[len(sorted)-1]))
		}
		fmt.Printf("%-12s %12s %12s %12s %12s %9.1f%% | %14s %9.1f%% %26s   (%d failed)\n", s.mode,
			ms(mean(s.ttft)), ms(pct(s.ttft, 0.99)), ms(mean(s.itl)), ms(pct(s.itl, 0.99)), 100*s.hit,
			ms(mean(s.simTTFT)), 100*s.simHit, spread, s.failed)
	}
	explain(all)
	return writePlot(filepath.Join(c.out, "demo.png"), all)
}

// runMode starts kvrouterd in mode and the engines, replays reqs through the front door, and
// stops them all.
func runMode(c config, bin, mode string, reqs []trace.Request) (*stats, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "kvr-demo-data-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	api, front := mustFreeAddr(), mustFreeAddr()
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(os.Interrupt)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
	}()
	start := func(name string, args ...string) error {
		p := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		p.Stderr = io.Discard
		if err := p.Start(); err != nil {
			return err
		}
		procs = append(procs, p)
		return nil
	}
	routing := []string{"--router-mode", mode}
	if mode == "dynamo_v1" {
		routing = []string{"--router-mode", "kv", "--router-cost", "v1"}
	}
	if err := start("kvrouterd", append(routing, "--http-addr", api, "--frontend-addr", front, "--data-dir", dir, "--nats-listen", "127.0.0.1:0",
		"--no-snapshots", "--block-size", strconv.Itoa(c.blockSize), "--log-level", "warn")...); err != nil {
		return nil, err
	}
	if err := waitFor(func() bool { return get("http://"+api+"/readyz") == 200 }); err != nil {
		return nil, fmt.Errorf("kvrouterd never ready: %w", err)
	}
	for w := 1; w <= c.workers; w++ {
		if err := start("kvr-mocker", "--http-addr", mustFreeAddr(), "--model", "demo", "--worker-id", strconv.Itoa(w),
			"--block-size", strconv.Itoa(c.blockSize), "--blocks", strconv.Itoa(c.blocks), "--speedup", fmt.Sprint(c.speedup),
			"--kv-events-addr", "tcp://"+mustFreeAddr(), "--replay-addr", "tcp://"+mustFreeAddr(),
			"--register", "http://"+api, "--log-level", "warn"); err != nil {
			return nil, err
		}
	}
	if err := waitFor(func() bool { return workersUp("http://"+api, c.workers) }); err != nil {
		return nil, fmt.Errorf("the engines never registered: %w", err)
	}
	st := &stats{mode: mode, ttft: make([]time.Duration, len(reqs)), itl: make([]time.Duration, len(reqs))}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	t0 := time.Now()
	first := reqs[0].At
	for i, r := range reqs {
		due := t0.Add(time.Duration(float64(r.At-first) / c.speedup))
		time.Sleep(time.Until(due))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ttft, itl, cached, pred, err := send(client, "http://"+front, r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				st.failed++
				st.ttft[i], st.itl[i] = -1, -1
				return
			}
			// The router lives in wall time: it learns the engines' speed (--speedup) as
			// their slowness, so its predictions are wall milliseconds.
			if measured := float64(ttft) / 1e6; pred > 0 && measured > 0 {
				st.predErr = append(st.predErr, math.Abs(pred-measured)/measured)
			}
			st.ttft[i] = time.Duration(float64(ttft) * c.speedup)
			st.itl[i] = time.Duration(float64(itl) * c.speedup)
			st.cached += int64(cached)
			st.prompt += int64(len(r.Tokens))
		}()
	}
	wg.Wait()
	st.available, st.achieved, st.promptAll = hitCounters("http://" + api)
	st.ttft, st.itl = slices.DeleteFunc(st.ttft, neg), slices.DeleteFunc(st.itl, neg)
	if st.prompt > 0 {
		st.hit = float64(st.cached) / float64(st.prompt)
	}
	fmt.Printf("%s: %d requests in %v wall\n", mode, len(reqs), time.Since(t0).Round(time.Second))
	return st, nil
}

func neg(d time.Duration) bool { return d < 0 }

// hitCounters reads the router's hit available, hit achieved and prompt tokens, summed over
// its models, from its /metrics (0s when it cannot).
func hitCounters(api string) (available, achieved, prompt float64) {
	resp, err := http.Get(api + "/metrics")
	if err != nil {
		return 0, 0, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, m := range []struct {
			name string
			v    *float64
		}{{"kvrouterd_model_available_hit_tokens_total{", &available}, {"kvrouterd_model_achieved_hit_tokens_total{", &achieved},
			{"kvrouterd_model_prompt_tokens_total{", &prompt}} {
			if strings.HasPrefix(line, m.name) {
				if i := strings.LastIndexByte(line, ' '); i > 0 {
					if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
						*m.v += v
					}
				}
			}
		}
	}
	return available, achieved, prompt
}

// send streams one completion through the front door and returns its time to first token, its
// mean gap between tokens (wall time), the prompt tokens the engine found cached and the
// router's predicted TTFT (wall ms; 0: none).
func send(c *http.Client, front string, r trace.Request) (ttft, itl time.Duration, cached int, pred float64, err error) {
	body, _ := json.Marshal(map[string]any{"model": "demo", "prompt": r.Tokens, "max_tokens": max(r.Output, 1), "stream": true,
		"stream_options": map[string]bool{"include_usage": true}})
	start := time.Now()
	resp, err := c.Post(front+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return 0, 0, 0, 0, fmt.Errorf("%d: %.200s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last time.Time
	var gaps time.Duration
	tokens := 0
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) || bytes.Equal(line, []byte("data: [DONE]")) {
			continue
		}
		var chunk struct {
			Choices []struct{ Text string } `json:"choices"`
			Usage   *struct {
				Details *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		_ = json.Unmarshal(line[6:], &chunk)
		if chunk.Usage != nil && chunk.Usage.Details != nil {
			cached = chunk.Usage.Details.Cached
		}
		if len(chunk.Choices) == 0 {
			continue
		}
		now := time.Now()
		if tokens == 0 {
			ttft = now.Sub(start)
		} else {
			gaps += now.Sub(last)
		}
		last = now
		tokens++
	}
	if err := sc.Err(); err != nil {
		return 0, 0, 0, 0, err
	}
	if tokens == 0 {
		return 0, 0, 0, 0, errors.New("no token")
	}
	if tokens > 1 {
		itl = gaps / time.Duration(tokens-1)
	}
	pred, _ = strconv.ParseFloat(resp.Header.Get("X-Kvrouterd-Predicted-Ttft-Ms"), 64)
	return ttft, itl, cached, pred, nil
}

// simulate runs the simulator on the same trace and fleet in mode.
func simulate(c config, mode string, reqs []trace.Request, st *stats) error {
	wc := sim.DefaultWorkerConfig()
	wc.Blocks, wc.BlockSize = c.blocks, c.blockSize
	fc := fleet.Config{Workers: c.workers, Worker: wc}
	if p, ok := fleet.ParsePolicy(mode); ok {
		p.Apply(&fc) // kv: the daemon's default cost, as the daemon above ran
	} else {
		m, err := scoring.ParseMode(mode)
		if err != nil {
			return err
		}
		fc.Mode = m
	}
	res, err := fleet.Run(fc, reqs)
	if err != nil {
		return err
	}
	st.simTTFT, st.simHit = res.TTFT, res.HitRate()
	// The client sends requests of equal arrival time concurrently, so they reach the router in
	// no set order; the trace's order is one of many. The simulator in other orders shows how
	// much that alone moves a mode's mean.
	for seed := 1; seed <= c.orders; seed++ {
		res, err := fleet.Run(fc, shuffleTies(reqs, uint64(seed)))
		if err != nil {
			return err
		}
		st.simMeans = append(st.simMeans, mean(res.TTFT))
	}
	return nil
}

// shuffleTies returns reqs with each run of equal arrival times in a random order (seed), each
// request then a nanosecond after the one before so that the order holds.
func shuffleTies(reqs []trace.Request, seed uint64) []trace.Request {
	rs := slices.Clone(reqs)
	rng := rand.New(rand.NewPCG(seed, 0x7ace))
	for i := 0; i < len(rs); {
		j := i + 1
		for j < len(rs) && rs[j].At == rs[i].At {
			j++
		}
		rng.Shuffle(j-i, func(a, b int) { rs[i+a], rs[i+b] = rs[i+b], rs[i+a] })
		for k := i; k < j; k++ {
			rs[k].At += time.Duration(k - i)
		}
		i = j
	}
	return rs
}

// explain says what the table's columns mean and, when kv's TTFT beats round robin's by more
// than their hit rates differ, where the rest comes from.
func explain(all []*stats) {
	fmt.Print(`
TTFT: time to first token, ITL: mean gap between tokens, both in the engines' simulated time;
lower is better. hit rate: the share of prompt tokens the engines found in their KV cache (sim
hit: the simulator's). Available: the longest prefix cached on any engine when the request was
routed; achieved: what the chosen engine had cached.
`)
	var kv, rr *stats
	for _, s := range all {
		switch s.mode {
		case "kv":
			kv = s
		case "round_robin":
			rr = s
		}
	}
	if kv == nil || rr == nil || len(kv.ttft) == 0 || len(rr.ttft) == 0 {
		return
	}
	kvT, rrT := msf(mean(kv.ttft)), msf(mean(rr.ttft))
	if kvT >= rrT || kv.hit-rr.hit > 0.25*(1-kvT/rrT) {
		return
	}
	fmt.Printf(`kv's mean TTFT is %.0f %% below round robin's while its hit rate is only %.1f points higher: kv's cost
is a predicted time, so besides the cache it weighs the prefill already queued on each engine and
sends a long prompt where it waits least, which round robin does not look at. When the workload
leaves little to reuse (hit available %s), that is most of the gain.
`, 100*(1-kvT/rrT), 100*(kv.hit-rr.hit), availableText(kv))
}

func availableText(s *stats) string {
	if s.promptAll <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f %% of prompt tokens", 100*s.available/s.promptAll)
}

func writePlot(path string, all []*stats) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "kvrouterd demo: time to first token (simulated ms; lower is better)"
	p.Y.Label.Text = "ms (lower is better)"
	w := vg.Points(14)
	for i, s := range all {
		vals := plotter.Values{msf(mean(s.ttft)), msf(pct(s.ttft, 0.99)), msf(mean(s.simTTFT)), msf(pct(s.simTTFT, 0.99))}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		b.Offset = vg.Length(2*i-len(all)+1) * w / 2
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		p.Add(b)
		p.Legend.Add(s.mode, b)
	}
	p.NominalX("mean (e2e)", "p99 (e2e)", "mean (simulator)", "p99 (simulator)")
	p.Legend.Top, p.Legend.Left = true, true
	if err := p.Save(7*vg.Inch, 4*vg.Inch, path); err != nil {
		return err
	}
	fmt.Println("plot:", path)
	return nil
}

func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return s / time.Duration(len(d))
}

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", msf(d)) }

func msf(d time.Duration) float64 { return float64(d) / 1e6 }

func get(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func workersUp(api string, n int) bool {
	resp, err := http.Get(api + "/v1/workers")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var ws struct {
		Workers []struct {
			HTTP string `json:"http_endpoint"`
		} `json:"workers"`
	}
	if json.NewDecoder(resp.Body).Decode(&ws) != nil {
		return false
	}
	up := 0
	for _, w := range ws.Workers {
		if w.HTTP != "" {
			up++
		}
	}
	return up >= n
}

func waitFor(ok func() bool) error {
	for deadline := time.Now().Add(60 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func mustFreeAddr() string {
	addr, err := freeport.Addr()
	if err != nil {
		panic(err)
	}
	return addr
}
