package radix

import (
	"slices"
	"testing"
)

// keysInSegment returns n keys that land in segment 0 of ix.
func keysInSegment(ix *Index, n int) []uint64 {
	var keys []uint64
	for k := uint64(1); len(keys) < n; k++ {
		if ix.mix(k)>>(64-segBits) == 0 {
			keys = append(keys, k)
		}
	}
	return keys
}

// A reader still on a table that a rebuild replaced reads a holder word whose set index has since
// been freed and given to another key of the segment. It must notice and answer from the newest
// state, not with the other key's holders.
func TestStaleReaderSeesReusedSetIndex(t *testing.T) {
	ix, _ := New(Config{BlockSize: 16})
	var slots []Slot
	for i := range 8 {
		s, _ := ix.Acquire(WorkerKey{ID: uint64(i)})
		slots = append(slots, s)
	}
	keys := keysInSegment(ix, 2000)
	a, b := keys[0], keys[1]
	g := &ix.segs[0]
	for _, s := range slots[:5] {
		ix.Add(a, s) // five holders: an overflow set
	}
	stale := g.tab.Load()
	for _, k := range keys[2:] {
		ix.Add(k, slots[7]) // grow the segment: the table is rebuilt
	}
	if g.tab.Load() == stale {
		t.Fatal("setup: segment was not rebuilt")
	}
	for _, s := range slots[:5] {
		ix.Remove(a, s) // none left: a's set is freed
	}
	ix.Add(a, slots[3])
	ix.Add(a, slots[4]) // a is inline now
	for _, s := range slots[:6] {
		ix.Add(b, s) // b's new set takes the freed index
	}
	ma := ix.mix(a)
	if h := stale.find(a, ma); h&overflow == 0 || g.set(uint32(h)).key != b {
		t.Fatal("setup: the stale holder word of a does not point at b's set")
	}
	h, s := g.holdersFrom(stale, a, ma)
	if got, want := appendMembers(nil, h, s), slots[3:5]; !slices.Equal(got, want) {
		t.Fatalf("stale read of a: holders %v, want %v", got, want)
	}

	// A rebuild turns a set with few holders back into an inline word and frees the set; a
	// reader of the table before it finds the index empty and retries too.
	ix.Add(a, slots[0])
	ix.Add(a, slots[1]) // a overflows again
	ix.Remove(a, slots[0])
	ix.Remove(a, slots[1]) // two holders left in a set
	stale2 := g.tab.Load()
	for _, k := range keys[2:] {
		ix.Remove(k, slots[7]) // mostly dead: the segment shrinks, a new table
	}
	if g.tab.Load() == stale2 {
		t.Fatal("setup: segment was not rebuilt on shrink")
	}
	if h := g.tab.Load().find(a, ma); h&overflow != 0 {
		t.Fatal("rebuild did not compact a's two holders into an inline word")
	}
	h, s = g.holdersFrom(stale2, a, ma)
	if got, want := appendMembers(nil, h, s), slots[3:5]; !slices.Equal(got, want) {
		t.Fatalf("stale read of a after free: holders %v, want %v", got, want)
	}
}
