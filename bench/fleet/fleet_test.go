package fleet

import (
	"reflect"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/scoring"
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
