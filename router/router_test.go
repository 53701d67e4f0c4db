package router

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func seq(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

// fleet is a Router with workers 1..n of model "m" (block size 16), each holding a shared
// 16-block prefix and a 128-block prompt of its own family.
func fleet(tb testing.TB, n int) *Router {
	tb.Helper()
	return fleetWith(tb, n, Config{Shards: 2, Logger: quiet()})
}

// fleetWith is fleet with a Router of cfg.
func fleetWith(tb testing.TB, n int, cfg Config) *Router {
	tb.Helper()
	r := New(cfg)
	tb.Cleanup(r.Close)
	for id := uint64(1); id <= uint64(n); id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 16}); err != nil {
			tb.Fatal(err)
		}
		fam := int(id) % 16
		toks := append(seq(0, 16*16), seq(100000*(fam+1), 112*16)...)
		hashes := make([]uint64, 128)
		for i := range hashes {
			hashes[i] = uint64(i + 1)
		}
		b := &wire.EventBatch{Worker: id, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1, Hashes: hashes, Tokens: toks}}}
		oc, err := r.ApplyEvents(b, nil)
		if err != nil || oc[0].Status != shard.OK {
			tb.Fatalf("events: %v %v", oc, err)
		}
	}
	return r
}

func familyPrompt(fam int) []uint32 {
	return append(seq(0, 16*16), seq(100000*(fam+1), 112*16)...)
}

// TestRouteAllocs checks that the request path — decode, route, book, encode, complete —
// allocates nothing once warm.
func TestRouteAllocs(t *testing.T) {
	for _, cost := range []scoring.CostModel{scoring.CostV1, scoring.CostTTFT} {
		t.Run(cost.String(), func(t *testing.T) { testRouteAllocs(t, cost) })
	}
}

func testRouteAllocs(t *testing.T, cost scoring.CostModel) {
	r := fleetWith(t, 8, Config{Shards: 2, Logger: quiet(), Cost: cost})
	in := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: familyPrompt(3)})
	var req wire.RouteRequest
	var resp wire.RouteResponse
	var out []byte
	step := func() {
		if err := wire.DecodeRouteRequest(in, &req); err != nil {
			t.Fatal(err)
		}
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		out = wire.AppendRouteResponse(out[:0], &resp)
		if err := r.Complete(req.RequestID); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if resp.Worker != 3 || resp.Candidates[2].CachedBlocks != 128 {
		t.Fatalf("routed to %d: %+v", resp.Worker, resp.Candidates[2])
	}
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("route path allocates %v times per request", n)
	}
	match := func() {
		if err := r.Match(&req, &resp); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(200, match); n != 0 {
		t.Fatalf("match allocates %v times per request", n)
	}
	// The server's binary path, encoding the answer as it is made.
	encoded := func() {
		if err := wire.DecodeRouteRequest(in, &req); err != nil {
			t.Fatal(err)
		}
		var err error
		if out, err = r.AppendRoute(out[:0], &req, &resp); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete(req.RequestID); err != nil {
			t.Fatal(err)
		}
		if out, err = r.AppendMatch(out[:0], &req, &resp); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(200, encoded); n != 0 {
		t.Fatalf("encoded route and match allocate %v times per request", n)
	}
	// A capped answer, with another request in flight.
	if err := r.Route(&wire.RouteRequest{RequestID: "other", Model: "m", Tokens: familyPrompt(3)}, &resp); err != nil {
		t.Fatal(err)
	}
	in = wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: familyPrompt(3), MaxCandidates: 3})
	step()
	if len(resp.Candidates) != 3 {
		t.Fatalf("capped answer: %+v", resp.Candidates)
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("capped route path allocates %v times per request", n)
	}
	if n := testing.AllocsPerRun(200, match); n != 0 {
		t.Fatalf("capped match allocates %v times per request", n)
	}
}

// TestAppendRouteRefused: a route refused at booking, after its every-worker answer was encoded,
// returns dst at its length.
func TestAppendRouteRefused(t *testing.T) {
	r := fleet(t, 8)
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "held", Model: "m", Tokens: familyPrompt(3)}, &resp); err != nil {
		t.Fatal(err)
	}
	got, err := r.AppendRoute([]byte("xy"), &wire.RouteRequest{RequestID: "held", Model: "m", Tokens: familyPrompt(3)}, &resp)
	if !errors.Is(err, ErrConflict) || string(got) != "xy" {
		t.Fatalf("duplicate id: %q, %v", got, err)
	}
}

