package shard_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

func enqueue(t *testing.T, set *shard.Set, ix *radix.Index, worker uint64, evs ...*shard.Event) {
	t.Helper()
	b := set.NewBatch(ix, worker)
	for _, ev := range evs {
		b.Add(ev)
	}
	if err := set.Enqueue(b); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond; it only bounds how long a broken build hangs, it asserts no timing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// A full queue pushes back: TryEnqueue refuses, Enqueue waits (and is counted), nothing is lost.
func TestSetBackpressure(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	set := shard.New(shard.Config{Shards: 1, QueueLen: 2})
	defer set.Close()

	entered, release := make(chan struct{}), make(chan struct{})
	go set.Do(1, func(*shard.Applier) { close(entered); <-release })
	<-entered // the shard is busy; its queue is empty

	for i := range 2 {
		b := set.NewBatch(ix, 1)
		b.Add(stored(uint64(i+1), []uint64{uint64(i + 1)}, uint32(i)))
		if err := set.TryEnqueue(b); err != nil {
			t.Fatalf("TryEnqueue %d into a queue with room: %v", i, err)
		}
	}
	b := set.NewBatch(ix, 1)
	b.Add(stored(3, []uint64{3}, 2))
	if err := set.TryEnqueue(b); !errors.Is(err, shard.ErrQueueFull) {
		t.Fatalf("TryEnqueue into a full queue: %v, want ErrQueueFull", err)
	}
	if d := set.Stats().QueueDepth; d != 2 {
		t.Fatalf("queue depth %d, want 2", d)
	}
	done := make(chan error)
	go func() { done <- set.Enqueue(b) }()
	waitFor(t, "Enqueue to wait", func() bool { return set.Stats().EnqueueWaits == 1 })
	select {
	case err := <-done:
		t.Fatalf("Enqueue into a full queue returned %v without waiting", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := set.Barrier(); err != nil {
		t.Fatal(err)
	}
	if st := set.Stats(); st.Events != 3 || st.StoredBlocks != 3 || st.Batches != 3 {
		t.Fatalf("after the barrier: %+v", st)
	}
}

func TestSetClose(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	set := shard.New(shard.Config{Shards: 3})
	for w := range uint64(20) {
		enqueue(t, set, ix, w, stored(1, []uint64{1, 2}, 1, 2))
	}
	set.Close()
	// Everything enqueued before Close was applied.
	if st := ix.Stats(); st.Residencies != 40 {
		t.Fatalf("residencies after Close %d, want 40", st.Residencies)
	}
	if err := set.Enqueue(set.NewBatch(ix, 1)); !errors.Is(err, shard.ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}
	for name, err := range map[string]error{
		"Barrier":      set.Barrier(),
		"RemoveWorker": set.RemoveWorker(1),
		"Do":           set.Do(1, func(*shard.Applier) {}),
	} {
		if !errors.Is(err, shard.ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	set.Close() // idempotent
}

// A removal applies after the worker's earlier events, and frees its slots.
func TestSetRemoveWorker(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	set := shard.New(shard.Config{Shards: 4})
	defer set.Close()
	for w := range uint64(10) {
		enqueue(t, set, ix, w, stored(1, []uint64{1, 2, 3}, 1, 2, 3))
		if w%2 == 0 {
			if err := set.RemoveWorker(w); err != nil {
				t.Fatal(err)
			}
		}
	}
	set.Barrier()
	for w := range uint64(10) {
		_, has := ix.Lookup(radix.WorkerKey{ID: w})
		if has != (w%2 == 1) {
			t.Errorf("worker %d: has slot = %v", w, has)
		}
		var blocks int
		set.Do(w, func(a *shard.Applier) { blocks = a.Blocks(w) })
		if want := 3 * int(w%2); blocks != want {
			t.Errorf("worker %d: %d blocks, want %d", w, blocks, want)
		}
	}
	if st := set.Stats(); st.WorkersRemoved != 5 || st.Residencies != 15 {
		t.Fatalf("stats %+v", st)
	}
}

func TestShardOfSpreads(t *testing.T) {
	set := shard.New(shard.Config{Shards: 7})
	defer set.Close()
	if set.Shards() != 7 {
		t.Fatalf("%d shards", set.Shards())
	}
	count := make([]int, 7)
	for w := range uint64(7000) {
		s := set.ShardOf(w)
		if s != set.ShardOf(w) {
			t.Fatal("ShardOf is not stable")
		}
		count[s]++
	}
	for s, n := range count {
		if n < 700 || n > 1300 {
			t.Errorf("shard %d owns %d of 7000 workers", s, n)
		}
	}
}

// Steady state: re-storing known blocks, or blocks other workers already hold, allocates nothing,
// directly or through the Set's pooled batches.
func TestApplySteadyStateAllocs(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: 16})
	a := shard.NewApplier(0, nil)
	tokens := make([]uint32, 16*32)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	hashes := make([]uint64, 32)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	store := &shard.Event{Kind: shard.Stored, Hashes: hashes, Tokens: tokens}
	remove := &shard.Event{Kind: shard.Removed, Hashes: hashes}
	a.Apply(ix, 1, store) // worker 1 holds the chain: the entries exist
	a.Apply(ix, 2, store)
	if n := testing.AllocsPerRun(200, func() { a.Apply(ix, 2, store) }); n != 0 {
		t.Errorf("re-store of known blocks: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(200, func() {
		a.Apply(ix, 2, remove)
		a.Apply(ix, 2, store)
	}); n != 0 {
		t.Errorf("remove + store into existing entries: %v allocs, want 0", n)
	}

	// Small queues: the warm-up below reaches the most batches that can be in flight, after
	// which the free list always has one.
	set := shard.New(shard.Config{Shards: 2, QueueLen: 4})
	defer set.Close()
	run := func() {
		for w := uint64(10); w < 14; w++ {
			for _, ev := range []*shard.Event{store, remove} {
				b := set.NewBatch(ix, w)
				b.Add(ev)
				set.Enqueue(b)
			}
		}
	}
	for range 100 {
		run()
	}
	set.Barrier()
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("pooled batches through the Set: %v allocs, want 0", n)
	}
}

// Close racing with producers: every Enqueue that returned nil was applied; the others were
// refused with ErrClosed, none lost in between.
func TestSetCloseWhileEnqueueing(t *testing.T) {
	for round := range 200 {
		ix, _ := radix.New(radix.Config{BlockSize: bs})
		set := shard.New(shard.Config{Shards: 2, QueueLen: 2})
		accepted := make([]int, 4)
		done := make(chan struct{})
		for p := range accepted {
			go func() {
				defer func() { done <- struct{}{} }()
				w := uint64(p)
				for i := 1; ; i++ {
					b := set.NewBatch(ix, w)
					b.Add(stored(uint64(i), []uint64{uint64(i)}, uint32(i)))
					if err := set.Enqueue(b); err != nil {
						if !errors.Is(err, shard.ErrClosed) {
							t.Errorf("Enqueue: %v", err)
						}
						return
					}
					accepted[p]++
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		set.Close()
		for range accepted {
			<-done
		}
		total := 0
		for _, n := range accepted {
			total += n
		}
		if st := set.Stats(); st.Events != int64(total) || ix.Stats().Residencies != int64(total) {
			t.Fatalf("round %d: %d batches accepted, %d events applied, %d residencies",
				round, total, st.Events, ix.Stats().Residencies)
		}
	}
}

// A batch owns what it carries: the LoRA name's buffer may change once Add returns, and the
// batch's Applied counter counts its events once they apply.
func TestBatchOwnsItsEvents(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	set := shard.New(shard.Config{Shards: 2})
	defer set.Close()
	buf := []byte("adapter-a")
	ev := stored(1, []uint64{1}, 1)
	ev.LoRA = unsafe.String(&buf[0], len(buf)) // as a zero-copy decoder hands it over
	var applied atomic.Int64
	b := set.NewBatch(ix, 9)
	b.Applied = &applied
	b.Add(ev)
	copy(buf, "XXXXXXXXX")
	if err := set.Enqueue(b); err != nil {
		t.Fatal(err)
	}
	set.Barrier()
	if applied.Load() != 1 {
		t.Fatalf("applied %d, want 1", applied.Load())
	}
	var m radix.Match
	ix.MatchTokens(blk(1), radix.LoRASeed("adapter-a"), &m)
	if len(m.Slots) != 1 || m.Depth[0] != 1 {
		t.Fatalf("the block is not under adapter-a: %+v", m)
	}
}
