package fleet

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

func smallWorkload() []trace.Request {
	cfg := trace.DefaultSynthetic()
	cfg.Duration = 20 * time.Second
	return trace.Synthetic(cfg)
}

func smallWorker() sim.WorkerConfig {
	return sim.WorkerConfig{Blocks: 2048, BlockSize: 16, MaxSeqs: 32, MaxBatchedTokens: 2048, Timing: sim.DefaultTiming()}
}

// TestDeterministic: the same seed and workload give the same numbers, request by request.
func TestDeterministic(t *testing.T) {
	reqs := smallWorkload()
	if len(reqs) < 50 {
		t.Fatalf("workload of %d requests", len(reqs))
	}
	cfg := Config{Workers: 4, Mode: scoring.KV, Worker: smallWorker(), Seed: 3, Sample: time.Second}
	a, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs differ:\n%+v\n%+v", summary(a), summary(b))
	}
	for i, d := range a.E2E {
		if d <= 0 || a.TTFT[i] <= 0 || a.TTFT[i] > d {
			t.Fatalf("request %d: ttft %v, e2e %v", i, a.TTFT[i], d)
		}
	}
	if a.RouteFailures != 0 || a.Requests != len(reqs) {
		t.Fatalf("%d route failures of %d", a.RouteFailures, a.Requests)
	}
}

// TestKVBeatsRoundRobinOnHits: on a shared-prefix workload, routing by cached prefix serves
// more prompt tokens from cache than cycling through the workers.
func TestKVBeatsRoundRobinOnHits(t *testing.T) {
	reqs := smallWorkload()
	kv, err := Run(Config{Workers: 4, Mode: scoring.KV, Worker: smallWorker(), Seed: 1}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := Run(Config{Workers: 4, Mode: scoring.RoundRobin, Worker: smallWorker(), Seed: 1}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if !(kv.HitRate() > rr.HitRate()) {
		t.Fatalf("hit rate kv %.3f, round robin %.3f", kv.HitRate(), rr.HitRate())
	}
	t.Logf("hit rate kv %.3f, round robin %.3f; imbalance kv %.2f", kv.HitRate(), rr.HitRate(), kv.Imbalance())
}

func summary(r *Result) string {
	var s time.Duration
	for _, d := range r.TTFT {
		s += d
	}
	return "mean ttft " + (s / time.Duration(max(len(r.TTFT), 1))).String()
}

// recorder is a caller's Router: kvrouterd's router in process, configured as Run configures
// its own, counting the calls it gets.
type recorder struct {
	local
	registered []uint64
	modes      map[wire.Mode]int
	events     int
}

func (r *recorder) Register(g router.Registration) error {
	r.registered = append(r.registered, g.ID)
	return r.local.Register(g)
}

func (r *recorder) Route(req *wire.RouteRequest, resp *wire.RouteResponse) error {
	if !req.HasWeight || req.Weight != 1 || !req.HasTemperature || req.Temperature != 0 {
		return fmt.Errorf("request without the simulation's settings: %+v", req)
	}
	r.modes[req.Mode]++
	return r.local.Route(req, resp)
}

func (r *recorder) Events(b *wire.EventBatch) error {
	r.events += len(b.Events)
	return r.local.Events(b)
}

// TestCallersRouter: a Router of the caller's gets every call of the default one, with the
// simulation's settings on each request, and the same router behind both interfaces gives the
// same results; pacing does not change them either.
func TestCallersRouter(t *testing.T) {
	reqs := smallWorkload()
	cfg := Config{Workers: 4, Mode: scoring.KV, Worker: smallWorker(), Seed: 3}
	want, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	r := router.New(router.Config{BlockSize: 16, Mode: scoring.KV, RequestExpiry: 24 * time.Hour, Shards: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Rand: rand.New(rand.NewPCG(cfg.Seed, 0x666c656574))})
	defer r.Close()
	rec := &recorder{local: local{r: r}, modes: map[wire.Mode]int{}}
	cfg.Router = rec
	cfg.Pace = 400 // the workload's 20 s in about 50 ms
	got, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.registered, []uint64{1, 2, 3, 4}) || rec.modes[wire.ModeKV] != len(reqs) || rec.events == 0 {
		t.Fatalf("registered %v, routed %v, %d events", rec.registered, rec.modes, rec.events)
	}
	if len(got.RouteLatency) != len(reqs) || want.RouteLatency != nil {
		t.Fatalf("%d route latencies with a caller's router, %d without", len(got.RouteLatency), len(want.RouteLatency))
	}
	got.RouteLatency, got.MaxLag = nil, 0
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("results differ:\n%+v\n%+v", summary(want), summary(got))
	}
}

