package radix_test

import (
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/radix"
)

// Readers run Match while writers churn the same entries. Workers that no writer touches
// ("stable") must be seen exactly by every read, whatever the churn does to the entries they share
// (holder-form changes, set reuse, segment rebuilds, slot reuse). At the end the index must equal
// the model of everything applied.
func TestIndexConcurrent(t *testing.T) {
	const (
		stable  = 40
		writers = 4
		churnW  = 60 // per writer
		readers = 3
	)
	ops := 6000
	if testing.Short() {
		ops = 1500
	}
	tr := tree{alphabet: 4, depth: 8}
	ix := newIndex(t, 16)
	stableModel := refmodel.NewIndex()
	r := rand.New(rand.NewPCG(11, 12))
	for w := range stable {
		s := acquire(t, ix, uint64(w))
		for range 60 {
			for _, k := range tr.path(r, 1+r.IntN(tr.depth)) {
				ix.Add(k, s)
				stableModel.Add(k, radix.WorkerKey{ID: uint64(w)})
			}
		}
	}

	var stop atomic.Bool
	var readErr atomic.Value
	var wgR, wgW sync.WaitGroup
	for g := range readers {
		wgR.Add(1)
		go func() {
			defer wgR.Done()
			r := rand.New(rand.NewPCG(uint64(g), 99))
			var m radix.Match
			for !stop.Load() {
				q := tr.path(r, 1+r.IntN(tr.depth+1))
				ix.Match(q, &m)
				want := stableModel.Match(q)
				seen := 0
				for i, s := range m.Slots {
					w, ok := ix.Worker(s)
					d := int(m.Depth[i])
					if d < 1 || d > len(q) {
						readErr.Store("depth out of range")
						return
					}
					if !ok || w.ID >= stable {
						continue
					}
					seen++
					if want[w] != d {
						readErr.Store("stable worker seen with a wrong depth")
						return
					}
				}
				if seen != len(want) {
					readErr.Store("stable worker missing from a match")
					return
				}
			}
		}()
	}

	models := make([]*refmodel.Index, writers)
	for g := range writers {
		models[g] = refmodel.NewIndex()
		wgW.Add(1)
		go func() {
			defer wgW.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			model := models[g]
			ids := make([]uint64, churnW)
			slots := make([]radix.Slot, churnW)
			for i := range ids {
				ids[i] = uint64(1000 + g*churnW + i)
				slots[i], _ = ix.Acquire(radix.WorkerKey{ID: ids[i]})
			}
			for range ops {
				i := r.IntN(churnW)
				key := radix.WorkerKey{ID: ids[i]}
				p := tr.path(r, 1+r.IntN(tr.depth))
				switch op := r.IntN(20); {
				case op < 11:
					for _, k := range p {
						ix.Add(k, slots[i])
						model.Add(k, key)
					}
				case op < 19:
					for _, k := range p[r.IntN(len(p)):] {
						ix.Remove(k, slots[i])
						model.Remove(k, key)
					}
				default:
					// Retire the worker and bring a new one in, possibly on the same slot.
					for _, seq := range allKeys(model, key) {
						ix.Remove(seq, slots[i])
						model.Remove(seq, key)
					}
					if err := ix.Release(slots[i]); err != nil {
						readErr.Store("release: " + err.Error())
						return
					}
					ids[i] += 1 << 32
					slots[i], _ = ix.Acquire(radix.WorkerKey{ID: ids[i]})
				}
			}
		}()
	}
	wgW.Wait()
	stop.Store(true)
	wgR.Wait()
	if e := readErr.Load(); e != nil {
		t.Fatal(e)
	}

	// Quiescent: everything must equal the union of the models.
	all := refmodel.NewIndex()
	for _, m := range append(models, stableModel) {
		for w := range m.Workers() {
			for _, seq := range allKeys(m, w) {
				all.Add(seq, w)
			}
		}
	}
	var m radix.Match
	for range 3000 {
		compareMatch(t, ix, all, tr.path(r, 1+r.IntN(tr.depth+1)), &m)
	}
	total := 0
	for _, n := range all.Workers() {
		total += n
	}
	if st := ix.Stats(); st.Residencies != int64(total) {
		t.Fatalf("residencies %d, model %d", st.Residencies, total)
	}
}

// allKeys returns the blocks w holds in model.
func allKeys(model *refmodel.Index, w radix.WorkerKey) []uint64 {
	return slices.Collect(maps.Keys(model.BlocksOf(w)))
}
