package radix_test

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/radix"
)

// FuzzIndex drives the index and the model with operations decoded from the input, three bytes
// each (op, worker, path), and compares matches after every operation. Up to 250 workers, so
// entries pass through every holder form; paths share prefixes.
func FuzzIndex(f *testing.F) {
	f.Add([]byte{0, 1, 7, 0, 2, 7, 1, 1, 3, 2, 0, 7})
	seed := make([]byte, 600)
	for i := range seed {
		seed[i] = byte(i * 37)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		ix := newIndex(t, 16)
		model := refmodel.NewIndex()
		slots := map[uint64]radix.Slot{}
		slot := func(w uint64) radix.Slot {
			s, ok := slots[w]
			if !ok {
				s = acquire(t, ix, w)
				slots[w] = s
			}
			return s
		}
		var m radix.Match
		for ; len(data) >= 3; data = data[3:] {
			op, w, p := data[0], uint64(data[1]%250), data[2]
			// A path of 1-4 blocks over a 2-letter alphabet, from the byte's bits.
			contents := make([]uint64, 1+p>>6)
			for i := range contents {
				contents[i] = uint64(p >> i & 1)
			}
			q := chain(contents...)
			key := radix.WorkerKey{ID: w}
			switch op % 5 {
			case 0, 1:
				for _, k := range q {
					if ix.Add(k, slot(w)) != model.Add(k, key) {
						t.Fatal("Add disagrees with the model")
					}
				}
			case 2:
				k := q[len(q)-1]
				if ix.Remove(k, slot(w)) != model.Remove(k, key) {
					t.Fatal("Remove disagrees with the model")
				}
			case 3:
				// The worker leaves: drop everything, free the slot (a later worker reuses it).
				if s, ok := slots[w]; ok {
					for seq := range model.BlocksOf(key) {
						ix.Remove(seq, s)
						model.Remove(seq, key)
					}
					if err := ix.Release(s); err != nil {
						t.Fatal(err)
					}
					delete(slots, w)
				}
			case 4:
				compareMatch(t, ix, model, q, &m)
			}
		}
		for _, root := range [][]uint64{chain(0, 0, 0, 0), chain(1, 1, 1, 1), chain(0, 1, 0, 1), chain(1, 0, 1, 0)} {
			compareMatch(t, ix, model, root, &m)
		}
	})
}
