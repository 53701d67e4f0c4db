package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// The fleet of the routing-quality section: 8 workers with the defaults of Dynamo's simulated
// engine (reference.md §5), so that the numbers compare with Dynamo's own.
const (
	fleetWorkers = 8
	blockSize    = 64
	kvBlocks     = 16384
)

// routing is how a run routes: one of kvrouterd's modes, or a simulated peer's policy (peer
// set; package bench/fleet, docs/peers.md).
type routing struct {
	mode scoring.Mode
	peer fleet.Peer
	// policy, with mode kv, is one of fleet.Policies other than kv (Dynamo's formulas and
	// presets); "" is kv, the daemon's default.
	policy string
}

func (r routing) String() string {
	switch {
	case r.peer != "":
		return string(r.peer)
	case r.policy != "":
		return r.policy
	}
	return r.mode.String()
}

// routings are the routings compared, kv (the daemon's default) first: kvrouterd's modes,
// Dynamo's cost formulas and presets in kvrouterd, then the policies of the routers users
// would otherwise run.
var routings = []routing{{mode: scoring.KV}, {mode: scoring.RoundRobin}, {mode: scoring.Random}, {mode: scoring.LeastLoaded},
	{mode: scoring.KV, policy: "dynamo_v1"}, {mode: scoring.KV, policy: "dynamo_main"}, {mode: scoring.KV, policy: "dynamo_agentic"},
	{mode: scoring.KV, policy: "dynamo_load_aware"},
	{peer: fleet.LLMD}, {peer: fleet.SGLang}, {peer: fleet.GIE}}

// kvDefault makes fc, if it routes by kv with no policy applied (Terms nil), route as the
// daemon does by default (fleet.Policies' kv), its other settings kept. Every simulation of
// the report goes through it, so that "kv" is the daemon's default throughout.
func kvDefault(fc *fleet.Config) {
	if fc.Peer == "" && fc.Mode == scoring.KV && fc.Terms == nil {
		p, _ := fleet.ParsePolicy("kv")
		w := fc.OverlapWeight
		p.Apply(fc)
		if w != 0 {
			fc.OverlapWeight = w
		}
	}
}

// ladder is the arrival-time scales tried, lightest load first, for the loaded point: the first
// at which round robin's mean TTFT is at least 10× its unloaded value.
var ladder = []float64{0.5, 0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 0.015, 0.01, 0.0075, 0.005}

const (
	unloadedScale = 10 // arrivals 10× further apart: the prefill alone, almost no queueing
	loadFactor    = 10
)

// workload is one request trace of the quality section.
type workload struct {
	name, about string
	reqs        []trace.Request
	// closedLoop replays its sessions closed-loop (fleet.Config.ClosedLoop): a --trace whose
	// requests carry sessions. about says so, and with it every row's conditions.
	closedLoop bool
}

// workloads loads the traces; a missing Mooncake trace file is reported and skipped, the
// generated workload needs none, and a --trace that does not load is an error: the user asked
// for it.
func (r *report) workloads() ([]workload, error) {
	limit := 0
	if r.cfg.Quick {
		limit = 2500 // about the first 12 minutes of the conversation trace
	}
	var ws []workload
	for _, f := range []struct{ name, file, about string }{
		{"conversation", "conversation_trace.jsonl", "Mooncake conversation trace"},
		{"mooncake-synthetic", "synthetic_trace.jsonl", "Mooncake synthetic trace"},
	} {
		path := filepath.Join(r.cfg.Traces, "mooncake", f.file)
		reqs, err := trace.LoadMooncake(path, trace.MooncakeOptions{Limit: limit})
		if err != nil {
			r.logf("quality: %s: %v (skipped; --traces or KVROUTERD_TRACES names the directory)", f.name, err)
			r.mdf("\n*%s not measured: %v.*\n", f.about, err)
			r.missing("quality", f.about, err)
			continue
		}
		ws = append(ws, workload{name: f.name, about: f.about, reqs: reqs})
	}
	for _, t := range r.cfg.Extra {
		w, err := r.extra(t)
		if err != nil {
			return nil, err
		}
		ws = append(ws, w)
	}
	g := trace.DefaultSynthetic()
	if r.cfg.Quick {
		g.Duration = 4 * time.Minute
	}
	if r.cfg.Generated > 0 {
		g.Duration = r.cfg.Generated
	}
	ws = append(ws, workload{name: "generated", about: fmt.Sprintf("built-in generator (%v: system prompts, multi-turn sessions, document fan-out)", g.Duration), reqs: trace.Synthetic(g)})
	return ws, nil
}

