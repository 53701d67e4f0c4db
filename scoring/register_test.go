package scoring

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
)

// RegisterAll hands out one Load per key, in order, each on its own slot, as Register does one
// at a time.
func TestTrackerRegisterAll(t *testing.T) {
	tr := NewTracker()
	one, err := tr.Register(radix.WorkerKey{ID: 1})
	if err != nil {
		t.Fatal(err)
	}
	keys := []radix.WorkerKey{{ID: 2, Rank: 5}, {ID: 2, Rank: 0}, {ID: 3}}
	ls, err := tr.RegisterAll(keys, []*Load{one})
	if err != nil || len(ls) != 4 || ls[0] != one {
		t.Fatalf("got %v %v, want one's Load then three", ls, err)
	}
	seen := map[radix.Slot]bool{one.Slot(): true}
	for i, l := range ls[1:] {
		if l.Key() != keys[i] || seen[l.Slot()] {
			t.Fatalf("Load %d: key %v slot %d, want key %v on a slot of its own", i, l.Key(), l.Slot(), keys[i])
		}
		seen[l.Slot()] = true
	}
	if ls, err := tr.RegisterAll(nil, ls[:1]); err != nil || len(ls) != 1 {
		t.Fatalf("no keys: %v %v", ls, err)
	}
}
