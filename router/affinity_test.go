package router

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// affine is a Router with session affinity (mode, 10 s) and workers 1..3 of model "m", worker 2
// holding seq(0, 64), on a clock the test sets; share, if set, learns of the bindings.
func affine(t *testing.T, mode AffinityMode, queue *QueueConfig, share LoadSharer) (*Router, *atomic.Int64) {
	t.Helper()
	now := new(atomic.Int64)
	r := New(Config{Shards: 2, Logger: quiet(), Now: now.Load, Share: share, Queue: queue,
		Affinity: &AffinityConfig{TTL: 10 * time.Second, Mode: mode}})
	t.Cleanup(r.Close)
	for id := uint64(1); id <= 3; id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 16, MaxTokens: 100}); err != nil {
			t.Fatal(err)
		}
	}
	b := &wire.EventBatch{Worker: 2, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1,
		Hashes: []uint64{1, 2, 3, 4}, Tokens: seq(0, 64)}}}
	if oc, err := r.ApplyEvents(b, nil); err != nil || oc[0].Status != shard.OK {
		t.Fatalf("events: %v %v", oc, err)
	}
	return r, now
}

func routeTo(t *testing.T, r *Router, id, session string, toks []uint32) uint64 {
	t.Helper()
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks, SessionID: session}, &resp); err != nil {
		t.Fatal(err)
	}
	if err := r.Complete(id); err != nil {
		t.Fatal(err)
	}
	return resp.Worker
}

// TestAffinity: a session stays on its first worker although another holds its next prompt,
// until its binding expires or the worker leaves; requests without a session are unaffected.
func TestAffinity(t *testing.T) {
	r, now := affine(t, AffinityHard, nil, nil)
	first := routeTo(t, r, "a", "s", seq(9000, 64)) // cached nowhere: not worker 2, whose tree breaks the tie
	if first == 2 {
		t.Fatal("an uncached prompt went to the worker with the largest tree")
	}
	if routeTo(t, r, "x", "", seq(0, 64)) != 2 {
		t.Fatal("without a session the cached worker should win")
	}
	session := "s"
	if got := routeTo(t, r, "b", session, seq(0, 64)); got != first {
		t.Fatalf("the session moved to %d, want %d", got, first)
	}
	now.Add(int64(9 * time.Second)) // renewed by "b": still bound
	if got := routeTo(t, r, "c", session, seq(0, 64)); got != first {
		t.Fatalf("renewed session moved to %d", got)
	}
	now.Add(int64(11 * time.Second)) // past its time to live: routed freely, bound anew
	if got := routeTo(t, r, "d", session, seq(0, 64)); got != 2 {
		t.Fatalf("an expired session went to %d, want the cached worker 2", got)
	}
	if err := r.Unregister(2); err != nil {
		t.Fatal(err)
	}
	if got := routeTo(t, r, "e", session, seq(0, 64)); got == 2 || got == 0 {
		t.Fatalf("a session whose worker left went to %d", got)
	}
	st, _ := r.AffinityStats()
	if st.Hits != 2 || st.Moved != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAffinitySoft: in soft mode a session leaves a worker that is overloaded (busy, with the
// router queue on); in hard mode it stays.
func TestAffinitySoft(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityHard, AffinitySoft} {
		t.Run(mode.String(), func(t *testing.T) {
			r, _ := affine(t, mode, &QueueConfig{Threshold: 0.5}, nil)
			var resp wire.RouteResponse
			if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: append(seq(0, 64), seq(5000, 64)...), SessionID: "s"}, &resp); err != nil {
				t.Fatal(err)
			}
			if resp.Worker != 2 {
				t.Fatalf("first request went to %d", resp.Worker)
			}
			// 64 uncached prompt tokens booked on worker 2, not prefilled: busy (64 > 0.5 × 100).
			// An uncached prompt: routed freely, it goes to an idle worker.
			if err := r.Route(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: seq(9000, 32), SessionID: "s"}, &resp); err != nil {
				t.Fatal(err)
			}
			if want := map[AffinityMode]bool{AffinityHard: true, AffinitySoft: false}[mode]; (resp.Worker == 2) != want {
				t.Fatalf("%s: second request went to %d", mode, resp.Worker)
			}
		})
	}
}