// extra loads a --trace (its first 2,500 requests in the quick report) as every section
// replays it: closed-loop when it has sessions.
func (r *report) extra(t namedTrace) (workload, error) {
	opt := r.cfg.TraceOptions
	if r.cfg.Quick {
		opt.Limit = 2500
	}
	reqs, err := trace.LoadMooncake(t.Path, opt)
	if err != nil {
		return workload{}, fmt.Errorf("--trace %s=%s: %w", t.Name, t.Path, err)
	}
	w := workload{name: t.Name, about: "trace " + filepath.Base(t.Path), reqs: reqs}
	if slices.ContainsFunc(reqs, func(q trace.Request) bool { return q.Session != 0 }) {
		w.closedLoop = true
		w.about += ", its sessions replayed closed-loop (a turn after the previous answer and the trace's gap)"
	}
	return w, nil
}

// qualityRun is one simulation and its summary.
type qualityRun struct {
	mode scoring.Mode
	peer fleet.Peer // set: the run routed by this peer's policy (mode unused)
	// policy is the fleet.Policies entry of a kv run other than the daemon's default.
	policy string
	scale  float64
	res    *fleet.Result
	ttft   dist
	e2e    dist
}

// simulate runs one fleet simulation of w at arrival scale s.
// Runs without load samples are kept by their settings: a simulation is deterministic for its
// settings and seed, and the loaded point, the tables and the load sweep ask for many of the
// same ones.
func (r *report) simulate(w workload, mode scoring.Mode, s float64, blocks int, weight float64, sample time.Duration) (qualityRun, error) {
	rt := routing{mode: mode}
	if mode == scoring.KV && weight != 0 && weight != 1 {
		rt.policy = "dynamo_v1" // an overlap weight is Dynamo v1's
	}
	return r.simulateKept(w, rt, s, blocks, weight, sample)
}

// simulateKept runs one simulation of w at scale s routed by rt, or returns the kept run of
// the same settings.
func (r *report) simulateKept(w workload, rt routing, s float64, blocks int, weight float64, sample time.Duration) (qualityRun, error) {
	key := simKey{w.name + "\x00" + w.about, rt, s, blocks, weight}
	if q, ok := r.sims[key]; ok && sample == 0 {
		return q, nil
	}
	fc := fleet.Config{Mode: rt.mode, OverlapWeight: weight, Sample: sample}
	switch {
	case rt.peer != "":
		fc = fleet.Config{Peer: rt.peer, Sample: sample}
	case rt.policy != "":
		p, ok := fleet.ParsePolicy(rt.policy)
		if !ok {
			return qualityRun{}, fmt.Errorf("quality: no policy %q", rt.policy)
		}
		p.Apply(&fc)
		if weight != 0 {
			fc.OverlapWeight = weight
		}
	}
	q, err := r.simulateFleet(w, s, fc, blocks, rt.String())
	q.policy = rt.policy
	if err == nil && sample == 0 {
		if r.sims == nil {
			r.sims = map[simKey]qualityRun{}
		}
		r.sims[key] = q
	}
	return q, err
}

