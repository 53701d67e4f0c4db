package approx

import (
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
)

func TestLRU(t *testing.T) {
	w := radix.WorkerKey{ID: 1}
	acquire := func(c *LRU, capacity int64, key string, seqs ...uint64) (added, evicted []uint64) {
		t.Helper()
		added, evicted, ok := c.Acquire(w, capacity, key, seqs, 1<<62, nil, nil)
		if !ok {
			t.Fatalf("Acquire(%q): served by the TTL cache", key)
		}
		return added, evicted
	}
	eq := func(what string, got, want []uint64) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s = %v, want %v", what, got, want)
		}
	}

	t.Run("active blocks are never evicted; released ones go deepest first", func(t *testing.T) {
		c := NewLRU()
		added, _ := acquire(c, 4, "a", 1, 2, 3)
		eq("added", added, []uint64{1, 2, 3})
		_, evicted := acquire(c, 4, "b", 11, 12, 13)
		eq("evicted while both are active", evicted, nil)
		if n, _ := c.Resident(w); n != 6 {
			t.Fatalf("resident %d, want 6 (over capacity while leased)", n)
		}
		evicted, _ = c.Release("a", nil)
		eq("evicted at a's release", evicted, []uint64{3, 2})
		if n, _ := c.Resident(w); n != 4 {
			t.Fatalf("resident %d, want 4", n)
		}
	})

	t.Run("least recently used first, a hit refreshes its prefix", func(t *testing.T) {
		c := NewLRU()
		acquire(c, 6, "", 1, 2)
		acquire(c, 6, "", 3, 4)
		acquire(c, 6, "", 5, 6)
		added, _ := acquire(c, 6, "", 1, 2) // refreshes 1, 2
		eq("added on a hit", added, nil)
		_, evicted := acquire(c, 6, "", 7, 8)
		eq("evicted", evicted, []uint64{4, 3})
	})

	t.Run("a shared prefix is one copy, held by both leases", func(t *testing.T) {
		c := NewLRU()
		acquire(c, 3, "a", 1, 2, 3)
		added, _ := acquire(c, 3, "b", 1, 2, 4)
		eq("added for b", added, []uint64{4})
		if n, _ := c.Resident(w); n != 4 {
			t.Fatalf("resident %d, want 4", n)
		}
		ev, _ := c.Release("a", nil)
		eq("evicted at a's release (1, 2 still leased by b)", ev, []uint64{3})
	})

	t.Run("unknown capacity falls back to TTL for good", func(t *testing.T) {
		c := NewLRU()
		if _, _, ok := c.Acquire(w, 0, "a", []uint64{1}, 0, nil, nil); ok {
			t.Fatal("a rank of unknown capacity was taken by the LRU")
		}
		if _, _, ok := c.Acquire(w, 8, "a", []uint64{1}, 0, nil, nil); ok {
			t.Fatal("a fallback rank moved to the LRU when its capacity became known")
		}
	})

	t.Run("expired leases are released", func(t *testing.T) {
		c := NewLRU()
		c.Acquire(w, 2, "a", []uint64{1, 2}, 100, nil, nil)
		c.Acquire(w, 2, "b", []uint64{3, 4}, 300, nil, nil)
		var got []uint64
		n := c.ExpireLeases(200, func(_ radix.WorkerKey, ev []uint64) { got = append(got, ev...) })
		if n != 1 || c.Leases() != 1 {
			t.Fatalf("expired %d, %d left; want 1, 1", n, c.Leases())
		}
		eq("evicted at expiry", got, []uint64{2, 1})
	})

	t.Run("a removed worker reports what it held", func(t *testing.T) {
		c := NewLRU()
		acquire(c, 8, "a", 1, 2)
		got := c.RemoveWorker(w, nil)
		slices.Sort(got)
		eq("removed", got, []uint64{1, 2})
		if c.Leases() != 0 {
			t.Fatal("a removed worker's lease is kept")
		}
		if ev, _ := c.Release("a", nil); len(ev) != 0 {
			t.Fatalf("release after removal evicted %v", ev)
		}
	})
}

// TestLRUModel checks the LRU against a plain model under random leases: the hashes it reports
// as added and evicted always sum to what it holds, a leased hash is never evicted, and a rank
// holds no more than its capacity once nothing is leased.
func TestLRUModel(t *testing.T) {
	w := radix.WorkerKey{ID: 7}
	c := NewLRU()
	const capacity = 24
	held := map[uint64]bool{}
	leased := map[string][]uint64{}
	seed := uint64(12345)
	next := func(n uint64) uint64 {
		seed = seed*6364136223846793005 + 1442695040888963407
		return (seed >> 33) % n
	}
	for step := 0; step < 20000; step++ {
		if next(3) == 0 && len(leased) > 0 {
			for k := range leased {
				ev, _ := c.Release(k, nil)
				for _, s := range ev {
					if !held[s] {
						t.Fatalf("step %d: evicted %d, not held", step, s)
					}
					delete(held, s)
				}
				delete(leased, k)
				break
			}
		} else {
			// Chains from a few roots: prefixes are shared.
			root, n := next(6), 1+next(8)
			seqs := make([]uint64, n)
			for i := range seqs {
				seqs[i] = root*100 + uint64(i)
			}
			key := ""
			if next(2) == 0 {
				key = string(rune('a' + step%50))
				if _, ok := leased[key]; ok {
					key = ""
				}
			}
			added, ev, ok := c.Acquire(w, capacity, key, seqs, 1<<62, nil, nil)
			if !ok {
				t.Fatal("served by the TTL cache")
			}
			for _, s := range added {
				if held[s] {
					t.Fatalf("step %d: added %d, held already", step, s)
				}
				held[s] = true
			}
			for _, s := range ev {
				if !held[s] {
					t.Fatalf("step %d: evicted %d, not held", step, s)
				}
				delete(held, s)
			}
			if key != "" {
				leased[key] = seqs
			}
		}
		for k, seqs := range leased {
			for _, s := range seqs {
				if !held[s] {
					t.Fatalf("step %d: lease %q's block %d was evicted", step, k, s)
				}
			}
		}
		if n, _ := c.Resident(w); len(leased) == 0 && n > capacity {
			t.Fatalf("step %d: %d resident with nothing leased, capacity %d", step, n, capacity)
		}
	}
}