// TestAffinitySoftThresholds: with busy thresholds set, soft affinity leaves a rank over them.
func TestAffinitySoftThresholds(t *testing.T) {
	r, _ := affine(t, AffinitySoft, nil, nil)
	if _, err := r.SetBusyThresholds("m", Thresholds{HasPrefillTokens: true, PrefillTokens: 50}); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: append(seq(0, 64), seq(5000, 64)...), SessionID: "s"}, &resp); err != nil || resp.Worker != 2 {
		t.Fatalf("first request: worker %d, %v", resp.Worker, err)
	}
	if err := r.Route(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: seq(9000, 32), SessionID: "s"}, &resp); err != nil || resp.Worker == 2 {
		t.Fatalf("soft session stayed on its overloaded worker: %d, %v", resp.Worker, err)
	}
	if st, _ := r.AffinityStats(); st.Moved != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// forward is a LoadSharer that hands every session binding to another router, as the replica
// channel does.
type forward struct {
	nopSharer
	to *Router
}

func (f forward) SessionBound(model, session string, worker radix.WorkerKey, ttl time.Duration) {
	if err := f.to.BindRemote("replica-a", model, session, worker, ttl); err != nil {
		panic(err)
	}
}

// TestAffinityReplicas: a session bound on one replica is honoured by another.
func TestAffinityReplicas(t *testing.T) {
	b, _ := affine(t, AffinityHard, nil, nil)
	a, _ := affine(t, AffinityHard, nil, forward{to: b})
	first := routeTo(t, a, "r1", "s", seq(9000, 64))
	if got := routeTo(t, b, "r2", "s", seq(0, 64)); got != first || first == 2 {
		t.Fatalf("replica b sent the session to %d, want %d (bound on replica a)", got, first)
	}
	if st, _ := b.AffinityStats(); st.Remote == 0 || st.Hits != 1 {
		t.Fatalf("replica b: %+v", st)
	}
}

// TestAffinityBinaryRequest: a session id decoded from a binary request (a string aliasing the
// buffer, which the server reuses) is bound by value.
func TestAffinityBinaryRequest(t *testing.T) {
	r, _ := affine(t, AffinityHard, nil, nil)
	buf := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(9000, 64), SessionID: "sess-1"})
	var req wire.RouteRequest
	if err := wire.DecodeRouteRequest(buf, &req); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	if err := r.Route(&req, &resp); err != nil {
		t.Fatal(err)
	}
	first := resp.Worker
	for i := range buf {
		buf[i] = 'X'
	}
	if got := routeTo(t, r, "b", "sess-1", seq(0, 64)); got != first {
		t.Fatalf("the session went to %d after its first request's buffer was reused, want %d", got, first)
	}
}

// TestAffinityAllowed: a request restricted to workers that exclude its session's goes to an
// allowed one, and the session moves there.
func TestAffinityAllowed(t *testing.T) {
	r, _ := affine(t, AffinityHard, nil, nil)
	first := routeTo(t, r, "a", "s", seq(9000, 64))
	var allowed []uint64
	for id := uint64(1); id <= 3; id++ {
		if id != first {
			allowed = append(allowed, id)
		}
	}
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: seq(9000, 64), SessionID: "s", Allowed: allowed}, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Worker == first {
		t.Fatalf("routed to %d, which the request does not allow", resp.Worker)
	}
	if got := routeTo(t, r, "c", "s", seq(9000, 64)); got != resp.Worker {
		t.Fatalf("the session did not move: %d, want %d", got, resp.Worker)
	}
}

// TestAffinityQueue: a hard session bound to a busy rank waits for it in the router queue, as a
// request pinned there would, while a request without a session routes at once.
func TestAffinityQueue(t *testing.T) {
	r, _ := affine(t, AffinityHard, &QueueConfig{Threshold: 0.5}, nil)
	var resp wire.RouteResponse
	// 64 uncached tokens on worker 2 (it holds seq(0, 64)): busy.
	if err := r.RouteWait(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: append(seq(0, 64), seq(5000, 64)...), SessionID: "s"}, &resp, nil); err != nil || resp.Worker != 2 {
		t.Fatalf("first request: %d, %v", resp.Worker, err)
	}
	err := r.RouteWait(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: seq(9000, 32), SessionID: "s", MaxWaitMs: 20}, &resp, nil)
	if !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("a session bound to a busy rank: %v, want it to wait and time out", err)
	}
	if err := r.RouteWait(&wire.RouteRequest{RequestID: "c", Model: "m", Tokens: seq(9000, 32)}, &resp, nil); err != nil || resp.Worker == 2 {
		t.Fatalf("without a session: %d, %v", resp.Worker, err)
	}
}
