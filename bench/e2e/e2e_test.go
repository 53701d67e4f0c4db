package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// workload is a few seconds of shared-prefix traffic: sessions, system prompts, documents.
func workload() []trace.Request {
	cfg := trace.DefaultSynthetic()
	cfg.Duration, cfg.Rate, cfg.Output = 10*time.Second, 8, 32
	return trace.Synthetic(cfg)
}

func fleetConfig() fleet.Config {
	return fleet.Config{
		Workers: 4, Mode: scoring.KV, Seed: 1,
		Worker: sim.WorkerConfig{Blocks: 2048, BlockSize: 16, MaxSeqs: 32, MaxBatchedTokens: 2048, Timing: sim.DefaultTiming()},
		// Fast enough for a test, slow enough that the daemon mostly keeps up; nothing below
		// depends on whether it does.
		Pace: 100,
	}
}

// checkRouted: every request was routed and served, with no failed call.
func checkRouted(t *testing.T, res *fleet.Result, n int) {
	t.Helper()
	if res.Requests != n || res.RouteFailures != 0 || res.CallErrors != 0 || res.Refused != 0 {
		t.Fatalf("%d requests of %d: %d route failures (%s), %d call errors, %d refused",
			res.Requests, n, res.RouteFailures, res.RouteErr, res.CallErrors, res.Refused)
	}
	sum := 0
	for _, k := range res.PerWorker {
		sum += k
	}
	if sum != n {
		t.Fatalf("%d requests routed to workers, want %d", sum, n)
	}
	for i, d := range res.E2E {
		if d <= 0 || res.RouteLatency[i] <= 0 {
			t.Fatalf("request %d: e2e %v, route latency %v", i, d, res.RouteLatency[i])
		}
	}
}

// TestDaemonIndexMatchesWorkers: driven over HTTP and NATS, the daemon's index ends up holding
// exactly the blocks the simulated workers hold, and the workers leave when the Remote closes.
func TestDaemonIndexMatchesWorkers(t *testing.T) {
	d, err := StartDaemon(DaemonConfig{Router: DaemonRouter(fleetConfig()), Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rem, err := Dial(d.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer rem.Close()
	// want replays the events the workers published: engine hash → held, per worker.
	want := map[uint64]map[uint64]bool{}
	cfg := fleetConfig()
	cfg.Router = rem
	cfg.OnEvents = func(_ time.Duration, w uint64, evs []kvevent.Event) {
		if want[w] == nil {
			want[w] = map[uint64]bool{}
		}
		for _, e := range evs {
			for _, h := range e.Hashes {
				switch e.Kind {
				case kvevent.Stored:
					want[w][h] = true
				case kvevent.Removed:
					delete(want[w], h)
				default:
					t.Errorf("worker %d published a %v event", w, e.Kind)
				}
			}
		}
	}
	reqs := workload()
	res, err := fleet.Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	checkRouted(t, res, len(reqs))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rem.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if st := rem.Stats(); st.Errors != 0 || st.Batches == 0 {
		t.Fatalf("published %+v", st)
	}
	if cs := d.Consumer.Stats(); cs.Events != rem.Stats().Events || cs.Gaps != 0 {
		t.Fatalf("the consumer handed on %d events of %d published, %d gaps, rejected %v",
			cs.Events, rem.Stats().Events, cs.Gaps, cs.Rejected)
	}
	for i, n := range res.Blocks {
		id := uint64(i + 1)
		got := d.Router.DumpWorker(id, nil)
		if len(got) != n || len(want[id]) != n {
			t.Fatalf("worker %d holds %d blocks; the daemon's index has %d, its events say %d", id, n, len(got), len(want[id]))
		}
		for _, b := range got {
			if !want[id][b.Engine] {
				t.Fatalf("worker %d: the daemon holds block %x, the worker does not", id, b.Engine)
			}
		}
	}
	if err := rem.Close(); err != nil {
		t.Fatal(err)
	}
	if ws := d.Router.Workers(); len(ws) != 0 {
		t.Fatalf("%d workers left registered after Close", len(ws))
	}
}

// TestRunInProcessDaemon: Run with no target starts its own daemon and routes the whole
// workload through it, with cache hits, and the daemon catches up with every event.
func TestRunInProcessDaemon(t *testing.T) {
	reqs := workload()
	res, err := Run(Config{Fleet: fleetConfig()}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	checkRouted(t, &res.Result, len(reqs))
	if res.HitRate() <= 0 {
		t.Fatalf("hit rate %v", res.HitRate())
	}
	if res.Published.Errors != 0 || res.Published.Events == 0 {
		t.Fatalf("published %+v", res.Published)
	}
	t.Logf("%d requests: hit rate %.3f, max lag %v, drain %v", res.Requests, res.HitRate(), res.MaxLag, res.Drain)
}

// TestDialRefusesBadTarget: a target without a daemon behind it is refused at Dial, with the
// reason, rather than failing every call of a run.
func TestDialRefusesBadTarget(t *testing.T) {
	if _, err := Dial(Target{Addr: "127.0.0.1:1"}); err == nil {
		t.Fatal("no NATS URL accepted")
	}
	if _, err := Dial(Target{Addr: "127.0.0.1:1", NATSURL: "nats://127.0.0.1:1", Timeout: time.Second}); err == nil {
		t.Fatal("no daemon accepted")
	}
}
