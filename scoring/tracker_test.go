package scoring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
)

func mustRegister(t testing.TB, tr *Tracker, id uint64) *Load {
	t.Helper()
	l, err := tr.Register(radix.WorkerKey{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestTrackerLifecycle(t *testing.T) {
	tr := NewTracker()
	w := mustRegister(t, tr, 1)
	load := func(blocks, prefill, reqs int64) {
		t.Helper()
		if w.ActiveBlocks() != blocks || w.ActivePrefill() != prefill || w.Requests() != reqs {
			t.Fatalf("load %d blocks %d prefill %d requests, want %d %d %d",
				w.ActiveBlocks(), w.ActivePrefill(), w.Requests(), blocks, prefill, reqs)
		}
	}
	// a: blocks 10 20 30; b shares 10 20 and adds 40.
	if err := tr.Book("a", w, []uint64{10, 20, 30}, 50, 100); err != nil {
		t.Fatal(err)
	}
	load(3, 50, 1)
	if err := tr.Book("a", w, []uint64{10}, 1, 100); err != ErrDuplicateRequest {
		t.Fatalf("duplicate id: %v", err)
	}
	if err := tr.Book("b", w, []uint64{10, 20, 40}, 16, 200); err != nil {
		t.Fatal(err)
	}
	load(4, 66, 2) // 10 and 20 count once

	var m radix.Match
	tr.Match([]uint64{10, 20, 30, 99}, &m)
	if len(m.Slots) != 1 || m.Slots[0] != w.Slot() || m.Depth[0] != 3 {
		t.Fatalf("active match %v depth %v, want slot %d depth 3", m.Slots, m.Depth, w.Slot())
	}

	if err := tr.PrefillDone("a"); err != nil {
		t.Fatal(err)
	}
	if err := tr.PrefillDone("a"); err != nil {
		t.Fatal(err)
	}
	load(4, 16, 2)
	if err := tr.Complete("a"); err != nil {
		t.Fatal(err)
	}
	load(3, 16, 1) // 30 freed; 10 and 20 still used by b
	if err := tr.Complete("a"); err != ErrUnknownRequest {
		t.Fatalf("second complete: %v", err)
	}
	if err := tr.PrefillDone("zzz"); err != ErrUnknownRequest {
		t.Fatalf("unknown prefill done: %v", err)
	}
	// b expires at 200: not at 200, at 201.
	if n := tr.Expire(200); n != 0 {
		t.Fatalf("expired %d at the deadline", n)
	}
	if n := tr.Expire(201); n != 1 {
		t.Fatalf("expired %d after the deadline", n)
	}
	load(0, 0, 0)
	tr.Match([]uint64{10}, &m)
	if len(m.Slots) != 0 || tr.Active() != 0 {
		t.Fatalf("after expiry: active slots %v, %d requests", m.Slots, tr.Active())
	}
	if err := tr.Book("", w, nil, 0, 0); err != ErrRequestID {
		t.Fatalf("empty id: %v", err)
	}
}

func TestTrackerUnregister(t *testing.T) {
	tr := NewTracker()
	w := mustRegister(t, tr, 1)
	if err := tr.Book("a", w, []uint64{1, 2}, 32, 10); err != nil {
		t.Fatal(err)
	}
	if err := tr.Book("short", w, nil, 5, 10); err != nil { // a prompt shorter than a block
		t.Fatal(err)
	}
	if got := tr.AppendBusy(nil); len(got) != 1 || got[0] != w.Slot() {
		t.Fatalf("busy slots %v, want [%d]", got, w.Slot())
	}
	tr.Unregister(w)
	if w.ActiveBlocks() != 0 || w.ActivePrefill() != 0 {
		t.Fatal("unregistered worker still carries load")
	}
	if got := tr.AppendBusy(nil); len(got) != 0 {
		t.Fatalf("unregistered worker still busy: %v", got)
	}
	if err := tr.Book("b", w, []uint64{1}, 1, 10); err != ErrWorkerGone {
		t.Fatalf("booking on an unregistered worker: %v", err)
	}
	for _, id := range []string{"a", "short"} { // the requests are still known and complete cleanly
		if err := tr.Complete(id); err != nil {
			t.Fatal(err)
		}
	}
	if tr.Active() != 0 {
		t.Fatalf("%d requests left", tr.Active())
	}
	w2 := mustRegister(t, tr, 1)
	if w2.ActiveBlocks() != 0 {
		t.Fatal("re-registered worker inherited load")
	}
}

// TestTrackerConcurrent books, finishes and expires requests from many goroutines and checks
// that the load returns to zero and the active blocks match a recount.
func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker()
	ws := []*Load{mustRegister(t, tr, 1), mustRegister(t, tr, 2), mustRegister(t, tr, 3)}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			var m radix.Match
			for i := range 3000 {
				id := fmt.Sprintf("g%d-%d", g, i)
				w := ws[rng.IntN(len(ws))]
				seqs := make([]uint64, 1+rng.IntN(8))
				for j := range seqs {
					// Chained, with shared prefixes: two branches per level.
					seqs[j] = uint64(rng.IntN(2)) + 1
					if j > 0 {
						seqs[j] += seqs[j-1] * 1_000_003
					}
				}
				if err := tr.Book(id, w, seqs, int64(rng.IntN(100)), int64(i)); err != nil {
					t.Error(err)
					return
				}
				tr.Match(seqs, &m)
				if rng.IntN(2) == 0 {
					_ = tr.PrefillDone(id)
				}
				if rng.IntN(4) != 0 {
					_ = tr.Complete(id) // may race with Expire: either frees it once
				} else if rng.IntN(8) == 0 {
					tr.Expire(int64(i - 50))
				}
			}
		}()
	}
	wg.Wait()
	tr.Expire(1 << 62)
	for _, w := range ws {
		if w.ActiveBlocks() != 0 || w.ActivePrefill() != 0 || w.Requests() != 0 || w.refs.Len() != 0 {
			t.Fatalf("worker %d: %d blocks %d prefill %d requests %d refs left", w.key.ID,
				w.ActiveBlocks(), w.ActivePrefill(), w.Requests(), w.refs.Len())
		}
	}
	if st := tr.roots.Stats(); st.Residencies != 0 {
		t.Fatalf("%d active residencies left", st.Residencies)
	}
}

func TestTrackerBookAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	tr := NewTracker()
	w := mustRegister(t, tr, 1)
	seqs := make([]uint64, 128)
	for i := range seqs {
		seqs[i] = uint64(i + 1)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if err := tr.Book("request-0001", w, seqs, 100, 1); err != nil {
			t.Fatal(err)
		}
		if err := tr.PrefillDone("request-0001"); err != nil {
			t.Fatal(err)
		}
		if err := tr.Complete("request-0001"); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("book, prefill done and complete allocate %v times", n)
	}
}

// TestTrackerMatchModel books and completes random requests whose chained blocks branch off a
// few shared prefixes, and after each step checks every worker's active blocks and the shared
// prefix Match and Shared report, and the busy workers, against a recount from the requests in
// flight. Workers carry from none to
// about three times scanRequests requests, so both ways of finding the shared prefix are used.
func TestTrackerMatchModel(t *testing.T) {
	tr := NewTracker()
	ws := []*Load{mustRegister(t, tr, 1), mustRegister(t, tr, 2), mustRegister(t, tr, 3)}
	rng := rand.New(rand.NewPCG(7, 11))
	// chain makes a sequence of n blocks taking branch choices from a small alphabet, so that
	// sequences share prefixes of every length.
	chain := func(n int) []uint64 {
		seqs := make([]uint64, n)
		h := uint64(0)
		for i := range seqs {
			h = h*1_000_003 + uint64(rng.IntN(3)) + 1
			seqs[i] = h
		}
		return seqs
	}
	type req struct {
		id   string
		w    int
		seqs []uint64
	}
	var live []req
	model := func(w int, q []uint64) (blocks int64, shared int32) {
		seen := map[uint64]bool{}
		for _, r := range live {
			if r.w != w {
				continue
			}
			n := int32(0)
			for n < int32(min(len(q), len(r.seqs))) && q[n] == r.seqs[n] {
				n++
			}
			shared = max(shared, n)
			for _, s := range r.seqs {
				seen[s] = true
			}
		}
		return int64(len(seen)), shared
	}
	var m radix.Match
	for step := range 4000 {
		grow := len(live) < 20 || (len(live) < 150 && rng.IntN(2) == 0)
		if grow {
			r := req{id: fmt.Sprintf("r%d", step), w: rng.IntN(len(ws)), seqs: chain(1 + rng.IntN(12))}
			if err := tr.Book(r.id, ws[r.w], r.seqs, 1, 1<<60); err != nil {
				t.Fatal(err)
			}
			live = append(live, r)
		} else {
			k := rng.IntN(len(live))
			if err := tr.Complete(live[k].id); err != nil {
				t.Fatal(err)
			}
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		q := chain(1 + rng.IntN(12))
		if rng.IntN(2) == 0 && len(live) > 0 { // a query that extends a request in flight
			r := live[rng.IntN(len(live))]
			k := rng.IntN(len(r.seqs)) + 1
			q = append(slices.Clone(r.seqs[:k]), q...)
			for i := k; i < len(q); i++ {
				q[i] = q[i-1]*1_000_003 + q[i]%4
			}
		}
		tr.Match(q, &m)
		got := map[radix.Slot]int32{}
		for i, s := range m.Slots {
			got[s] = m.Depth[i]
		}
		var busy []radix.Slot
		for i, w := range ws {
			if slices.ContainsFunc(live, func(r req) bool { return r.w == i }) {
				busy = append(busy, w.Slot())
			}
		}
		if got := tr.AppendBusy(nil); !slices.Equal(got, busy) {
			t.Fatalf("step %d: busy slots %v, want %v", step, got, busy)
		}
		for i, w := range ws {
			blocks, shared := model(i, q)
			if n := tr.Shared(w, q); int32(n) != shared {
				t.Fatalf("step %d: worker %d: Shared %d, model %d", step, i, n, shared)
			}
			if w.ActiveBlocks() != blocks {
				t.Fatalf("step %d: worker %d has %d active blocks, model %d", step, i, w.ActiveBlocks(), blocks)
			}
			if got[w.Slot()] != shared {
				t.Fatalf("step %d: worker %d shares %d blocks of the query (%d requests), model %d",
					step, i, got[w.Slot()], len(w.active), shared)
			}
		}
	}
}

// TestTrackerUnchained books requests whose blocks are not chained, as a faulty peer could send
// them, across both ways of counting, and checks that the tracker stays sound: a worker never
// shares more blocks than it has active, and once every request is done nothing is left active,
// in the roots index or in the busy bitmap, and the worker's slot can be released.
func TestTrackerUnchained(t *testing.T) {
	tr := NewTracker()
	w := mustRegister(t, tr, 1)
	rng := rand.New(rand.NewPCG(5, 6))
	var live []string
	for step := range 3000 {
		if len(live) < 40 && rng.IntN(3) != 0 || len(live) == 0 {
			seqs := make([]uint64, rng.IntN(6))
			for i := range seqs {
				seqs[i] = uint64(rng.IntN(5)) // any block anywhere
			}
			id := fmt.Sprintf("u%d", step)
			if err := tr.Book(id, w, seqs, 1, 1<<60); err != nil {
				t.Fatal(err)
			}
			live = append(live, id)
		} else {
			k := rng.IntN(len(live))
			if err := tr.Complete(live[k]); err != nil {
				t.Fatal(err)
			}
			live = slices.Delete(live, k, k+1)
		}
		q := make([]uint64, 8) // longer than the five distinct blocks can make active
		for i := range q {
			q[i] = uint64(rng.IntN(5))
		}
		if n := tr.Shared(w, q); int64(n) > w.ActiveBlocks() {
			t.Fatalf("step %d: %d blocks shared, %d active", step, n, w.ActiveBlocks())
		}
	}
	for _, id := range live {
		if err := tr.Complete(id); err != nil {
			t.Fatal(err)
		}
	}
	if w.ActiveBlocks() != 0 || len(tr.AppendBusy(nil)) != 0 {
		t.Fatalf("idle worker: %d active blocks, busy %v", w.ActiveBlocks(), tr.AppendBusy(nil))
	}
	if st := tr.roots.Stats(); st.Residencies != 0 {
		t.Fatalf("%d first blocks left in the roots index", st.Residencies)
	}
	tr.Unregister(w)
	if _, inUse := tr.roots.Worker(w.Slot()); inUse {
		t.Fatal("the unregistered worker's slot was not released")
	}
}