// simKey is what a simulation without load samples depends on, besides the seed.
type simKey struct {
	workload string // name and about: the report has two workloads named "generated"
	routing  routing
	scale    float64
	blocks   int
	weight   float64
}

// simulateRouting runs one fleet simulation of w at arrival scale s routed by rt.
func (r *report) simulateRouting(w workload, rt routing, s float64, blocks int, sample time.Duration) (qualityRun, error) {
	return r.simulateKept(w, rt, s, blocks, 0, sample)
}

// name is the run's routing, as the report's rows and plots name it.
func (q qualityRun) name() string { return routing{q.mode, q.peer, q.policy}.String() }

// simulateFleet runs one fleet simulation of w at arrival scale s with fc's routing, queue and
// fleet settings (its workers, worker model — but for fc.Worker.HostBlocks — and seed are the
// section's); label names it in the log.
func (r *report) simulateFleet(w workload, s float64, fc fleet.Config, blocks int, label string) (qualityRun, error) {
	wc := sim.DefaultWorkerConfig()
	wc.BlockSize, wc.Blocks, wc.HostBlocks, wc.TimingBlocks = blockSize, blocks, fc.Worker.HostBlocks, fc.Worker.TimingBlocks
	fc.Workers, fc.Worker, fc.Seed, fc.ClosedLoop = fleetWorkers, wc, r.cfg.Seed, w.closedLoop
	kvDefault(&fc)
	t0 := time.Now()
	res, err := fleet.Run(fc, trace.Scale(w.reqs, s))
	if err != nil {
		return qualityRun{}, fmt.Errorf("%s ×%g %s: %w", w.name, s, label, err)
	}
	q := qualityRun{mode: fc.Mode, peer: fc.Peer, scale: s, res: res, ttft: summarize(res.TTFT), e2e: summarize(res.E2E)}
	r.logf("quality: %s ×%g %-12s TTFT mean %7.0f ms, hit %4.1f %% + host %4.1f %%  (%v)", w.name, s, label, ms(q.ttft.mean),
		100*res.HitRate(), 100*res.HostHitRate(), time.Since(t0).Round(10*time.Millisecond))
	return q, nil
}

// loadPoint finds the lightest load of the ladder at which mode's mean TTFT is at least
// loadFactor × its unloaded value, and returns both runs.
func (r *report) loadPoint(w workload, mode scoring.Mode, blocks int) (unloaded, loaded qualityRun, err error) {
	if unloaded, err = r.simulate(w, mode, unloadedScale, blocks, 0, 0); err != nil {
		return
	}
	for _, s := range ladder {
		if loaded, err = r.simulate(w, mode, s, blocks, 0, 0); err != nil {
			return
		}
		if loaded.ttft.mean >= loadFactor*unloaded.ttft.mean {
			return
		}
	}
	return // the heaviest tried; the report shows the ratio reached
}

func (r *report) quality() error {
	r.mdf("\n## Routing quality\n\n")
	r.mdf("Each trace is replayed on %d simulated workers (package `bench/sim`: prefix-cached KV cache of %d blocks of %d tokens "+
		"with LRU eviction, 256 sequences, 8,192 batched tokens, chunked prefill, the timing model of Dynamo's simulated engine) "+
		"routed by kvrouterd's router in process, on a simulated clock (package `bench/fleet`; deterministic for a seed). "+
		"Defaults as in Dynamo: overlap weight 1, temperature 0, prefill tokens tracked. The rows llmd, sglang and gie route the "+
		"same fleet by the simulated policies of llm-d's precise-prefix-cache profile, SGLang's cache_aware router and the "+
		"Gateway API inference extension's default endpoint picker, with their defaults and only what each would know "+
		"(`docs/peers.md`).\n\n", fleetWorkers, kvBlocks, blockSize)
	r.mdf("The loaded point is the lightest arrival-time scale of %v at which round robin's mean TTFT is at least %d× its "+
		"unloaded value (arrivals %d× further apart than the trace's). The hit rate is the fraction of prompt tokens served "+
		"from a worker's cache; *of bound* divides it by the infinite-cache bound (one cache of unlimited size shared by all "+
		"workers: no router can exceed it), *of pooled* by one LRU cache holding the whole fleet's %d×%d blocks with no load "+
		"limits (what routing could recover with this much memory).\n", ladder, loadFactor, unloadedScale, fleetWorkers, kvBlocks)
	var conv *loadedSet
	ws, err := r.workloads()
	if err != nil {
		return err
	}
	for _, w := range ws {
		set, err := r.qualityWorkload(w, kvBlocks)
		if err != nil {
			return err
		}
		if w.name == "conversation" {
			conv = set
		}
	}
	if conv != nil && !r.cfg.Quick {
		if err := r.sensitivity(conv); err != nil {
			return err
		}
	}
	if conv != nil {
		if err := r.queue(conv.w); err != nil {
			return err
		}
	}
	return r.features(conv)
}

