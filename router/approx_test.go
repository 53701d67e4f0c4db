package router

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestApproximateMode checks that without events the router learns from its own decisions:
// a routed prompt counts as cached on the chosen worker until its TTL runs out, the cap prunes,
// and unregistering a worker leaves nothing behind.
func TestApproximateMode(t *testing.T) {
	var now atomic.Int64
	r := New(Config{Shards: 1, Logger: quiet(), Now: now.Load,
		Approximate: &approx.Config{TTL: 10 * time.Second, MaxBlocks: 40, PruneTarget: 0.5}})
	defer r.Close()
	for id := uint64(1); id <= 2; id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	cachedOn := func(toks []uint32) map[uint64]uint32 {
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
	route := func(id string, toks []uint32) uint64 {
		var resp wire.RouteResponse
		if err := r.Route(&wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks}, &resp); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete(id); err != nil {
			t.Fatal(err)
		}
		return resp.Worker
	}
	p := seq(0, 4*8) // 8 blocks
	w := route("a", p)
	if got := cachedOn(p); got[w] != 8 || got[3-w] != 0 {
		t.Fatalf("after routing to %d: cached %v", w, got)
	}
	// The same prompt goes back to the worker that has it.
	if again := route("b", p); again != w {
		t.Fatalf("second route went to %d, not %d which caches the prompt", again, w)
	}
	// Past the TTL (counted from the last use) the blocks are gone.
	now.Store(int64(5 * time.Second))
	route("c", p[:4*3]) // refreshes the first 3 blocks only
	now.Store(int64(12 * time.Second))
	r.expireApprox()
	if got := cachedOn(p); got[w] != 3 {
		t.Fatalf("after the TTL of the unrefreshed blocks: cached %v, want the 3 refreshed on %d", got, w)
	}
	now.Store(int64(30 * time.Second))
	r.expireApprox()
	if got := cachedOn(p); got[w] != 0 || r.Models()[0].Residencies != 0 {
		t.Fatalf("after every TTL: cached %v, residencies %d", got, r.Models()[0].Residencies)
	}

	// The cap: 8 prompts of 8 blocks on a cap of 40 prunes down to 20, and the index agrees.
	for i := range 8 {
		route("p"+strconv.Itoa(i), seq(1000*(i+1), 4*8))
	}
	if n, res := r.approx.c.Len(), r.Models()[0].Residencies; n > 40 || int64(n) != res {
		t.Fatalf("cache holds %d residencies, index %d; want equal and at most 40", n, res)
	}
	// The most recent prompt survives whole.
	if got := cachedOn(seq(8000, 4*8)); got[1]+got[2] != 8 {
		t.Fatalf("latest prompt cached %v, want 8 blocks on its worker", got)
	}
	// Unregistering leaves no residency behind (its slot is released).
	for id := uint64(1); id <= 2; id++ {
		if err := r.Unregister(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if res := r.Models()[0].Residencies; res != 0 || r.approx.c.Len() != 0 {
		t.Fatalf("after unregistering: %d residencies, cache %d", res, r.approx.c.Len())
	}
}