// TestPace: a paced run does not end before its trace's span of wall time at that pace.
func TestPace(t *testing.T) {
	reqs := smallWorkload()
	span := reqs[len(reqs)-1].At - reqs[0].At
	start := time.Now()
	res, err := Run(Config{Workers: 4, Mode: scoring.KV, Worker: smallWorker(), Seed: 1, Pace: 400}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < span/400 {
		t.Fatalf("a %v trace at pace 400 took %v", span, took)
	}
	if res.MaxLag < 0 {
		t.Fatalf("max lag %v", res.MaxLag)
	}
}

// saturated is a minute of the small workload's kind with arrivals 50× closer: more than 4
// small workers can prefill, so the router queue fills.
func saturated() []trace.Request {
	cfg := trace.DefaultSynthetic()
	cfg.Duration = time.Minute
	return trace.Scale(trace.Synthetic(cfg), 0.02)
}

// TestQueueSaturated: with the router queue on and the workers saturated, requests wait, every
// one is admitted and served (its TTFT from arrival, the wait included), and the router holds
// no booking at the end; the run is deterministic.
func TestQueueSaturated(t *testing.T) {
	reqs := saturated()
	for _, policy := range []router.QueuePolicy{router.FCFS, router.WSPT, router.LCFS} {
		t.Run(policy.String(), func(t *testing.T) {
			cfg := Config{Workers: 4, Mode: scoring.KV, Worker: smallWorker(), Seed: 1,
				Queue:    &router.QueueConfig{Threshold: 0.5, Policy: policy, MaxRequests: 1 << 20, MaxWait: time.Hour},
				Priority: func(i int) float64 { return float64(i % 3) }}
			res, err := Run(cfg, reqs)
			if err != nil {
				t.Fatal(err)
			}
			if res.Queued < len(reqs)/4 || res.MaxQueued < 10 {
				t.Fatalf("%d of %d requests queued, at most %d at once: not saturated", res.Queued, len(reqs), res.MaxQueued)
			}
			if res.RouteFailures != 0 || res.QueueTimedOut != 0 || res.Refused != 0 || res.CallErrors != 0 {
				t.Fatalf("%d route failures (%s), %d timed out, %d refused, %d call errors", res.RouteFailures, res.RouteErr,
					res.QueueTimedOut, res.Refused, res.CallErrors)
			}
			if res.Booked != 0 {
				t.Fatalf("%d requests still booked at the end", res.Booked)
			}
			waited := 0
			for i, d := range res.E2E {
				if d <= 0 || res.TTFT[i] <= 0 || res.TTFT[i] > d {
					t.Fatalf("request %d: ttft %v, e2e %v", i, res.TTFT[i], d)
				}
				if w := res.QueueWait[i]; w > 0 {
					waited++
					if res.TTFT[i] <= w {
						t.Fatalf("request %d: ttft %v within its wait %v", i, res.TTFT[i], w)
					}
				}
			}
			if waited == 0 || waited > res.Queued {
				t.Fatalf("%d requests with a wait, %d queued", waited, res.Queued)
			}
			again, err := Run(cfg, reqs)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(res, again) {
				t.Fatalf("two runs differ:\n%+v\n%+v", summary(res), summary(again))
			}
			t.Logf("%d of %d queued, at most %d at once; %s", res.Queued, len(reqs), res.MaxQueued, summary(res))
		})
	}
}

// TestQueueMaxWait: a request whose longest wait passes in the queue is refused at that
// simulated time, as the daemon refuses it, and leaves nothing booked.
func TestQueueMaxWait(t *testing.T) {
	reqs := saturated()
	res, err := Run(Config{Workers: 4, Mode: scoring.KV, Worker: smallWorker(), Seed: 1,
		Queue: &router.QueueConfig{Threshold: 0, MaxWait: 50 * time.Millisecond}}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if res.QueueTimedOut == 0 || res.Booked != 0 {
		t.Fatalf("%d timed out, %d left booked", res.QueueTimedOut, res.Booked)
	}
	served := 0
	for i, d := range res.TTFT {
		if d > 0 {
			served++
			if res.QueueWait[i] > 50*time.Millisecond {
				t.Fatalf("request %d admitted after %v", i, res.QueueWait[i])
			}
		}
	}
	if served+res.QueueTimedOut+res.RouteFailures != len(reqs) {
		t.Fatalf("%d served + %d timed out + %d failed ≠ %d requests", served, res.QueueTimedOut, res.RouteFailures, len(reqs))
	}
}

// noQueue is a Router without a queue.
type noQueue struct{ Router }

// TestQueueNeedsQueuer: the queue needs a router that has one.
func TestQueueNeedsQueuer(t *testing.T) {
	r := router.New(router.Config{BlockSize: 16, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer r.Close()
	_, err := Run(Config{Workers: 1, Worker: smallWorker(), Router: noQueue{&local{r: r}}, Queue: &router.QueueConfig{}}, smallWorkload())
	if err == nil {
		t.Fatal("no error")
	}
}

// TestTransferTime: the transfer's cost, worked by hand.
func TestTransferTime(t *testing.T) {
	// 8,192 tokens × 131,072 B = 1,073,741,824 B; / 50e9 B/s = 21.47483648 ms; + 1 ms.
	if got := DefaultTransfer().Time(8192); got != 22474836*time.Nanosecond {
		t.Errorf("default transfer of 8192 tokens: %v", got)
	}
	if got := (Transfer{}).Time(8192); got != DefaultTransfer().Time(8192) {
		t.Errorf("zero Transfer %v: want the defaults", got)
	}
	// 1,000 tokens × 100 B / 1e9 B/s = 100 µs, no latency.
	if got := (Transfer{BytesPerToken: 100, Bandwidth: 1e9, Latency: -1}).Time(1000); got != 100*time.Microsecond {
		t.Errorf("transfer %v, want 100µs", got)
	}
	if got := (Transfer{BytesPerToken: 100, Bandwidth: 1e9, Latency: 3 * time.Millisecond}).Time(0); got != 3*time.Millisecond {
		t.Errorf("empty transfer %v, want the latency", got)
	}
}

// TestDisaggregated: every request runs its prompt on a prefill worker, moves its KV at the
// transfer's cost and decodes on a decode worker; the router's bookings all end released.
func TestDisaggregated(t *testing.T) {
	reqs := smallWorkload()
	cfg := Config{Workers: 4, PrefillWorkers: 2, Mode: scoring.KV, Worker: smallWorker(), Seed: 3}
	res, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Split != len(reqs) || res.RouteFailures != 0 || res.CallErrors != 0 || res.Refused != 0 || res.Booked != 0 {
		t.Fatalf("split %d of %d, %d route failures (%s), %d call errors, %d refused, %d left booked",
			res.Split, len(reqs), res.RouteFailures, res.RouteErr, res.CallErrors, res.Refused, res.Booked)
	}
	// Each request is counted once on a prefill worker (1, 2) and once on a decode one (3, 4).
	if p, d := res.PerWorker[0]+res.PerWorker[1], res.PerWorker[2]+res.PerWorker[3]; p != len(reqs) || d != len(reqs) {
		t.Errorf("prefill stages %d, decode stages %d, want %d each (%v)", p, d, len(reqs), res.PerWorker)
	}
	var xfer time.Duration
	for i, q := range reqs {
		tt := DefaultTransfer().Time(len(q.Tokens))
		xfer += tt
		// Prefill (at least its fixed 16.5 ms), the transfer, then the last prompt token.
		if res.TTFT[i] < tt+16*time.Millisecond || res.E2E[i] < res.TTFT[i] {
			t.Fatalf("request %d: ttft %v, e2e %v, transfer %v", i, res.TTFT[i], res.E2E[i], tt)
		}
	}
	if res.TransferTime != xfer {
		t.Errorf("transfer time %v, want %v", res.TransferTime, xfer)
	}
	if res.HitRate() <= 0 {
		t.Errorf("no prefix hits on the prefill workers")
	}

	// Conditional disaggregation: isl_bounding keeps short or well-cached prompts whole.
	cfg.Disagg = &router.DisaggConfig{Policy: router.DisaggISLBounding}
	cond, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if cond.Split == 0 || cond.Split == len(reqs) || cond.CallErrors != 0 || cond.Booked != 0 || cond.RouteFailures != 0 {
		t.Errorf("conditional: split %d of %d, %d call errors, %d left booked", cond.Split, len(reqs), cond.CallErrors, cond.Booked)
	}
	if cond.PerWorker[0]+cond.PerWorker[1] != cond.Split {
		t.Errorf("conditional: %v, %d split: a prefill worker served a request whole", cond.PerWorker, cond.Split)
	}
	t.Logf("disaggregated: ttft %s, hit %.3f; conditional: %d of %d split, ttft %s", summary(res), res.HitRate(),
		cond.Split, len(reqs), summary(cond))
}

// TestEventDelay: the router gets every batch EventDelay after the step that produced it, in
// the order the workers published them. Round robin routes without the index, so the runs
// differ only in when the events arrive.
func TestEventDelay(t *testing.T) {
	reqs := smallWorkload()
	type got struct {
		at     time.Duration
		worker uint64
		first  uint64
		n      int
	}
	run := func(delay time.Duration) []got {
		var gs []got
		cfg := Config{Workers: 4, Mode: scoring.RoundRobin, Worker: smallWorker(), Seed: 3, EventDelay: delay,
			OnEvents: func(at time.Duration, worker uint64, evs []kvevent.Event) {
				gs = append(gs, got{at, worker, evs[0].ID, len(evs)})
			}}
		if _, err := Run(cfg, reqs); err != nil {
			t.Fatal(err)
		}
		return gs
	}
	const delay = 40 * time.Millisecond
	now, late := run(0), run(delay)
	if len(now) == 0 || len(now) != len(late) {
		t.Fatalf("%d batches at once, %d delayed", len(now), len(late))
	}
	next := map[uint64]uint64{}
	for i := range now {
		want := now[i]
		want.at += delay
		if late[i] != want {
			t.Fatalf("batch %d: %+v, want %+v", i, late[i], want)
		}
		if late[i].first != next[late[i].worker]+1 {
			t.Fatalf("worker %d: batch from event %d after %d", late[i].worker, late[i].first, next[late[i].worker])
		}
		next[late[i].worker] += uint64(late[i].n)
	}
}

// TestHostTierFleet: with a host tier, evicted prefixes come back as reloads, the router takes
// the host tier's events without complaint, and crediting them changes where requests go.
func TestHostTierFleet(t *testing.T) {
	g := trace.DefaultSynthetic()
	g.Duration = time.Minute
	reqs := trace.Synthetic(g)
	wc := smallWorker()
	wc.Blocks = 256 // small enough to evict the workload's prefixes
	base := Config{Workers: 4, Mode: scoring.KV, Worker: wc, Seed: 3}
	none, err := Run(base, reqs)
	if err != nil {
		t.Fatal(err)
	}
	wc.HostBlocks = 4 * wc.Blocks
	host := base
	host.Worker = wc
	host.TierCredit = &scoring.TierCredit{}
	indexed, err := Run(host, reqs)
	if err != nil {
		t.Fatal(err)
	}
	host.TierCredit = &scoring.TierCredit{Host: 0.75}
	credited, err := Run(host, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Result{none, indexed, credited} {
		if r.CallErrors != 0 || r.RouteFailures != 0 || r.Booked != 0 {
			t.Fatalf("%d call errors, %d route failures, %d left booked", r.CallErrors, r.RouteFailures, r.Booked)
		}
	}
	if none.HostTokens != 0 || indexed.HostTokens == 0 || credited.HostTokens == 0 {
		t.Errorf("host tokens: none %d, indexed %d, credited %d", none.HostTokens, indexed.HostTokens, credited.HostTokens)
	}
	if reflect.DeepEqual(indexed.PerWorker, credited.PerWorker) && reflect.DeepEqual(indexed.TTFT, credited.TTFT) {
		t.Errorf("crediting the host tier changed nothing")
	}
	t.Logf("hit device+host: none %.3f, indexed %.3f+%.3f, credited %.3f+%.3f", none.HitRate(), indexed.HitRate(),
		indexed.HostHitRate(), credited.HitRate(), credited.HostHitRate())
}

// TestDeterministicFeatures: a disaggregated fleet with host tiers, delayed events and
// predict-on-route gives the same numbers for the same seed.
func TestDeterministicFeatures(t *testing.T) {
	reqs := smallWorkload()
	wc := smallWorker()
	wc.Blocks, wc.HostBlocks = 512, 2048
	cfg := Config{Workers: 4, PrefillWorkers: 1, Mode: scoring.KV, Worker: wc, Seed: 5, EventDelay: 30 * time.Millisecond,
		PredictedTTL: 2 * time.Second, Disagg: &router.DisaggConfig{Policy: router.DisaggISLBounding}}
	a, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs differ:\n%+v\n%+v", summary(a), summary(b))
	}
	if a.Split == 0 || a.HostTokens == 0 || a.CallErrors != 0 || a.Booked != 0 {
		t.Errorf("split %d, host tokens %d, %d call errors, %d left booked", a.Split, a.HostTokens, a.CallErrors, a.Booked)
	}
}

// TestPredictOnRoute: on a burst of siblings whose prefix no worker has published yet, the
// router's predict-on-route sends more of them where the prefix is being computed.
func TestPredictOnRoute(t *testing.T) {
	b := trace.DefaultBurst()
	b.Duration = time.Minute
	reqs := trace.Scale(trace.Burst(b), 0.05)
	cfg := Config{Workers: 8, Mode: scoring.KV, Seed: 1, EventDelay: 50 * time.Millisecond}
	off, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	cfg.PredictedTTL = 5 * time.Second
	on, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if !(on.HitRate() > off.HitRate()) || on.CallErrors != 0 || on.Booked != 0 {
		t.Errorf("hit rate off %.3f, on %.3f; %d call errors, %d left booked", off.HitRate(), on.HitRate(), on.CallErrors, on.Booked)
	}
	t.Logf("hit rate off %.3f, on %.3f; %s → %s", off.HitRate(), on.HitRate(), summary(off), summary(on))
}

// TestClosedLoop: replayed closed-loop, a session's next turn never arrives before its previous
// turn's answer has ended, and comes its trace gap after it; requests without a session keep
// their trace times. The same trace open-loop sends turns before the answers they follow.
func TestClosedLoop(t *testing.T) {
	reqs := smallWorkload()
	// Squeeze the trace tenfold: turns then come faster than answers.
	reqs = trace.Scale(reqs, 0.1)
	cfg := Config{Workers: 2, Mode: scoring.KV, Worker: smallWorker(), Seed: 3}
	open, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClosedLoop = true
	closed, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	prev := map[uint64]int{}
	early, later := 0, 0
	for i, q := range reqs {
		if closed.E2E[i] <= 0 {
			t.Fatalf("request %d never ended closed-loop", i)
		}
		p, ok := prev[q.Session]
		if q.Session == 0 || !ok {
			if closed.Arrival[i] != q.At {
				t.Errorf("request %d (a first turn or without a session) arrived at %v, its trace time %v", i, closed.Arrival[i], q.At)
			}
		} else {
			later++
			end := closed.Arrival[p] + closed.E2E[p]
			if want := end + (q.At - reqs[p].At); closed.Arrival[i] != want {
				t.Fatalf("turn %d of session %d arrived at %v; its previous turn %d ended at %v, think %v: want %v",
					i, q.Session, closed.Arrival[i], p, end, q.At-reqs[p].At, want)
			}
			if open.Arrival[i] < open.Arrival[p]+open.E2E[p] {
				early++
			}
		}
		if q.Session != 0 {
			prev[q.Session] = i
		}
	}
	if later == 0 || closed.LaterTurns != later || open.LaterTurns != 0 {
		t.Fatalf("%d later turns (result says %d closed, %d open)", later, closed.LaterTurns, open.LaterTurns)
	}
	if early == 0 {
		t.Fatal("open-loop, no turn came before its previous answer ended: the test shows nothing")
	}
	t.Logf("%d later turns; open-loop %d of them arrived before the answer they follow", later, early)
}
