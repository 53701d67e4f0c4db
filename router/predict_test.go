package router

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// predictFleet is a Router with predict-on-route (TTL 5 s on the clock now) and workers 1..n of
// model "m", block size 4, none holding anything.
func predictFleet(t *testing.T, n int, now *atomic.Int64) *Router {
	t.Helper()
	r := New(Config{Shards: 1, Logger: quiet(), Now: now.Load, PredictedTTL: 5 * time.Second})
	t.Cleanup(r.Close)
	for id := uint64(1); id <= uint64(n); id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// cachedBlocks matches toks against r's model "m" and returns each worker's cached blocks.
func cachedBlocks(t *testing.T, r *Router, toks []uint32) map[uint64]uint32 {
	t.Helper()
	var resp wire.RouteResponse
	if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: toks}, &resp); err != nil {
		t.Fatal(err)
	}
	out := map[uint64]uint32{}
	for _, c := range resp.Candidates {
		out[c.Worker] = c.CachedBlocks
	}
	return out
}

// TestPredictOnRoute: a routed request's blocks count as cached on its worker before any event
// says so, so that a sibling request follows it; a match takes per worker the larger of the
// event-fed and the predicted depth; predictions expire after their TTL; the event-fed index
// never holds them.
func TestPredictOnRoute(t *testing.T) {
	var now atomic.Int64
	r := predictFleet(t, 3, &now)
	p := seq(0, 4*6) // 6 blocks
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: p}, &resp); err != nil {
		t.Fatal(err)
	}
	w := resp.Worker
	if got := cachedBlocks(t, r, p); got[w] != 6 {
		t.Fatalf("after routing to %d: cached %v, want its 6 blocks predicted", w, got)
	}
	// A sibling (the same 6 blocks, then its own) follows the first once its prefill is done,
	// before the worker's events tell of the blocks.
	if err := r.PrefillDone("a"); err != nil {
		t.Fatal(err)
	}
	sib := append(append([]uint32{}, p...), seq(1000, 8)...)
	if err := r.Route(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: sib}, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Worker != w || resp.Cached != 6 {
		t.Fatalf("sibling went to %d with %d cached, want %d with 6", resp.Worker, resp.Cached, w)
	}
	// Nothing reached the event-fed index.
	if m := r.Models()[0]; m.Residencies != 0 || m.Blocks != 0 {
		t.Fatalf("event-fed index holds %d residencies of %d blocks after predictions only", m.Residencies, m.Blocks)
	}
	if st := r.Stats(); st.Predictions != 8 || st.PredictRaised == 0 {
		t.Fatalf("stats %+v: want 8 predictions (6 + the sibling's 2) and raised matches", st)
	}

	// Another worker reports 3 of the blocks by events: each worker gets its larger depth.
	other := w%3 + 1
	b := &wire.EventBatch{Worker: other, Model: "m", Events: []kvevent.Event{stored(1, 0, 4, p[:12], 0, 31, 32, 33)}}
	if _, err := r.ApplyEvents(b, nil); err != nil {
		t.Fatal(err)
	}
	if got := cachedBlocks(t, r, p); got[w] != 6 || got[other] != 3 {
		t.Fatalf("cached %v: want %d at 6 (predicted), %d at 3 (events)", got, w, other)
	}
	// The event-fed depth wins where it is the larger: the same worker, by events, 6 blocks
	// deeper than any prediction of another prompt.
	long := seq(5000, 4*10)
	b = &wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{stored(1, 0, 4, long, 0, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50)}}
	if _, err := r.ApplyEvents(b, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Route(&wire.RouteRequest{RequestID: "c", Model: "m", Tokens: long[:4*4], PinnedWorker: w, HasPinned: true}, &resp); err != nil {
		t.Fatal(err)
	}
	if got := cachedBlocks(t, r, long); got[w] != 10 {
		t.Fatalf("cached %v: want %d at 10 (events, over 4 predicted)", got, w)
	}

	// Past the TTL from the last use, the predictions are gone, the events' blocks stay.
	now.Store(int64(6 * time.Second))
	if got := cachedBlocks(t, r, p); got[w] != 0 || got[other] != 3 {
		t.Fatalf("after the TTL: cached %v, want %d at 0, %d at 3", got, w, other)
	}
	if n := r.predictions(); n != 0 {
		t.Fatalf("%d predictions left after the TTL", n)
	}

	// A snapshot holds the events' blocks only: a replica restored from it predicts nothing.
	if err := r.Route(&wire.RouteRequest{RequestID: "d", Model: "m", Tokens: p}, &resp); err != nil {
		t.Fatal(err)
	}
	restart, st := restored(t, r, 1000)
	if st.Residencies != 13 {
		t.Fatalf("snapshot of %d residencies, want the 13 the events stored", st.Residencies)
	}
	if got := cachedBlocks(t, restart, p); got[resp.Worker] > 3 || got[other] != 3 {
		t.Fatalf("restored replica: cached %v, want the events' 3 on %d and no prediction on %d", got, other, resp.Worker)
	}
}

