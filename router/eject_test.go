package router

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/wire"
)

// ejectFleet is a Router on a clock the test moves (now, in nanoseconds), with workers 1..n of
// model "m" (block size 16); worker i > 1 holds i-1 blocks of a prompt of its own, worker 1
// none: fresh requests tie on cost, and worker 1 wins the tie ("fewest blocks").
func ejectFleet(t testing.TB, n int, cfg Config) (*Router, *atomic.Int64) {
	t.Helper()
	now := new(atomic.Int64)
	now.Store(int64(time.Hour))
	cfg.Now = now.Load
	r := disaggFleet(t, cfg, make([]Role, n)...)
	for id := 2; id <= n; id++ {
		store(t, r, uint64(id), seq(id*1_000_000, 16*(id-1)), id-1)
	}
	return r, now
}

// fresh is a request for a prompt no worker holds.
func fresh(id string, i int) *wire.RouteRequest {
	return &wire.RouteRequest{RequestID: id, Model: "m", Tokens: seq(50_000_000+i*10_000, 64)}
}

func routeOne(t testing.TB, r *Router, req *wire.RouteRequest) uint64 {
	t.Helper()
	var resp wire.RouteResponse
	if err := r.Route(req, &resp); err != nil {
		t.Fatal(err)
	}
	return resp.Worker
}

func health(t testing.TB, r *Router, id uint64, rank uint32) WorkerInfo {
	t.Helper()
	for _, w := range r.Workers() {
		if w.ID == id && w.Rank == rank {
			return w
		}
	}
	t.Fatalf("worker %d rank %d not listed", id, rank)
	return WorkerInfo{}
}

// serve routes fresh request i as the front door does: to the worker chosen; when that is
// down, it reports the failure, frees the booking and routes again among the others. It
// returns the workers tried, in order.
func serve(t testing.TB, r *Router, i int, down map[uint64]bool) []uint64 {
	t.Helper()
	id := fmt.Sprintf("req-%d", i)
	req := fresh(id, i)
	var tried []uint64
	for range 4 {
		w := routeOne(t, r, req)
		tried = append(tried, w)
		if !down[w] {
			r.UpstreamOK(w, 0)
			return tried
		}
		r.UpstreamFailed(w, 0, "connect")
		if err := r.Complete(id); err != nil {
			t.Fatal(err)
		}
		req.Allowed = nil
		for id := uint64(1); id <= 4; id++ {
			if id != w {
				req.Allowed = append(req.Allowed, id)
			}
		}
	}
	t.Fatalf("request %d: tried %v", i, tried)
	return nil
}

