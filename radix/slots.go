package radix

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// Slot is the dense number an Index gives one worker (worker id, data-parallel rank). Holder sets
// store slots, not worker ids, so that they stay small.
type Slot uint32

// WorkerKey identifies one engine instance: a worker and one of its data-parallel ranks.
type WorkerKey struct {
	ID   uint64
	Rank uint32
}

func (k WorkerKey) String() string { return fmt.Sprintf("%d/%d", k.ID, k.Rank) }

// MaxSlots is how many workers (worker, rank pairs) one Index can hold at once: an inline holder
// field is 20 bits wide and stores slot+1.
const MaxSlots = 1<<fieldBits - 1

const slotChunk = 1024

var (
	// ErrFull is returned by Acquire when the index already holds MaxSlots workers.
	ErrFull = errors.New("radix: no free worker slot")
	// ErrBusy is returned by Release while the slot still holds blocks.
	ErrBusy = errors.New("radix: slot still holds blocks")
	// ErrUnknownSlot is returned by Release for a slot that is not in use.
	ErrUnknownSlot = errors.New("radix: unknown slot")
)

// slotInfo is who holds a slot. It changes only in Acquire and Release.
type slotInfo struct {
	id   atomic.Uint64
	rank atomic.Uint32
	live atomic.Bool
}

// slotChunkData is a chunk of slots: who holds each, and blocks[t][i], the number of residencies
// slot i of the chunk has in the index of tier t (the tiers of a model share one slot table).
// The counters are dense rather than one cache line per slot: a route answering every worker
// reads all of them (FillBlocks), which was a line per worker. Their writers, one shard per
// worker, each change them once per residency, so neighbouring slots' shards share a line; with
// two shards (all this machine has) that measured no slower in BenchmarkShardApply, and more
// shards writing one line are untested. blocks starts on a cache line (the check below, and a
// chunk is a large allocation, page-aligned), so eight counters share each line.
type slotChunkData struct {
	info   [slotChunk]slotInfo
	blocks [kvevent.NumTiers][slotChunk]atomic.Int64
}

// blocks must start on a cache line: its offset is a multiple of 64.
var _ [0]struct{} = [unsafe.Offsetof(slotChunkData{}.blocks) % 64]struct{}{}

// slotTable maps workers to dense slots. Acquire and Release serialize on mu; readers use the
// chunk pointers and atomics without locking. Chunks never move, so a *slotInfo stays valid.
type slotTable struct {
	mu     sync.Mutex
	byKey  map[WorkerKey]Slot // REQUIRES mu
	free   []Slot             // REQUIRES mu; released slots, reused oldest first
	high   atomic.Uint32      // slots ever handed out; every slot in use is < high
	chunks [(MaxSlots + slotChunk - 1) / slotChunk]atomic.Pointer[slotChunkData]
}

func (t *slotTable) info(s Slot) *slotInfo {
	return &t.chunks[s/slotChunk].Load().info[s%slotChunk]
}

// count is slot s's residency counter in tier tier.
func (t *slotTable) count(s Slot, tier kvevent.Tier) *atomic.Int64 {
	return &t.chunks[s/slotChunk].Load().blocks[tier][s%slotChunk]
}

func (t *slotTable) acquire(k WorkerKey) (Slot, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.byKey[k]; ok {
		return s, nil
	}
	var s Slot
	if len(t.free) > 0 {
		s = t.free[0]
		t.free = t.free[1:]
	} else {
		h := t.high.Load()
		if h >= MaxSlots {
			return 0, ErrFull
		}
		s = Slot(h)
		if t.chunks[s/slotChunk].Load() == nil {
			t.chunks[s/slotChunk].Store(new(slotChunkData))
		}
		t.high.Store(h + 1)
	}
	if t.byKey == nil {
		t.byKey = make(map[WorkerKey]Slot)
	}
	t.byKey[k] = s
	in := t.info(s)
	in.id.Store(k.ID)
	in.rank.Store(k.Rank)
	in.live.Store(true)
	return s, nil
}

func (t *slotTable) release(s Slot) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if uint32(s) >= t.high.Load() || !t.info(s).live.Load() {
		return ErrUnknownSlot
	}
	in := t.info(s)
	for tier := range kvevent.NumTiers {
		if n := t.count(s, kvevent.Tier(tier)).Load(); n != 0 {
			return fmt.Errorf("%w: slot %d holds %d in tier %v", ErrBusy, s, n, kvevent.Tier(tier))
		}
	}
	delete(t.byKey, WorkerKey{in.id.Load(), in.rank.Load()})
	in.live.Store(false)
	t.free = append(t.free, s)
	return nil
}

// Acquire returns the slot of worker k, giving it a new one if it has none. Safe for concurrent use.
func (ix *Index) Acquire(k WorkerKey) (Slot, error) { return ix.slots.acquire(k) }

// Release frees slot s for reuse. The slot must hold no blocks any more, in any tier: remove them
// first, or a later worker given the same slot would inherit them. Safe for concurrent use.
func (ix *Index) Release(s Slot) error { return ix.slots.release(s) }

// Lookup returns the slot of worker k, if it has one. Safe for concurrent use.
func (ix *Index) Lookup(k WorkerKey) (Slot, bool) {
	ix.slots.mu.Lock()
	s, ok := ix.slots.byKey[k]
	ix.slots.mu.Unlock()
	return s, ok
}

// Worker returns the worker that slot s belongs to. Lock-free. A slot released and reused while a
// caller holds it from an earlier Match names the new worker.
func (ix *Index) Worker(s Slot) (WorkerKey, bool) {
	if uint32(s) >= ix.slots.high.Load() {
		return WorkerKey{}, false
	}
	in := ix.slots.info(s)
	return WorkerKey{in.id.Load(), in.rank.Load()}, in.live.Load()
}

// Blocks returns how many blocks slot s holds in this index's tier. Lock-free.
func (ix *Index) Blocks(s Slot) int64 {
	if uint32(s) >= ix.slots.high.Load() {
		return 0
	}
	return ix.slots.count(s, ix.tier).Load()
}

// FillBlocks sets blocks[i] to the block count of slots[i], as Blocks does, for slots that
// Acquire returned at some time (released ones included). It is cheapest with slots ascending.
// Lock-free.
func (ix *Index) FillBlocks(slots []Slot, blocks []int64) {
	high := Slot(ix.slots.high.Load())
	blocks = blocks[:len(slots)]
	var chunk *[slotChunk]atomic.Int64
	cur := Slot(1<<32 - 1)
	for i, s := range slots {
		if s >= high {
			panic(fmt.Sprintf("radix: FillBlocks of slot %d, never acquired", s))
		}
		if c := s / slotChunk; c != cur {
			chunk, cur = &ix.slots.chunks[c].Load().blocks[ix.tier], c
		}
		blocks[i] = chunk[s%slotChunk].Load()
	}
}

// WorkerBlocks is one worker's slot and its total cached block count.
type WorkerBlocks struct {
	Slot   Slot
	Worker WorkerKey
	Blocks int64
}

// AppendWorkers appends every worker currently holding a slot, in slot order. Lock-free.
func (ix *Index) AppendWorkers(dst []WorkerBlocks) []WorkerBlocks {
	n := Slot(ix.slots.high.Load())
	for s := Slot(0); s < n; s++ {
		in := ix.slots.info(s)
		if !in.live.Load() {
			continue
		}
		dst = append(dst, WorkerBlocks{s, WorkerKey{in.id.Load(), in.rank.Load()}, ix.slots.count(s, ix.tier).Load()})
	}
	return dst
}
