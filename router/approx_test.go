package router

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/radix"
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

// TestApproximateLRU checks Dynamo's lru policy: a rank that registered its KV capacity holds at
// most that many blocks, least recently used evicted first and never one a booked request holds
// until it completes; no TTL applies to it; a rank without a capacity keeps the TTL.
func TestApproximateLRU(t *testing.T) {
	var now atomic.Int64
	r := New(Config{Shards: 1, Logger: quiet(), Now: now.Load,
		Approximate: &approx.Config{TTL: 10 * time.Second, LRU: true}})
	defer r.Close()
	if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 4, Capacity: 6}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(Registration{ID: 2, Model: "m", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	w1, w2 := radix.WorkerKey{ID: 1}, radix.WorkerKey{ID: 2}
	residencies := func() int64 { t.Helper(); return r.Models()[0].Residencies }
	book := func(w radix.WorkerKey, id string, seqs ...uint64) {
		t.Helper()
		if err := r.Book("m", w, id, seqs, 0); err != nil {
			t.Fatal(err)
		}
	}
	book(w1, "a", 1, 2, 3, 4)
	book(w1, "b", 11, 12, 13, 14)
	if n := residencies(); n != 8 {
		t.Fatalf("two booked requests: %d residencies, want 8 (over capacity while both are active)", n)
	}
	if err := r.Complete("a"); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.approx.lru.Resident(w1); n != 6 || residencies() != 6 {
		t.Fatalf("after a completes: LRU %d, index %d; want 6 each (a's 2 deepest evicted)", n, residencies())
	}
	// No TTL on an LRU rank.
	now.Store(int64(time.Hour))
	r.expireApprox()
	if residencies() != 6 {
		t.Fatalf("an hour later: %d residencies, want 6", residencies())
	}
	// A rank of unknown capacity keeps the TTL.
	book(w2, "c", 21, 22)
	if residencies() != 8 {
		t.Fatalf("after booking on the rank without a capacity: %d residencies, want 8", residencies())
	}
	now.Store(int64(2 * time.Hour))
	r.expireApprox()
	if residencies() != 6 {
		t.Fatalf("past the TTL: %d residencies, want w2's 2 gone", residencies())
	}
	// Unregistering forgets the rank's blocks.
	if err := r.Unregister(1); err != nil {
		t.Fatal(err)
	}
	if residencies() != 0 {
		t.Fatalf("after unregistering: %d residencies", residencies())
	}
}
