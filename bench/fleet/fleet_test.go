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
