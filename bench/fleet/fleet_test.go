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