func TestRegistryConflicts(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet()})
	defer r.Close()
	f := func(err, want error, field string) {
		t.Helper()
		var fe *FieldError
		if !errors.Is(err, want) || !errors.As(err, &fe) || fe.Field != field {
			t.Fatalf("got %v, want %v on field %q", err, want, field)
		}
	}
	if err := r.Register(Registration{ID: 1, Model: "a", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	f(r.Register(Registration{ID: 2, Model: "a", BlockSize: 8}), ErrConflict, "block_size")
	f(r.Register(Registration{ID: 1, Model: "b"}), ErrConflict, "model")
	f(r.Register(Registration{ID: 3}), ErrInvalid, "model")
	f(r.Unregister(9), ErrUnknownWorker, "worker_id")
	// More ranks for worker 1, idempotently.
	for range 2 {
		if err := r.Register(Registration{ID: 1, Model: "a", Ranks: []uint32{0, 1, 2}}); err != nil {
			t.Fatal(err)
		}
	}
	if ws := r.Workers(); len(ws) != 3 {
		t.Fatalf("%d workers listed, want 3 ranks", len(ws))
	}
	_, err := r.ApplyEvents(&wire.EventBatch{Worker: 1, Events: []kvevent.Event{{Kind: kvevent.Cleared, Rank: 5}}}, nil)
	f(err, ErrUnknownWorker, "events[0].dp_rank")
	_, err = r.ApplyEvents(&wire.EventBatch{Worker: 1, Model: "b", Events: []kvevent.Event{{Kind: kvevent.Cleared}}}, nil)
	f(err, ErrConflict, "model")
	// A request id booked twice is refused; after completion it can be reused.
	if err := r.Register(Registration{ID: 2, Model: "a"}); err != nil {
		t.Fatal(err)
	}
	req := &wire.RouteRequest{RequestID: "x", Model: "a", Tokens: seq(0, 8)}
	var resp wire.RouteResponse
	if err := r.Route(req, &resp); err != nil {
		t.Fatal(err)
	}
	f(r.Route(req, &resp), ErrConflict, "request_id")
	if err := r.Complete("x"); err != nil {
		t.Fatal(err)
	}
	if err := r.Route(req, &resp); err != nil {
		t.Fatal(err)
	}
	// Unregistering frees the slots and drops the worker from routing.
	if err := r.Unregister(1); err != nil {
		t.Fatal(err)
	}
	if err := r.Match(req, &resp); err != nil || len(resp.Candidates) != 1 || resp.Candidates[0].Worker != 2 {
		t.Fatalf("after unregister: %+v %v", resp.Candidates, err)
	}
}

// TestRequestExpiry frees requests never completed once their expiry has passed.
func TestRequestExpiry(t *testing.T) {
	var now atomic.Int64
	const hour = int64(time.Hour)
	r := New(Config{Shards: 1, Logger: quiet(), Now: now.Load, RequestExpiry: time.Hour})
	defer r.Close()
	if err := r.Register(Registration{ID: 1, Model: "a", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	for i := range 3 {
		if err := r.Route(&wire.RouteRequest{RequestID: fmt.Sprint(i), Model: "a", Tokens: seq(0, 8)}, &resp); err != nil {
			t.Fatal(err)
		}
	}
	if w := r.Workers()[0]; w.ActiveRequests != 3 || w.ActiveBlocks != 2 {
		t.Fatalf("before expiry: %+v", w)
	}
	// The Router's own loop may expire them too: count the total.
	now.Store(hour)
	r.ExpireRequests()
	if n := r.Stats().Expired; n != 0 {
		t.Fatalf("expired %d at the deadline", n)
	}
	now.Store(hour + 1)
	r.ExpireRequests()
	if n := r.Stats().Expired; n != 3 {
		t.Fatalf("expired %d after the deadline", n)
	}
	if w := r.Workers()[0]; w.ActiveRequests != 0 || w.ActiveBlocks != 0 || w.ActivePrefill != 0 {
		t.Fatalf("after expiry: %+v", w)
	}
	if err := r.Complete("1"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("completing an expired request: %v", err)
	}
}

// With prefill tracking off (Dynamo's track_prefill_tokens=false), a routed request's own
// uncached tokens are neither charged nor booked: the worker it goes to shows its blocks
// active and no prefill; with tracking on, its 8 uncached tokens are booked.
func TestRouteUntrackedPrefillNotBooked(t *testing.T) {
	for _, track := range []bool{false, true} {
		r := New(Config{BlockSize: 4, Shards: 1, NoTrackPrefill: !track, Logger: quiet()})
		if err := r.Register(Registration{ID: 1, Model: "m"}); err != nil {
			t.Fatal(err)
		}
		var resp wire.RouteResponse
		if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}}, &resp); err != nil {
			t.Fatal(err)
		}
		wantPrefill := int64(0)
		if track {
			wantPrefill = 8
		}
		if w := r.Workers()[0]; w.ActiveBlocks != 2 || w.ActivePrefill != wantPrefill {
			t.Errorf("tracking %v: %d active blocks, %d prefill tokens; want 2 and %d", track, w.ActiveBlocks, w.ActivePrefill, wantPrefill)
		}
		r.Close()
	}
}