// loadedSet is the runs of every mode at a workload's loaded point.
type loadedSet struct {
	w    workload
	runs []qualityRun
}

func (r *report) qualityWorkload(w workload, blocks int) (*loadedSet, error) {
	st := trace.Summarize(w.reqs)
	inf := trace.InfiniteBound(w.reqs, blockSize)
	pooled := trace.CountLRUHits(w.reqs, blockSize, fleetWorkers*blocks).TokenBound()
	r.logf("quality: %s: %d requests over %v; bounds: infinite %.1f %%, pooled %.1f %%", w.name, st.Requests,
		st.Duration.Round(time.Second), 100*inf, 100*pooled)
	unloaded, loaded, err := r.loadPoint(w, scoring.RoundRobin, blocks)
	if err != nil {
		return nil, err
	}
	ratio := float64(loaded.ttft.mean) / float64(unloaded.ttft.mean)
	r.mdf("\n### %s\n\n%d requests over %v, mean prompt %.0f tokens, mean output %.0f. Infinite-cache bound %.1f %% of prompt tokens, "+
		"pooled-cache bound %.1f %%. Round robin's mean TTFT: %.0f ms unloaded, %.0f ms at the loaded point ×%g (%.1f×%s).\n\n",
		w.about, st.Requests, st.Duration.Round(time.Second), st.Input.Mean, st.Output.Mean, 100*inf, 100*pooled,
		ms(unloaded.ttft.mean), ms(loaded.ttft.mean), loaded.scale, ratio,
		map[bool]string{true: "", false: fmt.Sprintf("; short of %d×: the heaviest load tried", loadFactor)}[ratio >= loadFactor])
	cond := func(s float64) string {
		return fmt.Sprintf("%s, %d requests, arrival times ×%g; %d simulated workers × %d blocks of %d tokens; overlap weight 1, temperature 0; seed %d",
			w.about, st.Requests, s, fleetWorkers, blocks, blockSize, r.cfg.Seed)
	}
	r.add(fmt.Sprintf("quality.%s.round_robin.ttft_unloaded_mean", w.name), ms(unloaded.ttft.mean), "ms", cond(unloadedScale))
	slo := kneeFactor * ms(unloaded.ttft.p99) // the TTFT goodput counts within
	r.add(fmt.Sprintf("quality.%s.bound_infinite", w.name), 100*inf, "%", cond(1))
	r.add(fmt.Sprintf("quality.%s.bound_pooled", w.name), 100*pooled, "%", cond(1))
	r.mdf("| load | mode | TTFT mean / p50 / p99 ms | e2e mean / p99 s | hit rate | of bound | of pooled | output tok/s | imbalance |\n")
	r.mdf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	set := &loadedSet{w: w}
	for _, pt := range []struct {
		label string
		scale float64
	}{{"trace speed", 1}, {"loaded", loaded.scale}} {
		for _, m := range routings {
			// Round robin at the loaded point runs again, with load samples (deterministic: the same numbers).
			q, err := r.simulateRouting(w, m, pt.scale, blocks, loadSamples(w, pt.scale))
			if err != nil {
				return nil, err
			}
			res := q.res
			hit := res.HitRate()
			tput := float64(res.OutputTokens) / res.Makespan.Seconds()
			r.mdf("| %s ×%g | %s | %.0f / %.0f / %.0f | %.1f / %.1f | %.1f %% | %.0f %% | %.0f %% | %.0f | %.2f |\n",
				pt.label, pt.scale, m, ms(q.ttft.mean), ms(q.ttft.p50), ms(q.ttft.p99), q.e2e.mean.Seconds(), q.e2e.p99.Seconds(),
				100*hit, 100*hit/inf, 100*hit/pooled, tput, res.Imbalance())
			key := fmt.Sprintf("quality.%s.%s.%s.", w.name, map[bool]string{true: "trace_speed", false: "loaded"}[pt.scale == 1], m)
			c := cond(pt.scale)
			if m.peer != "" {
				c = fmt.Sprintf("%s, arrival times ×%g; %d simulated workers × %d blocks of %d tokens; routed by the simulated %s policy with its defaults (docs/peers.md); seed %d",
					w.about, pt.scale, fleetWorkers, blocks, blockSize, m.peer, r.cfg.Seed)
			}
			r.add(key+"ttft_mean", ms(q.ttft.mean), "ms", c)
			r.add(key+"ttft_p50", ms(q.ttft.p50), "ms", c)
			r.add(key+"ttft_p99", ms(q.ttft.p99), "ms", c)
			r.add(key+"e2e_mean", q.e2e.mean.Seconds(), "s", c)
			r.add(key+"e2e_p99", q.e2e.p99.Seconds(), "s", c)
			r.add(key+"hit_rate", 100*hit, "%", c)
			r.add(key+"hit_rate_of_bound", 100*hit/inf, "%", c)
			r.add(key+"hit_rate_of_pooled", 100*hit/pooled, "%", c)
			r.add(key+"output_throughput", tput, "tokens/s", c)
			r.add(key+"imbalance", res.Imbalance(), "max/mean requests", c)
			r.add(key+"hit_of_bound", 100*hit/inf, "%", c)
			r.add(key+"goodput", goodput(res, slo), "requests/s",
				fmt.Sprintf("%s; requests whose TTFT is within %.0f ms (%d× round robin's unloaded p99) per second of the run", c, slo, kneeFactor))
			if pe, ok := predictionError(res); ok {
				r.add(key+"prediction_error", pe, "%", c+"; median of |predicted − simulated| / simulated TTFT over the requests the router predicted")
			}
			if pt.scale != 1 {
				set.runs = append(set.runs, q)
			}
		}
	}
	r.verdict(w, set, inf)
	if err := r.qualityPlots(w, set, inf, pooled); err != nil {
		return nil, err
	}
	ks, err := r.knees(w, blocks, slo)
	if err != nil {
		return nil, err
	}
	r.beats(w, set, ks, inf)
	return set, nil
}

