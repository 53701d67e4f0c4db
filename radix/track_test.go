package radix_test

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
)

// TestTrackMatches: with TrackMatches, a match marks the blocks it walks; Unref clears a mark
// once. The mark changes no answer, survives holders coming and going, and a block whose
// holders all left is still taken over as dead. Without tracking nothing is marked.
func TestTrackMatches(t *testing.T) {
	for _, track := range []bool{false, true} {
		ix := newIndex(t, 4)
		if track {
			ix.TrackMatches()
		}
		x, y := acquire(t, ix, 1), acquire(t, ix, 2)
		q := chain(1, 2, 3)
		for _, k := range q {
			ix.Add(k, x)
		}
		ix.Add(q[0], y)
		var m radix.Match
		ix.Match(q, &m)
		want := map[radix.WorkerKey]int{{ID: 1}: 3, {ID: 2}: 1}
		if got := result(t, ix, &m); len(got) != 2 || got[radix.WorkerKey{ID: 1}] != 3 || got[radix.WorkerKey{ID: 2}] != 1 {
			t.Fatalf("track %v: match %v, want %v", track, got, want)
		}
		for i, k := range q {
			if got := ix.Unref(k); got != track {
				t.Errorf("track %v: block %d marked %v", track, i, got)
			}
			if ix.Unref(k) {
				t.Errorf("track %v: block %d still marked after Unref", track, i)
			}
		}
		// Marked, then changed by writers: answers and holders as without the mark.
		ix.Match(q, &m)
		ix.Add(q[1], y)
		ix.Remove(q[0], x)
		ix.Match(q, &m)
		if got := result(t, ix, &m); got[radix.WorkerKey{ID: 2}] != 2 || got[radix.WorkerKey{ID: 1}] != 0 {
			t.Fatalf("track %v: after changes %v", track, got)
		}
		// All holders gone: dead, and a new key may take the slot over (Stats counts live ones).
		for _, k := range q {
			ix.Remove(k, x)
			ix.Remove(k, y)
		}
		if st := ix.Stats(); st.Entries != 0 || st.Residencies != 0 {
			t.Fatalf("track %v: %+v after removing every holder", track, st)
		}
		ix.Add(q[2], x)
		if ix.Stats().Entries != 1 || !ix.Has(q[2], x) {
			t.Fatalf("track %v: a block back after its death is not there", track)
		}
	}
}