// TestPredictForgetsWorker: a worker's predictions leave with it, and one registered again under
// its id starts with none.
func TestPredictForgetsWorker(t *testing.T) {
	var now atomic.Int64
	r := predictFleet(t, 2, &now)
	p := seq(0, 4*5)
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: p, HasPinned: true, PinnedWorker: 2}, &resp); err != nil {
		t.Fatal(err)
	}
	if err := r.Unregister(2); err != nil {
		t.Fatal(err)
	}
	if n := r.predictions(); n != 0 {
		t.Fatalf("%d predictions left by an unregistered worker", n)
	}
	if err := r.Register(Registration{ID: 2, Model: "m", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	if got := cachedBlocks(t, r, p); got[2] != 0 {
		t.Fatalf("re-registered worker: cached %v", got)
	}
}

// TestPredictRouteAllocs: with predict-on-route on, a warm route and match allocate nothing.
func TestPredictRouteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	var now atomic.Int64
	r := predictFleet(t, 8, &now)
	req := wire.RouteRequest{RequestID: "r", Model: "m", Tokens: seq(0, 4*32)}
	var resp wire.RouteResponse
	step := func() {
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete(req.RequestID); err != nil {
			t.Fatal(err)
		}
		if err := r.Match(&req, &resp); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("route and match with predictions allocate %v times", n)
	}
}

// TestPredictRefusesApproximate: predictions need an event-fed index to sit beside.
func TestPredictRefusesApproximate(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted predict-on-route with approximate mode")
		}
	}()
	New(Config{Logger: quiet(), PredictedTTL: time.Second, Approximate: &approx.Config{}})
}

// TestPredictConcurrent: routes, matches, expiry and a worker coming and going at once leave the
// side index and its cache in agreement, and empty once every TTL has run out.
func TestPredictConcurrent(t *testing.T) {
	var now atomic.Int64
	r := predictFleet(t, 4, &now)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var resp wire.RouteResponse
			for i := range 300 {
				id := "g" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
				toks := seq(1000*(i%7), 4*(1+i%9))
				err := r.Route(&wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks}, &resp)
				if errors.Is(err, ErrUnknownWorker) {
					continue // chosen as worker 4 left
				}
				if err != nil {
					t.Error(err)
					return
				}
				_ = r.Complete(id)
				now.Add(int64(10 * time.Millisecond))
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 50 {
			_ = r.Unregister(4)
			_ = r.Register(Registration{ID: 4, Model: "m", BlockSize: 4})
			r.expirePredicted()
		}
	}()
	wg.Wait()
	p := r.model("m").pred
	if n, st := p.len(), p.ix.Stats(); int64(n) != st.Residencies {
		t.Fatalf("cache holds %d predictions, side index %d residencies", n, st.Residencies)
	}
	now.Add(int64(time.Minute))
	r.expirePredicted()
	if n, st := p.len(), p.ix.Stats(); n != 0 || st.Residencies != 0 {
		t.Fatalf("after every TTL: %d predictions, %d residencies", n, st.Residencies)
	}
}