// verdict states, at the loaded point, how kv compares with round robin against the targets.
func (r *report) verdict(w workload, set *loadedSet, inf float64) {
	var kv, rr qualityRun
	for _, q := range set.runs {
		switch {
		case q.mode == scoring.KV && q.peer == "" && q.policy == "":
			kv = q
		case q.mode == scoring.RoundRobin && q.peer == "":
			rr = q
		}
	}
	if kv.res == nil || rr.res == nil {
		return
	}
	ratio := float64(kv.ttft.mean) / float64(rr.ttft.mean)
	of := 100 * kv.res.HitRate() / inf
	r.mdf("\nAt the loaded point kv's mean TTFT is %.2f of round robin's (target ≤ 0.33: %s), its p99 %.0f ms against %.0f ms (%s), "+
		"and its hit rate %.0f %% of the bound (target ≥ 80 %%: %s).\n", ratio, met(ratio <= 1.0/3), ms(kv.ttft.p99), ms(rr.ttft.p99),
		met(kv.ttft.p99 < rr.ttft.p99), of, met(of >= 80))
	r.headline(mdPrinter.Sprintf("%s, %d simulated workers, loaded (arrivals ×%g): kv / round robin TTFT mean; p99", w.about, fleetWorkers, kv.scale),
		mdPrinter.Sprintf("%.0f / %.0f ms (%.2f); %.0f / %.0f ms", ms(kv.ttft.mean), ms(rr.ttft.mean), ratio, ms(kv.ttft.p99), ms(rr.ttft.p99)),
		target(w, "≤ 1/3; p99 lower"), r.command("quality"))
	r.headline(mdPrinter.Sprintf("%s, loaded: kv prefix hit rate, of the infinite-cache bound", w.about),
		mdPrinter.Sprintf("%.1f %%, %.0f %% of %.1f %%", 100*kv.res.HitRate(), of, 100*inf), target(w, "≥ 80 % of the bound"), r.command("quality"))
	c := fmt.Sprintf("%s at the loaded point ×%g; %d workers × %d blocks", w.about, kv.scale, fleetWorkers, kvBlocks)
	r.add(fmt.Sprintf("quality.%s.loaded.kv_over_round_robin_ttft_mean", w.name), ratio, "ratio", c)
}

