package router

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// queued is a Router with the queue on (threshold 0.5) and a clock the test sets, with workers
// 1..n of model "m" (block size 16, 100 max batched tokens: a rank is busy above 50 prompt
// tokens booked and not prefilled); worker 1 holds the 4 blocks of seq(0, 64).
func queued(t *testing.T, n int, policy QueuePolicy, maxReq int) (*Router, *atomic.Int64) {
	t.Helper()
	now := new(atomic.Int64)
	r := New(Config{Shards: 2, Logger: quiet(), Now: now.Load,
		Queue: &QueueConfig{Threshold: 0.5, Policy: policy, MaxRequests: maxReq}})
	t.Cleanup(r.Close)
	for id := uint64(1); id <= uint64(n); id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 16, MaxTokens: 100}); err != nil {
			t.Fatal(err)
		}
	}
	b := &wire.EventBatch{Worker: 1, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1,
		Hashes: []uint64{1, 2, 3, 4}, Tokens: seq(0, 64)}}}
	if oc, err := r.ApplyEvents(b, nil); err != nil || oc[0].Status != shard.OK {
		t.Fatalf("events: %v %v", oc, err)
	}
	return r, now
}

// TestQueueOrder checks each policy's order against Dynamo's keys worked by hand
// (lib/kv-router/src/scheduling/policy.rs: fcfs pj − arrival, lcfs pj + arrival,
// wspt (1 + pj) / max(1, ISL − best cached tokens), strict priority compared first).
//
//	request  arrival  ISL  cached  priority        fcfs    lcfs    wspt
//	b        1 s      64   0       —               −1      1       1/64  = 0.0156
//	c        2 s      96   64      —               −2      2       1/32  = 0.0313
//	d        3 s      200  0       jump 1.5 s      −1.5    4.5     2.5/200 = 0.0125
//	e        4 s      32   0       strict 1        (first under every policy)
func TestQueueOrder(t *testing.T) {
	for _, tc := range []struct {
		policy QueuePolicy
		want   []string
	}{
		{FCFS, []string{"e", "b", "d", "c"}},
		{LCFS, []string{"e", "d", "c", "b"}},
		{WSPT, []string{"e", "c", "b", "d"}},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			r, now := queued(t, 1, tc.policy, 0)
			var resp wire.RouteResponse
			// a: 96 uncached tokens booked on the only worker: busy (96 > 0.5 × 100).
			if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(5000, 96)}, &resp); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var order []string
			done := func(tk *Ticket) {
				if tk.Err != nil {
					t.Errorf("admitted with %v", tk.Err)
				}
				mu.Lock()
				order = append(order, tk.req.RequestID)
				mu.Unlock()
			}
			reqs := []*wire.RouteRequest{
				{RequestID: "b", Model: "m", Tokens: seq(6000, 64)},
				{RequestID: "c", Model: "m", Tokens: append(seq(0, 64), seq(7000, 32)...)},
				{RequestID: "d", Model: "m", Tokens: seq(8000, 200), PriorityJump: 1.5},
				{RequestID: "e", Model: "m", Tokens: seq(9000, 32), StrictPriority: 1},
			}
			for i, req := range reqs {
				now.Store(int64(i+1) * int64(time.Second))
				tk, err := r.Enqueue(req, new(wire.RouteResponse), done)
				if err != nil || tk == nil {
					t.Fatalf("%s: not queued: %v", req.RequestID, err)
				}
			}
			// Each prefill done frees room for the next head (or two, when one is short).
			if err := r.PrefillDone("a"); err != nil {
				t.Fatal(err)
			}
			for range reqs {
				mu.Lock()
				ids := slices.Clone(order)
				mu.Unlock()
				for _, id := range ids {
					if err := r.PrefillDone(id); err != nil {
						t.Fatal(err)
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(order, tc.want) {
				t.Fatalf("admitted %v, want %v", order, tc.want)
			}
			for _, id := range []string{"a", "b", "c", "d", "e"} {
				if err := r.Complete(id); err != nil {
					t.Fatal(err)
				}
			}
			if n := r.tracker.Active(); n != 0 {
				t.Fatalf("%d bookings left", n)
			}
		})
	}
}