// UnregisterRank removes one rank: its blocks leave the index and it leaves routing, the
// worker's other ranks keep theirs; the rank can register again; removing the last rank removes
// the worker.
func TestUnregisterRank(t *testing.T) {
	r := New(Config{BlockSize: 4, Shards: 1, Logger: quiet()})
	defer r.Close()
	if err := r.Register(Registration{ID: 1, Model: "m", Ranks: []uint32{0, 1}}); err != nil {
		t.Fatal(err)
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	store := func(rank uint32, id uint64) {
		t.Helper()
		b := &wire.EventBatch{Worker: 1, Events: []kvevent.Event{{Kind: kvevent.Stored, ID: id, Rank: rank, BlockSize: 4, Hashes: []uint64{10*uint64(rank) + 1, 10*uint64(rank) + 2}, Tokens: toks}}}
		if _, err := r.ApplyEvents(b, nil); err != nil {
			t.Fatal(err)
		}
	}
	store(0, 1)
	store(1, 1)
	cached := func() map[uint32]uint32 {
		t.Helper()
		var resp wire.RouteResponse
		if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: toks}, &resp); err != nil {
			t.Fatal(err)
		}
		out := map[uint32]uint32{}
		for _, c := range resp.Candidates {
			out[c.Rank] = c.CachedBlocks
		}
		return out
	}
	if got := cached(); got[0] != 2 || got[1] != 2 {
		t.Fatalf("before: cached %v", got)
	}
	if err := r.UnregisterRank(1, 0); err != nil {
		t.Fatal(err)
	}
	if got := cached(); len(got) != 1 || got[1] != 2 {
		t.Fatalf("after removing rank 0: cached %v, want rank 1's 2 blocks only", got)
	}
	if ws := r.Workers(); len(ws) != 1 || ws[0].Rank != 1 || ws[0].CachedBlocks != 2 {
		t.Fatalf("after removing rank 0: workers %+v", ws)
	}
	var fe *FieldError
	if err := r.UnregisterRank(1, 0); !errors.As(err, &fe) || fe.Field != "dp_rank" {
		t.Fatalf("removing rank 0 twice: %v", err)
	}
	if err := r.Register(Registration{ID: 1, Model: "m", Ranks: []uint32{0}}); err != nil {
		t.Fatal(err)
	}
	store(0, 2)
	if got := cached(); got[0] != 2 || got[1] != 2 {
		t.Fatalf("rank 0 back: cached %v", got)
	}
	if err := r.UnregisterRank(1, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterRank(1, 1); err != nil {
		t.Fatal(err)
	}
	if ws := r.Workers(); len(ws) != 0 {
		t.Fatalf("the last rank removed: workers %+v", ws)
	}
}

// allocFree fails t if step allocates: step runs once to fill its buffers, then under
// testing.AllocsPerRun; what names it in the failure. Under -race, which allocates on its own,
// it skips t.
func allocFree(t *testing.T, what string, step func()) {
	t.Helper()
	step()
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("%s allocates %v times per call", what, n)
	}
}