// beats says where any other routing does better than kv, by the bars kv is held to: at the
// loaded point a lower mean TTFT, a p99 TTFT under kv's / 1.1, a hit rate of the bound more
// than 3 points above kv's; in the load sweep a higher knee. The row quality.NAME.verdict
// counts the routings that do, and says where in words.
func (r *report) beats(w workload, set *loadedSet, ks []kneeResult, inf float64) {
	var kv qualityRun
	for _, q := range set.runs {
		if q.mode == scoring.KV && q.peer == "" && q.policy == "" {
			kv = q
		}
	}
	if kv.res == nil {
		return
	}
	var kvKnee kneeResult
	for _, k := range ks {
		if k.routing == (routing{mode: scoring.KV}) {
			kvKnee = k
		}
	}
	on := map[string][]string{}
	var names []string
	note := func(name, what string) {
		if _, ok := on[name]; !ok {
			names = append(names, name)
		}
		on[name] = append(on[name], what)
	}
	kvHit := 100 * kv.res.HitRate() / inf
	for _, q := range set.runs {
		if q.name() == "kv" {
			continue
		}
		if q.ttft.mean < kv.ttft.mean {
			note(q.name(), fmt.Sprintf("mean TTFT %.0f ms against kv's %.0f", ms(q.ttft.mean), ms(kv.ttft.mean)))
		}
		if 1.1*float64(q.ttft.p99) < float64(kv.ttft.p99) {
			note(q.name(), fmt.Sprintf("p99 TTFT %.0f ms against kv's %.0f (more than 1.1×)", ms(q.ttft.p99), ms(kv.ttft.p99)))
		}
		if h := 100 * q.res.HitRate() / inf; h > kvHit+3 {
			note(q.name(), fmt.Sprintf("hit rate %.0f %% of the bound against kv's %.0f %% (more than 3 points)", h, kvHit))
		}
	}
	for _, k := range ks {
		if k.routing.String() != "kv" && k.knee > kvKnee.knee && !k.below && !kvKnee.above {
			note(k.routing.String(), fmt.Sprintf("knee %.2f requests/s against kv's %.2f", k.knee, kvKnee.knee))
		}
	}
	text := "No routing beats kv here: not on mean TTFT, p99 TTFT (by more than 1.1×) or hit rate (by more than 3 points of the bound) at the loaded point, nor on the knee of the load sweep."
	if len(names) > 0 {
		var parts []string
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s (%s)", n, strings.Join(on[n], "; ")))
		}
		text = "Where another routing beats kv here: " + strings.Join(parts, ", ") + "."
	}
	r.mdf("\n%s\n", text)
	r.addText(fmt.Sprintf("quality.%s.verdict", w.name), float64(len(names)), "routings beating kv",
		fmt.Sprintf("%s at the loaded point ×%g and the load sweep; %d workers × %d blocks; seed %d", w.about, kv.scale, fleetWorkers, kvBlocks, r.cfg.Seed), text)
}