// TestQueueRefusals: a full queue refuses at once; a wait past the longest and a client that
// leaves are refused; none leaves a booking or a queued request behind.
func TestQueueRefusals(t *testing.T) {
	r, _ := queued(t, 1, FCFS, 1)
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(5000, 96)}, &resp); err != nil {
		t.Fatal(err)
	}
	tk, err := r.Enqueue(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: seq(6000, 64)}, new(wire.RouteResponse), func(*Ticket) {})
	if err != nil || tk == nil {
		t.Fatalf("b not queued: %v", err)
	}
	err = r.RouteWait(&wire.RouteRequest{RequestID: "c", Model: "m", Tokens: seq(6000, 64)}, &resp, nil)
	if !errors.Is(err, ErrQueueFull) {
		t.Fatalf("full queue: %v", err)
	}
	if !r.Cancel(tk) || r.Cancel(tk) {
		t.Fatal("Cancel: want true once, then false")
	}
	start := time.Now()
	err = r.RouteWait(&wire.RouteRequest{RequestID: "d", Model: "m", Tokens: seq(6000, 64), MaxWaitMs: 30}, &resp, nil)
	if !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("deadline: %v after %v", err, time.Since(start))
	}
	polls := 0
	err = r.RouteWait(&wire.RouteRequest{RequestID: "e", Model: "m", Tokens: seq(6000, 64)}, &resp, func() bool { polls++; return polls > 1 })
	if !errors.Is(err, ErrGone) {
		t.Fatalf("client gone: %v", err)
	}
	if n := r.tracker.Active(); n != 1 {
		t.Fatalf("%d bookings, want a's alone", n)
	}
	st := r.QueueStats(nil)
	if len(st) != 1 || st[0].Pending != [2]int64{} || st[0].Full != 1 || st[0].TimedOut != 1 || st[0].Gone != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The queue is empty again: with room, a request routes at once.
	if err := r.Complete("a"); err != nil {
		t.Fatal(err)
	}
	if err := r.RouteWait(&wire.RouteRequest{RequestID: "f", Model: "m", Tokens: seq(6000, 64)}, &resp, nil); err != nil {
		t.Fatal(err)
	}
}

// TestQueueEligibility: a pinned request waits for its own rank, and blocks the line behind it;
// a request restricted to some workers without a pin bypasses the queue; a pin to a worker that
// is not registered is an error at once, not a wait.
func TestQueueEligibility(t *testing.T) {
	r, _ := queued(t, 2, FCFS, 0)
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(5000, 96), HasPinned: true, PinnedWorker: 1, Mode: wire.ModeDirect}, &resp); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 4)
	done := func(tk *Ticket) {
		if tk.Err != nil {
			t.Errorf("%s: %v", tk.req.RequestID, tk.Err)
		}
		got <- fmt.Sprintf("%s→%d", tk.req.RequestID, tk.resp.Worker)
	}
	pinned := &wire.RouteRequest{RequestID: "p", Model: "m", Tokens: seq(6000, 32), HasPinned: true, PinnedWorker: 1, Mode: wire.ModeDirect}
	if tk, err := r.Enqueue(pinned, new(wire.RouteResponse), done); err != nil || tk == nil {
		t.Fatalf("pinned to a busy rank: not queued (%v)", err)
	}
	// Worker 2 has room, but a request waits before this one.
	free := &wire.RouteRequest{RequestID: "f", Model: "m", Tokens: seq(7000, 32)}
	if tk, err := r.Enqueue(free, new(wire.RouteResponse), done); err != nil || tk == nil {
		t.Fatalf("behind a waiting request: not queued (%v)", err)
	}
	if tk, err := r.Enqueue(&wire.RouteRequest{RequestID: "w", Model: "m", Tokens: seq(7000, 32), Allowed: []uint64{1}}, &resp, done); tk != nil || err != nil {
		t.Fatalf("restricted without a pin: queued %v, %v", tk != nil, err)
	}
	if _, err := r.Enqueue(&wire.RouteRequest{RequestID: "x", Model: "m", Tokens: seq(7000, 32), HasPinned: true, PinnedWorker: 9, Mode: wire.ModeDirect}, &resp, done); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("pinned to an unknown worker: %v", err)
	}
	if len(got) != 0 {
		t.Fatalf("admitted before room: %s", <-got)
	}
	if err := r.PrefillDone("a"); err != nil {
		t.Fatal(err)
	}
	if a, b := <-got, <-got; a != "p→1" || !strings.HasPrefix(b, "f→") {
		t.Fatalf("admitted %s, %s", a, b)
	}
}

// TestQueueConcurrent: many clients through the queue at once, the workers finishing requests
// meanwhile; every request is admitted or refused, and nothing is left booked or queued.
func TestQueueConcurrent(t *testing.T) {
	r, _ := queued(t, 3, WSPT, 0)
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var resp wire.RouteResponse
			for i := range 40 {
				id := fmt.Sprintf("g%d-%d", g, i)
				req := &wire.RouteRequest{RequestID: id, Model: "m", Tokens: seq(rng.IntN(4)*1000, 16+rng.IntN(80)),
					PriorityJump: float64(rng.IntN(3)), MaxWaitMs: 2000}
				if err := r.RouteWait(req, &resp, nil); err != nil {
					if !errors.Is(err, ErrQueueTimeout) {
						t.Error(err)
					}
					continue
				}
				admitted.Add(1)
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				if err := r.PrefillDone(id); err != nil {
					t.Error(err)
				}
				if err := r.Complete(id); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() == 0 {
		t.Fatal("nothing admitted")
	}
	if n := r.tracker.Active(); n != 0 {
		t.Fatalf("%d bookings left", n)
	}
	if st := r.QueueStats(nil); st[0].Pending != [2]int64{} || r.queued.Load() != 0 {
		t.Fatalf("left queued: %+v", st)
	}
}

// TestQueueRouteAllocs: with the queue on and nothing waiting, the route path allocates nothing.
func TestQueueRouteAllocs(t *testing.T) {
	r, _ := queued(t, 2, FCFS, 0)
	req := &wire.RouteRequest{RequestID: "r", Model: "m", Tokens: seq(0, 48)}
	var resp wire.RouteResponse
	var out []byte
	step := func() {
		var err error
		if out, err = r.AppendRouteWait(out[:0], req, &resp, nil); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete("r"); err != nil {
			t.Fatal(err)
		}
	}
	allocFree(t, "the queued route path with nothing waiting", step)
}

// TestQueueClose: closing the router refuses the requests still waiting.
func TestQueueClose(t *testing.T) {
	r, _ := queued(t, 1, FCFS, 0)
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(5000, 96)}, &resp); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		errc <- r.RouteWait(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: seq(6000, 64)}, new(wire.RouteResponse), nil)
	}()
	for r.queued.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	r.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiting at close: %v", err)
	}
}

