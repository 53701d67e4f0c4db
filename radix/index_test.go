package radix_test

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/radix"
)

func newIndex(t testing.TB, bs int) *radix.Index {
	t.Helper()
	ix, err := radix.New(radix.Config{BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func acquire(t testing.TB, ix *radix.Index, id uint64) radix.Slot {
	t.Helper()
	s, err := ix.Acquire(radix.WorkerKey{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// chain returns n sequence hashes of a chain whose blocks have the given content ids.
func chain(contents ...uint64) []uint64 {
	out := make([]uint64, len(contents))
	for i, c := range contents {
		out[i] = c*0x9e3779b97f4a7c15 + 1
	}
	radix.ChainInPlace(out, 0, false)
	return out
}

// result turns a Match into worker → depth, checking its shape on the way.
func result(t testing.TB, ix *radix.Index, m *radix.Match) map[radix.WorkerKey]int {
	t.Helper()
	out := map[radix.WorkerKey]int{}
	if len(m.Depth) != len(m.Slots) {
		t.Fatalf("match arrays differ in length: %d slots, %d depths", len(m.Slots), len(m.Depth))
	}
	for i, s := range m.Slots {
		if i > 0 && m.Slots[i-1] >= s {
			t.Fatalf("slots not strictly ascending: %v", m.Slots)
		}
		w, ok := ix.Worker(s)
		if !ok {
			t.Fatalf("slot %d in a match is not in use", s)
		}
		out[w] = int(m.Depth[i])
	}
	return out
}

func TestMatchContiguousPrefix(t *testing.T) {
	ix := newIndex(t, 16)
	q := chain(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	a, b, c, d := acquire(t, ix, 1), acquire(t, ix, 2), acquire(t, ix, 3), acquire(t, ix, 4)
	for i := range 5 {
		ix.Add(q[i], a) // a: blocks 0-4
	}
	for i := range 3 {
		ix.Add(q[i], b) // b: blocks 0-2
	}
	for _, i := range []int{0, 1, 3, 4} {
		ix.Add(q[i], c) // c: a hole at 2
	}
	for i := 1; i < 5; i++ {
		ix.Add(q[i], d) // d: everything but the first block
	}
	var m radix.Match
	ix.Match(q, &m)
	want := map[radix.WorkerKey]int{{ID: 1}: 5, {ID: 2}: 3, {ID: 3}: 2}
	if got := result(t, ix, &m); !maps.Equal(got, want) {
		t.Fatalf("match %v, want %v", got, want)
	}
	// The walk stops at block 5, which nobody holds: 6 lookups, not 10.
	if m.Lookups != 6 {
		t.Errorf("lookups %d, want 6", m.Lookups)
	}
	cached := make([]int64, len(m.Slots))
	ix.FillBlocks(m.Slots, cached)
	for i, s := range m.Slots {
		if cached[i] != ix.Blocks(s) {
			t.Errorf("slot %d: FillBlocks %d, Blocks %d", s, cached[i], ix.Blocks(s))
		}
	}
	if ix.Blocks(a) != 5 || ix.Blocks(d) != 4 {
		t.Errorf("blocks a=%d d=%d, want 5 and 4", ix.Blocks(a), ix.Blocks(d))
	}

	// A removal in the middle of a's chain cuts its depth there.
	if !ix.Remove(q[1], a) {
		t.Fatal("remove of a held block reported false")
	}
	if ix.Remove(q[1], a) {
		t.Fatal("second remove reported true")
	}
	ix.Match(q, &m)
	want = map[radix.WorkerKey]int{{ID: 1}: 1, {ID: 2}: 3, {ID: 3}: 2}
	if got := result(t, ix, &m); !maps.Equal(got, want) {
		t.Fatalf("after mid-chain removal: %v, want %v", got, want)
	}
	// Nobody holds an unknown first block; an empty query matches nothing.
	for _, q := range [][]uint64{chain(99, 2, 3), nil} {
		ix.Match(q, &m)
		if len(m.Slots) != 0 {
			t.Errorf("query %v matched %v", q, m.Slots)
		}
	}
}

// One entry goes through every holder form — inline, cells of each size, bitset — and its
// holders are right at every step, also while shrinking.
func TestHolderForms(t *testing.T) {
	ix := newIndex(t, 16)
	const n = 400
	slots := make([]radix.Slot, n)
	for i := range slots {
		slots[i] = acquire(t, ix, uint64(i))
	}
	key := chain(7)[0]
	other := chain(8)[0]
	r := rand.New(rand.NewPCG(3, 4))
	held := map[radix.Slot]bool{}
	check := func(step string) {
		t.Helper()
		want := slices.Sorted(maps.Keys(held))
		if got := ix.AppendHolders(nil, key); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("%s: holders %v, want %v", step, got, want)
		}
		for _, s := range slots[:50] {
			if ix.Has(key, s) != held[s] {
				t.Fatalf("%s: Has(%d) = %v", step, s, !held[s])
			}
		}
	}
	for _, i := range r.Perm(n) {
		if !ix.Add(key, slots[i]) {
			t.Fatalf("add %d reported not new", i)
		}
		ix.Add(other, slots[i])
		held[slots[i]] = true
		check("add")
		if ix.Add(key, slots[i]) {
			t.Fatalf("second add of %d reported new", i)
		}
	}
	for _, i := range r.Perm(n) {
		if !ix.Remove(key, slots[i]) {
			t.Fatalf("remove %d reported false", i)
		}
		delete(held, slots[i])
		check("remove")
		// Shrinking past a boundary and growing again must not lose anyone.
		if i%7 == 0 {
			ix.Add(key, slots[i])
			held[slots[i]] = true
			check("re-add")
			ix.Remove(key, slots[i])
			delete(held, slots[i])
		}
	}
	if st := ix.Stats(); st.Entries != 1 || st.Residencies != n {
		t.Fatalf("stats %+v, want 1 entry (the other key) and %d residencies", st, n)
	}
}

// A slot added after a bitset was sized must still fit.
func TestBitsetGrowsForNewSlots(t *testing.T) {
	ix := newIndex(t, 16)
	key := chain(1)[0]
	var slots []radix.Slot
	for i := range 70 {
		s := acquire(t, ix, uint64(i))
		slots = append(slots, s)
		ix.Add(key, s)
	}
	for i := 70; i < 1000; i++ {
		s := acquire(t, ix, uint64(i))
		slots = append(slots, s)
		if i%100 == 0 {
			ix.Add(key, s)
		}
	}
	for i, s := range slots {
		if want := i < 70 || i%100 == 0; ix.Has(key, s) != want {
			t.Fatalf("slot %d: Has = %v, want %v", s, !want, want)
		}
	}
}

func TestSlots(t *testing.T) {
	ix := newIndex(t, 16)
	k := radix.WorkerKey{ID: 42, Rank: 3}
	s, _ := ix.Acquire(k)
	if s2, _ := ix.Acquire(k); s2 != s {
		t.Fatalf("second Acquire gave %d, first %d", s2, s)
	}
	if got, ok := ix.Lookup(k); !ok || got != s {
		t.Fatalf("Lookup = %d, %v", got, ok)
	}
	if w, ok := ix.Worker(s); !ok || w != k {
		t.Fatalf("Worker(%d) = %v, %v", s, w, ok)
	}
	ix.Add(1, s)
	if err := ix.Release(s); !errors.Is(err, radix.ErrBusy) {
		t.Fatalf("Release of a slot holding blocks: %v, want ErrBusy", err)
	}
	ix.Remove(1, s)
	if err := ix.Release(s); err != nil {
		t.Fatal(err)
	}
	if err := ix.Release(s); !errors.Is(err, radix.ErrUnknownSlot) {
		t.Fatalf("double Release: %v, want ErrUnknownSlot", err)
	}
	if _, ok := ix.Worker(s); ok {
		t.Fatal("released slot still names a worker")
	}
	if _, ok := ix.Lookup(k); ok {
		t.Fatal("released worker still has a slot")
	}
	if s2, _ := ix.Acquire(radix.WorkerKey{ID: 7}); s2 != s {
		t.Fatalf("freed slot %d not reused (got %d)", s, s2)
	}
	if _, err := radix.New(radix.Config{}); !errors.Is(err, radix.ErrBlockSize) {
		t.Fatalf("block size 0: %v", err)
	}
}

// Entries that die are purged and the table shrinks; the same keys come back.
func TestIndexShrinksAndRevives(t *testing.T) {
	ix := newIndex(t, 16)
	s := acquire(t, ix, 1)
	keys := chain(slices.Collect(func(yield func(uint64) bool) {
		for i := range uint64(100000) {
			if !yield(i) {
				return
			}
		}
	})...)
	for _, k := range keys {
		ix.Add(k, s)
	}
	big := ix.Stats().TableSlots
	for _, k := range keys {
		ix.Remove(k, s)
	}
	st := ix.Stats()
	if st.Entries != 0 || st.Residencies != 0 {
		t.Fatalf("after removing all: %+v", st)
	}
	if st.TableSlots > big/4 {
		t.Fatalf("table did not shrink: %d slots, was %d", st.TableSlots, big)
	}
	for _, k := range keys[:1000] {
		ix.Add(k, s)
	}
	var m radix.Match
	ix.Match(keys[:1000], &m)
	if len(m.Slots) != 1 || m.Depth[0] != 1000 {
		t.Fatalf("re-added chain: slots %v depth %v", m.Slots, m.Depth)
	}
}

func TestMatchAllocs(t *testing.T) {
	for _, workers := range []int{3, 40, 300} {
		ix := newIndex(t, 16)
		q := chain(slices.Collect(func(yield func(uint64) bool) {
			for i := range uint64(64) {
				yield(i)
			}
		})...)
		for w := range workers {
			s := acquire(t, ix, uint64(w))
			for _, k := range q[:1+w%64] {
				ix.Add(k, s)
			}
		}
		var m radix.Match
		ix.Match(q, &m)
		if n := testing.AllocsPerRun(100, func() { ix.Match(q, &m) }); n != 0 {
			t.Errorf("%d workers: Match %v allocs, want 0", workers, n)
		}
		tokens := iota32(16 * 64)
		ix.MatchTokens(tokens, radix.BaseSeed, &m)
		if n := testing.AllocsPerRun(100, func() { ix.MatchTokens(tokens, radix.BaseSeed, &m) }); n != 0 {
			t.Errorf("%d workers: MatchTokens %v allocs, want 0", workers, n)
		}
		// Adding and removing a holder of existing inline entries allocates nothing either.
		s, _ := ix.Acquire(radix.WorkerKey{ID: 1 << 40})
		k := chain(1000)[0]
		ix.Add(k, s)
		if n := testing.AllocsPerRun(100, func() { ix.Remove(k, s); ix.Add(k, s) }); n != 0 {
			t.Errorf("%d workers: Remove+Add %v allocs, want 0", workers, n)
		}
	}
}

// tree is a universe of prefixes for randomized tests: every path of content ids up to depth
// over a small alphabet, so chains share prefixes.
type tree struct {
	alphabet, depth int
}

func (tr tree) path(r *rand.Rand, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = uint64(r.IntN(tr.alphabet))
	}
	return chain(c...)
}

func compareMatch(t testing.TB, ix *radix.Index, model *refmodel.Index, q []uint64, m *radix.Match) {
	t.Helper()
	if err := model.CheckMatch(ix, q, m); err != nil {
		t.Fatal(err)
	}
}

// Random adds and removes over shared prefixes, by enough workers to drive entries through all
// holder forms, checked against the model after every step.
// A long chain that a group of workers holds whole (the same holders at every block, which the
// walk skips without intersecting: inline words, cells and bitsets) still stops each worker
// exactly where its own chain ends, including workers that lack one block deep down.
func TestMatchGroupChain(t *testing.T) {
	for _, workers := range []int{3, 20, 300} {
		ix := newIndex(t, 16)
		const depth = 48
		q := make([]uint64, depth)
		for i := range q {
			q[i] = uint64(i + 1)
		}
		q = chain(q...)
		for w := range 1000 {
			acquire(t, ix, uint64(1e6+w)) // idle slots: 20 holders take cells, not a bitset
		}
		slots := make([]radix.Slot, workers)
		for w := range slots {
			slots[w] = acquire(t, ix, uint64(w))
		}
		want := map[radix.WorkerKey]int{}
		for w, s := range slots {
			n := depth
			switch {
			case w == 0:
				n = 10
			case workers > 100 && w%2 == 1:
				n = 1 // deeper blocks have every even worker: a strided bitset
			}
			for i := range n {
				ix.Add(q[i], s)
			}
			want[radix.WorkerKey{ID: uint64(w)}] = n
		}
		// A late worker joins the first 20 blocks only: it changes sets in place, and its
		// depth must end at 20 although the blocks after hold everyone else the same.
		late := acquire(t, ix, 1e9)
		for i := range 20 {
			ix.Add(q[i], late)
		}
		want[radix.WorkerKey{ID: 1e9}] = 20
		// Holes: worker 2 loses block 30, its depth ends there; worker 1 (or 2's neighbour)
		// loses the last block.
		last := 1
		if workers > 100 {
			last = 4
		}
		ix.Remove(q[30], slots[2])
		ix.Remove(q[depth-1], slots[last])
		want[radix.WorkerKey{ID: 2}], want[radix.WorkerKey{ID: uint64(last)}] = 30, depth-1
		var m radix.Match
		ix.Match(q, &m)
		if got := result(t, ix, &m); !maps.Equal(got, want) {
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%d workers: worker %d: depth %d, want %d", workers, k.ID, got[k], v)
				}
			}
			t.FailNow()
		}
		// Putting the holes back restores the whole chain.
		ix.Add(q[30], slots[2])
		ix.Add(q[depth-1], slots[last])
		want[radix.WorkerKey{ID: 2}], want[radix.WorkerKey{ID: uint64(last)}] = depth, depth
		ix.Match(q, &m)
		if got := result(t, ix, &m); !maps.Equal(got, want) {
			t.Fatalf("%d workers, after refilling the holes: %v", workers, got)
		}
	}
}

func TestIndexDifferential(t *testing.T) {
	for _, workers := range []int{4, 150} {
		r := rand.New(rand.NewPCG(uint64(workers), 5))
		ix := newIndex(t, 16)
		model := refmodel.NewIndex()
		tr := tree{alphabet: 3, depth: 6}
		for w := range 130 {
			acquire(t, ix, uint64(1e6+w)) // idle low slots: bitsets start with empty words
		}
		var slots []radix.Slot
		for w := range workers {
			slots = append(slots, acquire(t, ix, uint64(w)))
		}
		var m radix.Match
		steps := 20000
		if testing.Short() {
			steps = 4000
		}
		for step := range steps {
			w := r.IntN(workers)
			key := radix.WorkerKey{ID: uint64(w)}
			p := tr.path(r, 1+r.IntN(tr.depth))
			switch op := r.IntN(10); {
			case op < 6: // store a whole path, like an engine caching a prompt
				for _, k := range p {
					if ix.Add(k, slots[w]) != model.Add(k, key) {
						t.Fatalf("step %d: Add disagrees", step)
					}
				}
			case op < 9: // drop one block, often mid-chain
				k := p[r.IntN(len(p))]
				if ix.Remove(k, slots[w]) != model.Remove(k, key) {
					t.Fatalf("step %d: Remove disagrees", step)
				}
			default: // drop a whole path
				for _, k := range p {
					if ix.Remove(k, slots[w]) != model.Remove(k, key) {
						t.Fatalf("step %d: Remove disagrees", step)
					}
				}
			}
			compareMatch(t, ix, model, tr.path(r, 1+r.IntN(tr.depth+2)), &m)
		}
		st := ix.Stats()
		total := 0
		for _, n := range model.Workers() {
			total += n
		}
		if st.Residencies != int64(total) {
			t.Fatalf("residencies %d, model %d", st.Residencies, total)
		}
	}
}

// Holders joining and leaving a popular block across the inline/overflow boundary allocate
// nothing once the entry has reached its largest holder count (cells and bitset forms).
func TestHolderChurnAllocs(t *testing.T) {
	for _, workers := range []int{40, 300} {
		ix := newIndex(t, 16)
		var slots []radix.Slot
		for w := range workers {
			slots = append(slots, acquire(t, ix, uint64(w)))
		}
		key := chain(5)[0]
		ix.Add(key, slots[0])
		ix.Add(key, slots[1])
		cycle := func() {
			for _, s := range slots[2:8] {
				ix.Add(key, s)
			}
			for _, s := range slots[2:8] {
				ix.Remove(key, s)
			}
		}
		cycle()
		if n := testing.AllocsPerRun(100, cycle); n != 0 {
			t.Errorf("%d workers: %v allocs per churn cycle, want 0", workers, n)
		}
		if got := ix.AppendHolders(nil, key); !slices.Equal(got, slots[:2]) {
			t.Errorf("%d workers: holders after churn %v", workers, got)
		}
	}
}