// goodput is the requests of res whose TTFT is within slo ms, per second of its makespan.
func goodput(res *fleet.Result, slo float64) float64 {
	n := 0
	for _, t := range res.TTFT {
		if t > 0 && ms(t) <= slo {
			n++
		}
	}
	if res.Makespan <= 0 {
		return 0
	}
	return float64(n) / res.Makespan.Seconds()
}

// predictionError is the median of |predicted / simulated − 1| over res's predicted requests,
// in %; false if the router predicted none.
func predictionError(res *fleet.Result) (float64, bool) {
	if len(res.PredErr) == 0 {
		return 0, false
	}
	e := make([]float64, len(res.PredErr))
	for i, v := range res.PredErr {
		e[i] = math.Abs(v)
	}
	slices.Sort(e)
	return 100 * e[len(e)/2], true
}

// target is t for the conversation trace, the one the targets are set on, and "—" otherwise.
func target(w workload, t string) string {
	if w.name == "conversation" {
		return t
	}
	return "—"
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// sensitivity reruns the conversation trace at its loaded point with a higher overlap weight,
// with 4× the cache per worker (as with a host-memory tier) at that cache's own loaded point,
// and with caches that hold the whole trace: what limits kv's hit rate, memory or routing.
func (r *report) sensitivity(set *loadedSet) error {
	w := set.w
	inf := trace.InfiniteBound(w.reqs, blockSize)
	r.mdf("\n### What limits the hit rate\n\nThe conversation trace again, kv against round robin, with more memory per worker and a "+
		"higher overlap weight. *Of pooled* is against the pooled bound of that row's memory. The last rows give every worker a "+
		"cache larger than all it is ever sent, at the same load: what they still miss is routing's doing, the load term sending "+
		"a request away from the worker that holds its prefix when that worker is busier (the cost function trading hits for "+
		"TTFT, as it is meant to), which a higher overlap weight trades back.\n\n"+
		"A larger cache changes TTFT two ways: more hits, and, in the mocker's timing model, faster decode steps, because the "+
		"model's KV usage is a fraction of the cache's own size, so the same sequences use less of a larger one. The first is "+
		"routing's and memory's doing; the second models a faster GPU, which more memory is not. Rows marked *decode as "+
		"%d blocks* time every worker's steps as the %d-block GPU the model was fitted on (usage = blocks in use / %d, at most 1: "+
		"`sim.WorkerConfig.TimingBlocks`): their TTFT shows the hits alone. The unmarked rows time decode as the mocker does; "+
		"the difference between the two is the decode speed-up.\n\n", kvBlocks, kvBlocks, kvBlocks)
	r.mdf("| blocks per worker | arrivals × | mode | overlap weight | decode timed as | TTFT mean / p99 ms | hit rate | of bound | of pooled |\n")
	r.mdf("|---:|---:|---|---:|---|---:|---:|---:|---:|\n")
	row := func(q qualityRun, blocks int, weight float64, timing int) {
		pooled := trace.CountLRUHits(w.reqs, blockSize, fleetWorkers*blocks).TokenBound()
		hit := q.res.HitRate()
		timed, suffix, cond := "its own size", "", ""
		if timing > 0 {
			timed, suffix = fmt.Sprintf("%d blocks", timing), fmt.Sprintf("decode%d.", timing)
			cond = fmt.Sprintf("; decode timed as a %d-block GPU (usage of %d blocks, at most 1)", timing, timing)
		}
		r.mdf("| %d | %g | %s | %g | %s | %.0f / %.0f | %.1f %% | %.0f %% | %.0f %% |\n", blocks, q.scale, q.name(), weight, timed,
			ms(q.ttft.mean), ms(q.ttft.p99), 100*hit, 100*hit/inf, 100*hit/pooled)
		c := fmt.Sprintf("%s, arrival times ×%g; %d workers × %d blocks of %d tokens; overlap weight %g%s", w.about, q.scale,
			fleetWorkers, blocks, blockSize, weight, cond)
		key := fmt.Sprintf("quality.conversation.blocks%d.x%g.%s.w%g.%s", blocks, q.scale, q.name(), weight, suffix)
		r.add(key+"ttft_mean", ms(q.ttft.mean), "ms", c)
		r.add(key+"hit_rate_of_bound", 100*hit/inf, "%", c)
	}
	kv := func(blocks int, scale, weight float64) error {
		q, err := r.simulate(w, scoring.KV, scale, blocks, weight, 0)
		if err == nil {
			row(q, blocks, weight, 0)
		}
		return err
	}
	// kvFixed is kv with decode timed as the kvBlocks GPU.
	kvFixed := func(blocks int, scale float64) error {
		q, err := r.simulateFleet(w, scale, fleet.Config{Mode: scoring.KV, Worker: sim.WorkerConfig{TimingBlocks: kvBlocks}}, blocks, "kv, decode as one GPU")
		if err == nil {
			row(q, blocks, 1, kvBlocks)
		}
		return err
	}
	scale := set.runs[0].scale
	for _, q := range set.runs {
		if q.peer == "" && q.policy == "" && (q.mode == scoring.KV || q.mode == scoring.RoundRobin) {
			row(q, kvBlocks, 1, 0)
		}
	}
	for _, weight := range []float64{4, 8} {
		if err := kv(kvBlocks, scale, weight); err != nil {
			return err
		}
	}
	const more = 4 * kvBlocks
	_, loaded, err := r.loadPoint(w, scoring.RoundRobin, more)
	if err != nil {
		return err
	}
	row(loaded, more, 1, 0)
	for _, weight := range []float64{1, 4} {
		if err := kv(more, loaded.scale, weight); err != nil {
			return err
		}
	}
	if err := kvFixed(more, loaded.scale); err != nil {
		return err
	}
	const whole = 1 << 20 // 67 M tokens per worker: more than any worker is sent
	for _, weight := range []float64{1, 4, 8} {
		if err := kv(whole, scale, weight); err != nil {
			return err
		}
	}
	return kvFixed(whole, scale)
}

// loadSamples is the load sampling period of w's arrivals scaled by s: about 300 samples over
// the trace, for the per-worker load plot; none at trace speed (not plotted).
func loadSamples(w workload, s float64) time.Duration {
	if len(w.reqs) == 0 || s == 1 {
		return 0
	}
	return max(100*time.Millisecond, time.Duration(float64(w.reqs[len(w.reqs)-1].At)*s/300))
}

// dist is the mean and percentiles of a set of durations.
type dist struct{ mean, p50, p99, p999 time.Duration }

// summarize ignores zero durations (requests refused or never routed).
func summarize(ds []time.Duration) dist {
	v := make([]time.Duration, 0, len(ds))
	var sum time.Duration
	for _, d := range ds {
		if d > 0 {
			v = append(v, d)
			sum += d
		}
	}
	if len(v) == 0 {
		return dist{}
	}
	slices.Sort(v)
	at := func(q int) time.Duration { return v[min(len(v)-1, len(v)*q/1000)] }
	return dist{mean: sum / time.Duration(len(v)), p50: v[len(v)/2], p99: at(990), p999: at(999)}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