// TestQueueRefuseWaiting: RefuseWaiting (the daemon's shutdown) refuses the requests waiting
// and those that would wait, leaving no booking; routes that find room go on.
func TestQueueRefuseWaiting(t *testing.T) {
	r, _ := queued(t, 2, FCFS, 0)
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(5000, 96), HasPinned: true, PinnedWorker: 1, Mode: wire.ModeDirect}, &resp); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		errc <- r.RouteWait(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: seq(6000, 64), HasPinned: true, PinnedWorker: 1, Mode: wire.ModeDirect}, new(wire.RouteResponse), nil)
	}()
	for r.queued.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	r.RefuseWaiting()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiting at shutdown: %v", err)
	}
	if err := r.RouteWait(&wire.RouteRequest{RequestID: "c", Model: "m", Tokens: seq(6000, 64), HasPinned: true, PinnedWorker: 1, Mode: wire.ModeDirect}, &resp, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("would wait after shutdown began: %v", err)
	}
	if err := r.RouteWait(&wire.RouteRequest{RequestID: "d", Model: "m", Tokens: seq(7000, 16)}, &resp, nil); err != nil || resp.Worker != 2 {
		t.Fatalf("with room: worker %d, %v", resp.Worker, err)
	}
	if n := r.tracker.Active(); n != 2 {
		t.Fatalf("%d bookings, want a's and d's", n)
	}
}

// TestQueueTTFTSLO: with an objective, a request waits while every rank it may go to is
// predicted past it, though none is over the threshold; it is admitted once the queue ahead
// of it is done; a request that misses the objective even on an idle worker does not wait;
// without the objective the same request is routed at once.
func TestQueueTTFTSLO(t *testing.T) {
	for _, slo := range []time.Duration{0, 200 * time.Millisecond} {
		now := new(atomic.Int64)
		now.Store(1)
		r := New(Config{Shards: 1, Logger: quiet(), Now: now.Load,
			Queue: &QueueConfig{Threshold: 1000, TTFTSLO: slo}}) // the threshold never fires
		defer r.Close()
		if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 16, MaxTokens: 8192, Capacity: 100000}); err != nil {
			t.Fatal(err)
		}
		// 40,000 prompt tokens ahead: about five full steps, some 0.9 s.
		if err := r.Route(&wire.RouteRequest{RequestID: "big", Model: "m", Tokens: seq(0, 40000)}, &wire.RouteResponse{}); err != nil {
			t.Fatal(err)
		}
		if slo > 0 {
			// A prompt no idle worker computes within 200 ms is not held for the objective.
			tk, err := r.Enqueue(&wire.RouteRequest{RequestID: "huge", Model: "m", Tokens: seq(200000, 30000)}, &wire.RouteResponse{}, func(*Ticket) {})
			if err != nil || tk != nil {
				t.Fatalf("a request that misses the objective anywhere was held: %v %v", tk, err)
			}
		}
		var got *Ticket
		tk, err := r.Enqueue(&wire.RouteRequest{RequestID: "small", Model: "m", Tokens: seq(100000, 500)}, &wire.RouteResponse{},
			func(t *Ticket) { got = t })
		if err != nil {
			t.Fatal(err)
		}
		if slo == 0 {
			if tk != nil {
				t.Fatal("queued without an objective, under the threshold")
			}
			continue
		}
		if tk == nil {
			t.Fatal("routed to a worker predicted past the objective")
		}
		if err := r.PrefillDone("big"); err != nil {
			t.Fatal(err)
		}
		if got != nil {
			t.Fatal("admitted while the huge request's 30,000 tokens are still ahead")
		}
		if err := r.PrefillDone("huge"); err != nil {
			t.Fatal(err)
		}
		if got == nil || got.Err != nil {
			t.Fatalf("not admitted once the queue ahead was done: %+v", got)
		}
	}
}
