//go:build invariants

package radix

import "testing"

// keysWithHome returns n keys of segment 0 whose probes start in the same bucket.
func keysWithHome(ix *Index, n int) []uint64 {
	tab := ix.segs[0].tab.Load()
	var keys []uint64
	home := -1
	for k := uint64(1); len(keys) < n; k++ {
		m := ix.mix(k)
		if m>>(64-segBits) != 0 {
			continue
		}
		if home < 0 {
			home = tab.home(m)
		}
		if tab.home(m) == home {
			keys = append(keys, k)
		}
	}
	return keys
}

// A reader matches the key of a dead entry; before it loads the holder word, a writer gives the
// slot to another key. The reader must answer "no holders", not the new key's holders. Both
// lookup paths: the key in its home bucket (bucket.find) and further down the probe (findFrom).
func TestReaderSeesTakeover(t *testing.T) {
	for _, further := range []bool{false, true} {
		ix, _ := New(Config{BlockSize: 16})
		a, _ := ix.Acquire(WorkerKey{ID: 1})
		b, _ := ix.Acquire(WorkerKey{ID: 2})
		keys := keysWithHome(ix, 6)
		if further {
			for _, k := range keys[:bucketSlots] {
				ix.Add(k, a) // fill the home bucket: the next key lands in the next bucket
			}
			keys = keys[bucketSlots:]
		}
		dying, newcomer := keys[0], keys[1]
		ix.Add(dying, a)
		ix.Remove(dying, a)
		pauseHook = func() { ix.Add(newcomer, b) } // takes over dying's slot
		if got := ix.AppendHolders(nil, dying); len(got) != 0 {
			t.Fatalf("further=%v: a dead key read as held by %v (the newcomer's holders)", further, got)
		}
		if pauseHook != nil {
			t.Fatalf("further=%v: the lookup never reached the pause point", further)
		}
		if !ix.Has(newcomer, b) || ix.Has(dying, b) {
			t.Fatalf("further=%v: wrong state after the takeover", further)
		}
	}
}