// TestEjectDownWorkerSpread is the case: worker 1 refuses connections and holds
// nothing. Without ejection it is tried first by every fresh request; with it, once, and the
// requests moved off it spread over the others by their cost.
func TestEjectDownWorkerSpread(t *testing.T) {
	down := map[uint64]bool{1: true}
	t.Run("off", func(t *testing.T) {
		r, _ := ejectFleet(t, 4, Config{Eject: EjectConfig{Off: true}})
		for i := range 8 {
			if tried := serve(t, r, i, down); tried[0] != 1 {
				t.Fatalf("request %d tried %v: without ejection the empty worker wins the tie", i, tried)
			}
		}
	})
	r, _ := ejectFleet(t, 4, Config{})
	first := 0
	served := map[uint64]int{}
	for i := range 8 {
		tried := serve(t, r, i, down)
		if tried[0] == 1 {
			first++
		}
		served[tried[len(tried)-1]]++
	}
	if first != 1 {
		t.Fatalf("the down worker was tried first by %d requests, want 1 (then ejected)", first)
	}
	if len(served) != 3 {
		t.Fatalf("served by %v: want the 8 requests spread over workers 2, 3 and 4", served)
	}
	for w, n := range served {
		if n > 4 {
			t.Fatalf("worker %d served %d of 8 requests (%v)", w, n, served)
		}
	}
	h := health(t, r, 1, 0)
	if h.Health != HealthEjected || h.Ejections != 1 || h.LastFailure != "connect" || h.EjectedUntil.IsZero() {
		t.Fatalf("worker 1 listed as %+v", h)
	}
	if st := r.HealthStats(); st.Ejected != 1 || st.Ejections[reasonConnect] != 1 || st.Failures[reasonConnect] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestEjectConsecutive: failures other than refused connections eject at the third in a row;
// a success between them starts the count again.
func TestEjectConsecutive(t *testing.T) {
	r, _ := ejectFleet(t, 3, Config{})
	r.UpstreamFailed(1, 0, "5xx")
	r.UpstreamFailed(1, 0, "reset")
	if h := health(t, r, 1, 0); h.Health != HealthSuspect || h.ConsecutiveFailures != 2 || h.LastFailure != "reset" {
		t.Fatalf("after two failures: %+v", h)
	}
	r.UpstreamOK(1, 0)
	if h := health(t, r, 1, 0); h.Health != HealthOK || h.ConsecutiveFailures != 0 || h.LastFailure != "" {
		t.Fatalf("after a success: %+v", h)
	}
	if !r.fastPath("m") {
		t.Fatal("the model's routes stay off the fast path with every rank healthy")
	}
	for range 2 {
		r.UpstreamFailed(1, 0, "timeout")
	}
	if h := health(t, r, 1, 0); h.Health != HealthSuspect {
		t.Fatalf("two failures after the success: %+v", h)
	}
	r.UpstreamFailed(1, 0, "tokenize")
	if h := health(t, r, 1, 0); h.Health != HealthEjected {
		t.Fatalf("three failures in a row: %+v", h)
	}
	for i := range 20 {
		if w := routeOne(t, r, fresh(fmt.Sprint("r", i), i)); w == 1 {
			t.Fatal("an ejected worker was routed to")
		}
	}
	// An unknown worker or rank, and an unknown reason, are taken quietly.
	r.UpstreamFailed(99, 0, "connect")
	r.UpstreamFailed(2, 7, "5xx")
	r.UpstreamOK(99, 0)
	r.UpstreamFailed(2, 0, "gremlins")
	if st := r.HealthStats(); st.Failures[reasonOther] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestEjectBackoff: without a prober an ejection ends with its time, BaseTime × the times
// ejected, capped at MaxTime; time in routing decays the multiplier.
func TestEjectBackoff(t *testing.T) {
	const base = 10 * time.Second
	r, now := ejectFleet(t, 2, Config{Eject: EjectConfig{BaseTime: base, MaxTime: 35 * time.Second}})
	out := func() bool { return r.rankOut(r.model("m").list.Load().ws[0]) }
	advance := func(d time.Duration) { now.Add(int64(d)) }
	for i, want := range []time.Duration{base, 2 * base, 3 * base, 35 * time.Second, 35 * time.Second} {
		r.UpstreamFailed(1, 0, "connect")
		if !out() {
			t.Fatalf("ejection %d: not out", i+1)
		}
		if h := health(t, r, 1, 0); h.Ejections != i+1 {
			t.Fatalf("ejection %d: listed %+v", i+1, h)
		}
		advance(want - time.Millisecond)
		if !out() {
			t.Fatalf("ejection %d: back before %v", i+1, want)
		}
		advance(time.Millisecond)
		if out() {
			t.Fatalf("ejection %d: still out after %v", i+1, want)
		}
		if h := health(t, r, 1, 0); h.Health != HealthSuspect {
			t.Fatalf("back after its time: %+v, want suspect until it answers", h)
		}
	}
	// Five ejections; 3 × BaseTime back in routing takes the multiplier down by three.
	r.UpstreamOK(1, 0)
	advance(3 * base)
	r.UpstreamFailed(1, 0, "connect")
	if h := health(t, r, 1, 0); h.Ejections != 3 {
		t.Fatalf("after 3 base times in routing: multiplier %d, want 5 - 3 + 1", h.Ejections)
	}
	// A failure of a rank out already (a request reached it in panic mode) does not extend it.
	until := r.model("m").list.Load().ws[0].health.out.Load()
	r.UpstreamFailed(1, 0, "connect")
	if got := r.model("m").list.Load().ws[0].health.out.Load(); got != until {
		t.Fatal("a failure while out extended the ejection")
	}
}

// TestEjectProbe: with a prober attached an ejected rank stays out past its time until the
// probe's verdict: a failed probe ejects it for longer, a passed one brings it back, suspect
// until it answers; a verdict later than the grace lets it back by itself.
func TestEjectProbe(t *testing.T) {
	const base, grace = 10 * time.Second, 5 * time.Second
	r, now := ejectFleet(t, 3, Config{Eject: EjectConfig{BaseTime: base}})
	if err := r.Register(Registration{ID: 1, Model: "m", HTTPEndpoint: "http://w1:8000"}); err != nil {
		t.Fatal(err)
	}
	r.SetProber(grace)
	w := r.model("m").list.Load().ws[0]
	advance := func(d time.Duration) { now.Add(int64(d)) }
	r.UpstreamFailed(1, 0, "connect")
	if p := r.DueProbes(nil); len(p) != 0 {
		t.Fatalf("probes due before the ejection's time: %v", p)
	}
	advance(base)
	p := r.DueProbes(nil)
	if len(p) != 1 || p[0] != (EjectedRank{Worker: 1, Model: "m", Endpoint: "http://w1:8000"}) {
		t.Fatalf("due probes %v", p)
	}
	if !r.rankOut(w) {
		t.Fatal("back before its probe's verdict")
	}
	r.ProbeFailed(1, 0)
	if p := r.DueProbes(nil); len(p) != 0 || !r.rankOut(w) {
		t.Fatalf("after a failed probe: due %v, out %v", p, r.rankOut(w))
	}
	if h := health(t, r, 1, 0); h.Ejections != 2 || h.LastFailure != "probe" {
		t.Fatalf("after a failed probe: %+v", h)
	}
	advance(2 * base)
	if len(r.DueProbes(nil)) != 1 {
		t.Fatal("no probe due after the second ejection's time")
	}
	r.ProbeOK(1, 0)
	if r.rankOut(w) || health(t, r, 1, 0).Health != HealthSuspect {
		t.Fatalf("after a passed probe: out %v, %+v", r.rankOut(w), health(t, r, 1, 0))
	}
	if len(r.DueProbes(nil)) != 0 {
		t.Fatal("a probe due for a rank back in routing")
	}
	r.ProbeFailed(1, 0) // a late verdict on a rank back in routing changes nothing
	if r.rankOut(w) {
		t.Fatal("a failed probe of a rank in routing ejected it")
	}
	r.UpstreamOK(1, 0)
	if h := health(t, r, 1, 0); h.Health != HealthOK {
		t.Fatalf("after an answer: %+v", h)
	}
	// No verdict: back at its time plus the grace.
	r.UpstreamFailed(1, 0, "connect")
	h := health(t, r, 1, 0)
	if h.Ejections != 3 {
		t.Fatalf("ejected at once after coming back: %+v, want the multiplier at 3", h)
	}
	advance(3*base + grace - time.Millisecond)
	if !r.rankOut(w) {
		t.Fatal("back before its time and grace without a verdict")
	}
	advance(time.Millisecond)
	if r.rankOut(w) {
		t.Fatal("still out after its time and grace without a verdict")
	}
	// The prober detached: a rank waiting for its verdict comes back at its time.
	r.UpstreamFailed(1, 0, "connect")
	advance(time.Duration(health(t, r, 1, 0).Ejections) * base)
	if !r.rankOut(w) {
		t.Fatal("back without a verdict within its grace")
	}
	r.SetProber(0)
	if r.rankOut(w) {
		t.Fatal("still out, its time up, with no prober to give a verdict")
	}
	// A worker without an HTTP endpoint is never due for a probe.
	r.UpstreamFailed(2, 0, "connect")
	advance(10 * base)
	for _, p := range r.DueProbes(nil) {
		if p.Worker == 2 {
			t.Fatal("a probe due for a worker without an endpoint")
		}
	}
}

// TestEjectPanic: when every candidate is out, the request is routed among them anyway, in
// every mode, and pinned requests reach their ejected worker.
func TestEjectPanic(t *testing.T) {
	r, _ := ejectFleet(t, 2, Config{Eject: EjectConfig{MaxPercent: 100}})
	r.UpstreamFailed(1, 0, "connect")
	r.UpstreamFailed(2, 0, "connect")
	if st := r.HealthStats(); st.Ejected != 2 {
		t.Fatalf("stats %+v", st)
	}
	for i, mode := range []wire.Mode{wire.ModeKV, wire.ModeRoundRobin, wire.ModeRandom, wire.ModeLeastLoaded, wire.ModePowerOfTwo, wire.ModeDeviceAwareWeighted} {
		req := fresh(fmt.Sprint("p", i), i)
		req.Mode = mode
		if w := routeOne(t, r, req); w != 1 && w != 2 {
			t.Fatalf("mode %v: worker %d", mode, w)
		}
	}
	req := fresh("pinned", 99)
	req.Mode, req.HasPinned, req.PinnedWorker = wire.ModeDirect, true, 2
	if w := routeOne(t, r, req); w != 2 {
		t.Fatalf("pinned to 2, routed to %d", w)
	}
	if st := r.HealthStats(); st.Panics != 7 {
		t.Fatalf("panics %d, want 7", st.Panics)
	}
	// A panic-mode request that is answered brings its worker back.
	r.UpstreamOK(2, 0)
	for i := range 10 {
		if w := routeOne(t, r, fresh(fmt.Sprint("after", i), 100+i)); w != 2 {
			t.Fatalf("routed to %d with worker 1 out", w)
		}
	}
}

// TestEjectMaxPercent: at most MaxPercent of a model's ranks are out at once; the first
// ejection is always allowed. A refused ejection leaves the rank suspect.
func TestEjectMaxPercent(t *testing.T) {
	r, _ := ejectFleet(t, 4, Config{})
	for _, id := range []uint64{1, 2, 3} {
		r.UpstreamFailed(id, 0, "connect")
	}
	want := map[uint64]string{1: HealthEjected, 2: HealthEjected, 3: HealthSuspect, 4: HealthOK}
	for id, h := range want {
		if got := health(t, r, id, 0).Health; got != h {
			t.Fatalf("worker %d: %s, want %s", id, got, h)
		}
	}
	if st := r.HealthStats(); st.Refused != 1 || st.Ejected != 2 {
		t.Fatalf("stats %+v", st)
	}
	r.UpstreamFailed(3, 0, "connect")
	if st := r.HealthStats(); st.Refused != 2 || st.Ejected != 2 {
		t.Fatalf("stats %+v after another refusal", st)
	}
	// Once a rank is back, the next failure of the refused one ejects it.
	r.UpstreamOK(1, 0)
	r.UpstreamFailed(3, 0, "connect")
	if h := health(t, r, 3, 0); h.Health != HealthEjected {
		t.Fatalf("worker 3 with room to go: %+v", h)
	}
	// One worker of two may always go, even at 10 %.
	r2, _ := ejectFleet(t, 2, Config{Eject: EjectConfig{MaxPercent: 10}})
	r2.UpstreamFailed(1, 0, "connect")
	r2.UpstreamFailed(2, 0, "connect")
	if st := r2.HealthStats(); st.Ejected != 1 || st.Refused != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSuspectLosesTies: a worker that failed (not ejected yet) never wins a tie until it
// answers; in kv mode and in least_loaded mode.
func TestSuspectLosesTies(t *testing.T) {
	for _, c := range []struct {
		mode    wire.Mode
		max     uint16   // a capped answer: scoreKV's other way to the choice
		allowed []uint64 // allowed workers: the general path
	}{{mode: wire.ModeKV}, {mode: wire.ModeKV, max: 2}, {mode: wire.ModeKV, allowed: []uint64{1, 2, 3}}, {mode: wire.ModeLeastLoaded}} {
		mode := c.mode
		r, _ := ejectFleet(t, 3, Config{})
		route := func(i int) uint64 {
			req := fresh(fmt.Sprint("t", i), i)
			req.Mode, req.MaxCandidates, req.Allowed = mode, c.max, c.allowed
			w := routeOne(t, r, req)
			_ = r.Complete(req.RequestID)
			return w
		}
		r.UpstreamFailed(1, 0, "5xx")
		if !r.fastPath("m") {
			t.Fatal("a suspect rank, none out, keeps the model's routes off the fast path")
		}
		for i := range 50 {
			if w := route(i); w == 1 {
				t.Fatalf("mode %v: the suspect worker won a tie", mode)
			}
		}
		// Worker 1 is suspect, but the cheapest by far: it is chosen.
		for i := range 3 {
			if err := book(t, r, 2, 0, fmt.Sprint("load2-", i), 64); err != nil {
				t.Fatal(err)
			}
			if err := book(t, r, 3, 0, fmt.Sprint("load3-", i), 64); err != nil {
				t.Fatal(err)
			}
		}
		if w := route(100); w != 1 {
			t.Fatalf("mode %v: routed to %d, want the suspect worker, the only idle one", mode, w)
		}
		for i := range 3 {
			_ = r.Complete(fmt.Sprint("load2-", i))
			_ = r.Complete(fmt.Sprint("load3-", i))
		}
		r.UpstreamOK(1, 0)
		won := false
		for i := range 50 {
			won = won || route(200+i) == 1
		}
		if !won {
			t.Fatalf("mode %v: the worker won no tie after it answered", mode)
		}
	}
}

// TestEjectEveryPath: an ejected rank is chosen by no path: every mode, a temperature, a
// capped answer, Select, disaggregated prefill and decode picks, a session bound to it.
func TestEjectEveryPath(t *testing.T) {
	r, _ := ejectFleet(t, 4, Config{Affinity: &AffinityConfig{TTL: time.Hour}})
	for i := range 2 { // the empty worker wins the first, and the session keeps it
		bound := fresh(fmt.Sprint("bound", i), i)
		bound.SessionID = "sess"
		if w := routeOne(t, r, bound); w != 1 {
			t.Fatalf("session request %d went to %d", i, w)
		}
	}
	_ = r.Complete("bound0")
	_ = r.Complete("bound1")
	r.UpstreamFailed(1, 0, "connect")
	for i := range 30 {
		for _, mode := range []wire.Mode{wire.ModeKV, wire.ModeRoundRobin, wire.ModeRandom, wire.ModeLeastLoaded, wire.ModePowerOfTwo, wire.ModeDeviceAwareWeighted} {
			req := fresh(fmt.Sprintf("m%d-%d", mode, i), i)
			req.Mode = mode
			switch i % 3 {
			case 1:
				req.HasTemperature, req.Temperature = true, 0.5
			case 2:
				req.MaxCandidates = 2
			}
			if w := routeOne(t, r, req); w == 1 {
				t.Fatalf("mode %v, request %d: routed to the ejected worker", mode, i)
			}
			_ = r.Complete(req.RequestID)
		}
		var sel Selection
		if err := r.Select(fresh("sel", i), SelectOptions{}, &sel); err != nil || sel.Chosen.Worker.ID == 1 {
			t.Fatalf("select: %v, chose %d", err, sel.Chosen.Worker.ID)
		}
		s := fresh(fmt.Sprint("s", i+1), i)
		s.SessionID = "sess"
		if w := routeOne(t, r, s); w == 1 {
			t.Fatal("a session kept its ejected worker")
		}
		_ = r.Complete(s.RequestID)
	}
	// A match still answers for every worker.
	var resp wire.RouteResponse
	if err := r.Match(fresh("", 0), &resp); err != nil || len(resp.Candidates) != 4 {
		t.Fatalf("match: %v, %d candidates", err, len(resp.Candidates))
	}

	d, _ := ejectFleet(t, 4, Config{})
	for id, role := range []Role{RolePrefill, RolePrefill, RoleDecode, RoleDecode} {
		if err := d.Register(Registration{ID: uint64(id + 1), Model: "m", Role: role}); err != nil {
			t.Fatal(err)
		}
	}
	d.UpstreamFailed(1, 0, "connect")
	d.UpstreamFailed(3, 0, "connect")
	for i := range 20 {
		req := disaggReq(fmt.Sprint("d", i), seq(70_000_000+i*1000, 64))
		var resp wire.RouteResponse
		if err := d.Route(req, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Worker == 3 || resp.Prefill && resp.PrefillWorker == 1 {
			t.Fatalf("disaggregated request %d: decode %d, prefill %v %d", i, resp.Worker, resp.Prefill, resp.PrefillWorker)
		}
	}
}

// TestEjectUnregister: a rank unregistered while marked leaves the counts, and its model's
// routes take the fast path again; a worker registered anew under its id starts healthy.
func TestEjectUnregister(t *testing.T) {
	r, _ := ejectFleet(t, 3, Config{})
	if err := r.Register(Registration{ID: 3, Model: "m", Ranks: []uint32{0, 1}}); err != nil {
		t.Fatal(err)
	}
	r.UpstreamFailed(1, 0, "connect")
	r.UpstreamFailed(3, 0, "connect") // every rank of worker 3: its endpoint refuses
	if h := health(t, r, 3, 1); h.Health != HealthSuspect {
		t.Fatalf("rank 1 of a worker refusing connections: %+v", h) // MaxPercent refused its ejection
	}
	if r.fastPath("m") {
		t.Fatal("fast path with ranks out")
	}
	if err := r.UnregisterRank(3, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Unregister(3); err != nil {
		t.Fatal(err)
	}
	if err := r.Unregister(1); err != nil {
		t.Fatal(err)
	}
	if r.health.marked.Load() != 0 || !r.fastPath("m") {
		t.Fatalf("marked %d after the marked ranks left", r.health.marked.Load())
	}
	if err := r.Register(Registration{ID: 1, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	if h := health(t, r, 1, 0); h.Health != HealthOK || h.Ejections != 0 {
		t.Fatalf("registered anew: %+v", h)
	}
}

// TestEjectRouteAllocs: with a rank out and another suspect, a route allocates nothing.
func TestEjectRouteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r, _ := ejectFleet(t, 8, Config{})
	r.UpstreamFailed(1, 0, "connect")
	r.UpstreamFailed(2, 0, "5xx")
	req := fresh("a", 1)
	var resp wire.RouteResponse
	allocs := testing.AllocsPerRun(200, func() {
		if err := r.Route(req, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Worker == 1 {
			t.Fatal("routed to the ejected worker")
		}
		_ = r.Complete("a")
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per route", allocs)
	}
	// The front door reports every answer: a healthy rank's costs a lookup, no lock, nothing
	// allocated.
	if allocs := testing.AllocsPerRun(200, func() { r.UpstreamOK(3, 0) }); allocs != 0 {
		t.Fatalf("%v allocations per UpstreamOK", allocs)
	}
}

// TestEjectConcurrent drives routes, reports, probes, listings and unregistrations at once
// (run with -race).
func TestEjectConcurrent(t *testing.T) {
	r, now := ejectFleet(t, 6, Config{Eject: EjectConfig{MaxPercent: 100}})
	r.SetProber(time.Second)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("g%d-%d", g, i)
				var resp wire.RouteResponse
				if err := r.Route(fresh(id, i%50), &resp); err == nil {
					if i%3 == 0 {
						r.UpstreamFailed(resp.Worker, 0, FailureReasons[i%numReasons])
					} else {
						r.UpstreamOK(resp.Worker, 0)
					}
					_ = r.Complete(id)
				}
			}
		})
	}
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			now.Add(int64(time.Second))
			for _, p := range r.DueProbes(nil) {
				if i%2 == 0 {
					r.ProbeOK(p.Worker, p.Rank)
				} else {
					r.ProbeFailed(p.Worker, p.Rank)
				}
			}
			_ = r.Workers()
			_ = r.HealthStats()
			if i%10 == 0 {
				_ = r.Unregister(6)
				_ = r.Register(Registration{ID: 6, Model: "m"})
			}
		}
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	// Every marked rank is counted once, by the model and by the router.
	var marked int32
	for _, w := range r.model("m").list.Load().ws {
		if w.health.suspect.Load() {
			marked++
		}
	}
	if m := r.model("m").health.marked.Load(); m != marked || r.health.marked.Load() != marked {
		t.Fatalf("marked: %d by the model, %d by the router, %d ranks suspect", m, r.health.marked.Load(), marked)
	}
}

// fastPath says whether the model's routes may take the fast path as far as health goes: no
// rank of it is out of routing.
func (r *Router) fastPath(model string) bool {
	m := r.model(model)
	return !r.ejecting(m) || r.cfg.Now() >= m.health.outMax.Load()
}

// TestEjectDecisionLog: at debug level the decision log names the ranks skipped as ejected and
// the suspect rank that lost a tie.
func TestEjectDecisionLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, _ := ejectFleet(t, 4, Config{Logger: log})
	r.UpstreamFailed(1, 0, "connect")
	r.UpstreamFailed(2, 0, "5xx")
	if !strings.Contains(buf.String(), `msg="worker rank ejected from routing" worker=1 dp_rank=0 model=m reason=connect failures=1 for=10s times_ejected=1`) {
		t.Fatalf("no ejection line:\n%s", buf.String())
	}
	buf.Reset()
	if w := routeOne(t, r, fresh("logged", 1)); w != 3 {
		t.Fatalf("routed to %d, want 3: 1 is out, 2 loses the tie", w)
	}
	for _, want := range []string{
		`msg="candidate skipped: ejected" request=logged worker=1 dp_rank=0`,
		`msg="tie lost: the worker failed since its last answer" request=logged worker=2 dp_rank=0 to_worker=3 to_dp_rank=0`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Fatalf("no line %s in:\n%s", want, buf.String())
		}
	}
	buf.Reset()
	r.UpstreamOK(1, 0)
	if !strings.Contains(buf.String(), `msg="worker rank back in routing: it answered a request" worker=1 dp_rank=0 model=m`) {
		t.Fatalf("no return line:\n%s", buf.String())
	}
}
