package radix_test

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
)

// TestLoadEqualsAdds: a bulk load gives the index that adding every (block, slot) pair gives —
// holders in every form (inline, cells, bitsets), per-slot counts, entries, matches — into an
// empty index and into one that holds blocks already; and it refuses bad input.
func TestLoadEqualsAdds(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 5))
	const workers = 300
	for _, c := range []struct{ prefilled, grouped bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		prefilled, grouped := c.prefilled, c.grouped
		added, loaded := newIndex(t, 4), newIndex(t, 4)
		var slots []radix.Slot
		for id := range uint64(workers) {
			a, b := acquire(t, added, id), acquire(t, loaded, id)
			if a != b {
				t.Fatal("the two indexes give different slots")
			}
			slots = append(slots, a)
		}
		// Chains shared by few or many workers, so that every holder form occurs.
		holders := map[uint64][]radix.Slot{}
		var queries [][]uint64
		for c := range 400 {
			q := chain(uint64(c), uint64(c+1), uint64(c+2), uint64(c+3))
			queries = append(queries, q)
			n := []int{1, 2, 3, 5, 40, 200}[c%6]
			for _, x := range r.Perm(workers)[:n] {
				depth := 1 + r.IntN(len(q))
				for _, k := range q[:depth] {
					if !slices.Contains(holders[k], slots[x]) {
						holders[k] = append(holders[k], slots[x])
					}
				}
			}
		}
		keys := slices.Sorted(maps.Keys(holders))
		if prefilled { // a third of the blocks added one by one to both first
			for _, k := range keys[:len(keys)/3] {
				for _, x := range holders[k] {
					added.Add(k, x)
					loaded.Add(k, x)
				}
				delete(holders, k)
			}
			keys = keys[len(keys)/3:]
		}
		var counts []uint32
		var flat []radix.Slot
		for _, k := range keys {
			hs := holders[k] // in any order
			counts = append(counts, uint32(len(hs)))
			flat = append(flat, hs...)
			for _, x := range hs {
				added.Add(k, x)
			}
		}
		if grouped {
			// Listed by segment, as a snapshot written under this salt lists them: loaded where
			// they lie.
			slices.SortStableFunc(keys, func(a, b uint64) int { return loaded.Segment(a) - loaded.Segment(b) })
			counts, flat = counts[:0], flat[:0]
			for _, k := range keys {
				counts = append(counts, uint32(len(holders[k])))
				flat = append(flat, holders[k]...)
			}
		}
		if err := loaded.Load(radix.Blocks{Keys: keys[:len(keys)/2], Counts: counts[:len(keys)/2], Holders: flat[:holdersOf(counts[:len(keys)/2])]}, radix.Blocks{Keys: keys[len(keys)/2:], Counts: counts[len(keys)/2:], Holders: flat[holdersOf(counts[:len(keys)/2]):]}); err != nil {
			t.Fatal(err)
		}
		if a, b := added.Stats(), loaded.Stats(); a.Entries != b.Entries || a.Residencies != b.Residencies {
			t.Fatalf("prefilled %v: added %+v, loaded %+v", prefilled, a, b)
		}
		for _, x := range slots {
			if added.Blocks(x) != loaded.Blocks(x) {
				t.Fatalf("slot %d: %d blocks added, %d loaded", x, added.Blocks(x), loaded.Blocks(x))
			}
		}
		for _, q := range queries {
			for _, k := range q {
				if a, b := added.AppendHolders(nil, k), loaded.AppendHolders(nil, k); !slices.Equal(a, b) {
					t.Fatalf("block %#x: holders %v added, %v loaded", k, a, b)
				}
			}
			var ma, mb radix.Match
			added.Match(q, &ma)
			loaded.Match(q, &mb)
			if a, b := result(t, added, &ma), result(t, loaded, &mb); !maps.Equal(a, b) {
				t.Fatalf("match: %v added, %v loaded", a, b)
			}
		}
		// The loaded index goes on like any other: removals and adds.
		for _, k := range keys[:50] {
			for _, x := range slices.Clone(loaded.AppendHolders(nil, k)) {
				if !loaded.Remove(k, x) || !added.Remove(k, x) {
					t.Fatalf("block %#x slot %d: not removable", k, x)
				}
			}
		}
		if a, b := added.Stats(), loaded.Stats(); a.Entries != b.Entries || a.Residencies != b.Residencies {
			t.Fatalf("after removals: added %+v, loaded %+v", a, b)
		}
	}

	ix := newIndex(t, 4)
	x := acquire(t, ix, 1)
	y := acquire(t, ix, 2)
	k := chain(1, 2)
	for name, c := range map[string]struct {
		keys    []uint64
		counts  []uint32
		holders []radix.Slot
	}{
		"counts":         {k, []uint32{1}, []radix.Slot{x}},
		"holders":        {k, []uint32{1, 1}, []radix.Slot{x}},
		"no holder":      {k[:1], []uint32{0}, nil},
		"unknown slot":   {k[:1], []uint32{1}, []radix.Slot{9}},
		"a holder twice": {k[:1], []uint32{2}, []radix.Slot{y, y}},
		"twice":          {[]uint64{k[0], k[0]}, []uint32{1, 1}, []radix.Slot{x, y}},
	} {
		if err := newIndexWithSlots(t).Load(radix.Blocks{Keys: c.keys, Counts: c.counts, Holders: c.holders}); !errors.Is(err, radix.ErrLoad) {
			t.Errorf("%s: %v, want ErrLoad", name, err)
		}
	}
	if err := ix.SetSalt(42); err != nil || ix.Salt() != 42 {
		t.Fatalf("SetSalt on an empty index: %v, salt %d", err, ix.Salt())
	}
	ix.Add(k[0], x)
	if err := ix.SetSalt(7); !errors.Is(err, radix.ErrSalt) {
		t.Errorf("SetSalt on an index holding a block: %v", err)
	}
	if err := ix.Load(radix.Blocks{Keys: k[:1], Counts: []uint32{1}, Holders: []radix.Slot{y}}); !errors.Is(err, radix.ErrLoad) {
		t.Errorf("a block already in the index: %v", err)
	}
}

// holdersOf is the holders counts give.
func holdersOf(counts []uint32) int {
	n := 0
	for _, c := range counts {
		n += int(c)
	}
	return n
}

// newIndexWithSlots is an index with workers 1 and 2 acquired (slots 0 and 1).
func newIndexWithSlots(t *testing.T) *radix.Index {
	ix := newIndex(t, 4)
	acquire(t, ix, 1)
	acquire(t, ix, 2)
	return ix
}
