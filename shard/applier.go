package shard

import (
	"slices"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/internal/u64map"
	"github.com/kvrouterd/kvrouterd/radix"
)

// Applier applies events to the index for the workers it owns: it keeps each worker's engine hash
// map, duplicate-content counts and event cursors. Every event of a worker must go through the
// same Applier, in order. An Applier is for one goroutine at a time (a shard's, or a test's).
type Applier struct {
	workers map[uint64]*worker
	budget  *budget
	allow   int64 // residencies reserved from budget and not used yet
	obs     Observer
	c       *counters
	// ClearOnGap drops a rank's blocks when an event arrives after a gap in its ids, before
	// applying it: the missed events may have removed blocks, which the index would otherwise
	// keep reporting. Set it before the first Apply.
	ClearOnGap bool
	// KeepTree keeps, for every block, its local hash (Dynamo's tokens_hash) and its parent,
	// which the sequence hash alone does not give back: what DumpTree needs to write the index
	// in Dynamo's form. It costs two map entries per block. Set it before the first Apply.
	KeepTree  bool
	unflushed int64 // residencies removed by the current call, counted once at its end

	h        radix.Hasher
	seqs     []uint64 // an event's sequence hashes
	locals   []uint64 // an event's local hashes, kept only with KeepTree
	loraName string
	saltName string
	loraSeed uint64
}

type worker struct {
	ix    *radix.Index
	ranks []*rankState
}

// rankState is one (worker, dp rank): one engine, one slot, one event stream.
type rankState struct {
	rank   uint32
	slot   radix.Slot
	last   uint64     // last event id applied; 0 = none yet
	batch  uint64     // Event.Batch of the last engine batch applied; 0 = none yet
	engine u64map.Map // engine hash → sequence hash
	// dup counts, per sequence hash, the engine hashes beyond the first that map to it (the
	// same content stored under two engine hashes, e.g. with different cache salts). A removal
	// of one of them must not drop the residency while another still holds it.
	dup map[uint64]uint32
	// tree, with KeepTree: sequence hash → local hash, and sequence hash → its parent's
	// sequence hash (none for the root of a chain). A block restored without them has no
	// local entry, and DumpTree leaves it out.
	tree *blockTree
}

type blockTree struct{ local, parent u64map.Map }

// newRank returns the state of a rank that has just been given slot.
func (a *Applier) newRank(rank uint32, slot radix.Slot) *rankState {
	r := &rankState{rank: rank, slot: slot}
	if a.KeepTree {
		r.tree = new(blockTree)
	}
	return r
}

// NewApplier returns an Applier for standalone use (tests, tools): at most maxBlocks residencies
// (0 = no limit), anomalies reported to obs (may be nil).
func NewApplier(maxBlocks int64, obs Observer) *Applier {
	return newApplier(newBudget(maxBlocks, 1), obs, new(counters))
}

func newApplier(b *budget, obs Observer, c *counters) *Applier {
	return &Applier{workers: make(map[uint64]*worker), budget: b, obs: obs, c: c, loraSeed: radix.BaseSeed}
}

// Stats returns the Applier's counters.
func (a *Applier) Stats() Stats {
	var s Stats
	a.c.addTo(&s)
	return s
}

func (w *worker) rank(r uint32) *rankState {
	for _, rs := range w.ranks {
		if rs.rank == r {
			return rs
		}
	}
	return nil
}

// Apply applies one event of worker id, whose model's index is ix, and returns what it did.
func (a *Applier) Apply(ix *radix.Index, id uint64, ev *Event) Outcome {
	o := Outcome{Worker: id, Rank: ev.Rank, EventID: ev.ID, Kind: ev.Kind}
	a.apply(ix, id, ev, &o)
	a.flushRemoved()
	a.c.events.Add(1)
	k := o.Kind
	if int(k) >= NumKinds {
		k = 0
	}
	a.c.byKind[k][o.Status].Add(1)
	if o.Skipped != 0 {
		a.c.skipped.Add(int64(o.Skipped))
	}
	if o.Gap != 0 {
		a.c.gaps.Add(1)
		a.c.missed.Add(int64(o.Gap))
	}
	if a.obs != nil && o.Anomalous() {
		a.obs.Observe(o)
	}
	return o
}

func (a *Applier) apply(ix *radix.Index, id uint64, ev *Event, o *Outcome) {
	w := a.workers[id]
	if w == nil {
		w = &worker{ix: ix}
		a.workers[id] = w
	} else if w.ix != ix {
		o.Status = WrongModel
		return
	}
	r := w.rank(ev.Rank)
	if r == nil {
		slot, err := ix.Acquire(radix.WorkerKey{ID: id, Rank: ev.Rank})
		if err != nil {
			o.Status = NoSlot
			return
		}
		r = a.newRank(ev.Rank, slot)
		w.ranks = append(w.ranks, r)
	}
	if ev.ID != 0 {
		if r.last != 0 && ev.ID <= r.last {
			o.Status = Duplicate
			return
		}
		if r.last != 0 && ev.ID > r.last+1 {
			o.Gap = ev.ID - r.last - 1
			if a.ClearOnGap {
				o.Cleared = a.clearRank(w, r)
				a.c.gapClears.Add(1)
			}
		}
		r.last = ev.ID
	}
	if ev.Batch != 0 {
		r.batch = ev.Batch
	}
	switch ev.Kind {
	case Stored:
		a.stored(w, r, ev, o)
	case Removed:
		a.removed(w, r, ev, o)
	case Cleared:
		// An engine clears its own cache: one (worker, rank). Another rank of the worker is
		// another cache, whose blocks and chains stay.
		a.c.clears.Add(1)
		o.Applied = a.clearRank(w, r)
	default:
		o.Status = BadKind
	}
}

func (a *Applier) stored(w *worker, r *rankState, ev *Event, o *Outcome) {
	if ev.Tier != Device {
		o.Status = OtherTier
		return
	}
	bs := w.ix.BlockSize()
	if ev.BlockSize != 0 && ev.BlockSize != bs {
		o.Status = BadBlockSize
		return
	}
	n := len(ev.Hashes)
	if ev.Locals != nil && (len(ev.Locals) != n || len(ev.Tokens) != 0) || ev.Locals == nil && len(ev.Tokens) != n*bs {
		o.Status = BadTokens
		return
	}
	parent, hasParent := uint64(0), ev.HasParent
	if hasParent {
		p, ok := r.engine.Get(ev.Parent)
		if !ok {
			o.Status = UnknownParent
			return
		}
		parent = p
	}
	switch seed := a.seed(ev.LoRA, ev.Salt); {
	case ev.Locals != nil:
		a.seqs = append(a.seqs[:0], ev.Locals...)
	case ev.MM != nil:
		a.seqs = a.h.AppendLocalMM(a.seqs[:0], ev.Tokens, bs, seed, ev.MM)
	default:
		a.seqs = a.h.AppendLocal(a.seqs[:0], ev.Tokens, bs, seed)
	}
	if r.tree != nil {
		a.locals = append(a.locals[:0], a.seqs...)
	}
	radix.ChainInPlace(a.seqs, parent, hasParent)
	// Every block below costs a lookup in the engine map and one in the index, each likely a
	// cache miss: start them all now so that they overlap.
	r.engine.Prefetch(ev.Hashes)
	w.ix.Prefetch(a.seqs)
	for i, eh := range ev.Hashes {
		seq := a.seqs[i]
		if old, ok := r.engine.Get(eh); ok {
			if old == seq {
				if r.tree != nil {
					a.note(r, i, parent, hasParent) // restored without its tree, it gets it back
				}
				continue
			}
			// The engine reuses this hash for other content: the old block is gone.
			a.drop(w.ix, r, old)
		}
		if !a.reserve() {
			if w.ix.Has(seq, r.slot) {
				// Same content under another engine hash: no new residency, no budget needed.
				r.engine.Put(eh, seq)
				r.addDup(seq)
				if r.tree != nil {
					a.note(r, i, parent, hasParent)
				}
				continue
			}
			o.Status, o.Skipped = OverBudget, n-i
			// The engine hash no longer names what the index holds for it.
			r.engine.Del(eh)
			break
		}
		r.engine.Put(eh, seq)
		if w.ix.Add(seq, r.slot) {
			o.Applied++
		} else {
			a.allow++
			r.addDup(seq)
		}
		if r.tree != nil {
			a.note(r, i, parent, hasParent)
		}
	}
	if o.Applied != 0 {
		a.c.stored.Add(int64(o.Applied))
		a.c.residencies.Add(int64(o.Applied))
	}
}

func (a *Applier) removed(w *worker, r *rankState, ev *Event, o *Outcome) {
	if ev.Tier != Device {
		o.Status = OtherTier
		return
	}
	r.engine.Prefetch(ev.Hashes)
	a.seqs = a.seqs[:0]
	for _, eh := range ev.Hashes {
		seq, ok := r.engine.Del(eh)
		if !ok {
			o.Skipped++
			continue
		}
		a.seqs = append(a.seqs, seq)
	}
	w.ix.Prefetch(a.seqs)
	for _, seq := range a.seqs {
		if a.drop(w.ix, r, seq) {
			o.Applied++
		}
	}
	if o.Skipped != 0 {
		o.Status = UnknownBlocks
	}
}

func (r *rankState) addDup(seq uint64) {
	if r.dup == nil {
		r.dup = make(map[uint64]uint32)
	}
	r.dup[seq]++
}

// drop releases one engine hash's claim on seq and reports whether the residency went away.
func (a *Applier) drop(ix *radix.Index, r *rankState, seq uint64) bool {
	if n := r.dup[seq]; n > 0 {
		if n == 1 {
			delete(r.dup, seq)
		} else {
			r.dup[seq] = n - 1
		}
		return false
	}
	if !ix.Remove(seq, r.slot) {
		return false
	}
	if r.tree != nil {
		r.tree.local.Del(seq)
		r.tree.parent.Del(seq)
	}
	a.release(1)
	return true
}

// note records, for a rank with a tree (KeepTree), block i of the stored event being applied
// (now held by r): its local hash and its parent, the block before it in the event or, for the
// first, the event's parent (none at the root of a chain).
func (a *Applier) note(r *rankState, i int, parent uint64, hasParent bool) {
	seq := a.seqs[i]
	r.tree.local.Put(seq, a.locals[i])
	switch {
	case i > 0:
		r.tree.parent.Put(seq, a.seqs[i-1])
	case hasParent:
		r.tree.parent.Put(seq, parent)
	}
}

// clear removes every block of every rank of w and returns how many residencies went away.
func (a *Applier) clear(w *worker) int {
	n := 0
	for _, r := range w.ranks {
		n += a.clearRank(w, r)
	}
	return n
}

// clearRank removes every block of rank r of w and returns how many residencies went away.
func (a *Applier) clearRank(w *worker, r *rankState) int {
	n := 0
	r.engine.Each(func(_, seq uint64) {
		if w.ix.Remove(seq, r.slot) {
			n++
		}
	})
	r.engine.Reset()
	r.dup = nil
	if r.tree != nil {
		r.tree.local.Reset()
		r.tree.parent.Reset()
	}
	a.release(n)
	return n
}

// RemoveRank drops every block and all state of rank rank of worker id and frees its slot; the
// worker's other ranks keep theirs. It returns how many residencies went away.
func (a *Applier) RemoveRank(id uint64, rank uint32) int {
	w := a.workers[id]
	if w == nil {
		return 0
	}
	i := slices.IndexFunc(w.ranks, func(r *rankState) bool { return r.rank == rank })
	if i < 0 {
		return 0
	}
	r := w.ranks[i]
	n := a.clearRank(w, r)
	a.flushRemoved()
	_ = w.ix.Release(r.slot) // cannot fail: the slot is ours and clearRank emptied it
	w.ranks = slices.Delete(w.ranks, i, i+1)
	if len(w.ranks) == 0 {
		delete(a.workers, id)
		a.c.workersRemoved.Add(1)
	}
	return n
}

// RemoveWorker drops every block and all state of worker id (every rank) and frees its slots,
// and returns how many residencies went away.
func (a *Applier) RemoveWorker(id uint64) int {
	w := a.workers[id]
	if w == nil {
		return 0
	}
	n := a.clear(w)
	a.flushRemoved()
	for _, r := range w.ranks {
		// Cannot fail: the slot is ours and clear emptied it.
		_ = w.ix.Release(r.slot)
	}
	delete(a.workers, id)
	a.c.workersRemoved.Add(1)
	return n
}

// Clear drops every block of worker id (every rank), keeping its slots and event cursors, as a
// Cleared event would, and returns how many residencies went away.
func (a *Applier) Clear(id uint64) int {
	w := a.workers[id]
	if w == nil {
		return 0
	}
	n := a.clear(w)
	a.flushRemoved()
	a.c.clears.Add(1)
	return n
}

// Cursor returns the last event id applied for (worker, rank), 0 if none.
func (a *Applier) Cursor(id uint64, rank uint32) uint64 {
	if w := a.workers[id]; w != nil {
		if r := w.rank(rank); r != nil {
			return r.last
		}
	}
	return 0
}

// Batch returns the Event.Batch of the last engine batch applied for (worker, rank), 0 if none.
func (a *Applier) Batch(id uint64, rank uint32) uint64 {
	if w := a.workers[id]; w != nil {
		if r := w.rank(rank); r != nil {
			return r.batch
		}
	}
	return 0
}

// Blocks returns how many engine hashes worker id holds over all ranks (what its engine maps
// hold; residencies can be fewer when two engine hashes name the same content).
func (a *Applier) Blocks(id uint64) int {
	n := 0
	if w := a.workers[id]; w != nil {
		for _, r := range w.ranks {
			n += r.engine.Len()
		}
	}
	return n
}

// seed returns the seed of blocks stored under the LoRA adapter and cache salt, remembering
// the last pair's (events of one worker name few).
func (a *Applier) seed(lora, salt string) uint64 {
	if lora != a.loraName || salt != a.saltName {
		a.loraName, a.saltName, a.loraSeed = lora, salt, radix.Seed(lora, salt)
	}
	return a.loraSeed
}

// flushRemoved adds the residencies removed since the last flush to the shared counters (one
// atomic add per event instead of one per block).
func (a *Applier) flushRemoved() {
	if a.unflushed != 0 {
		a.c.removed.Add(a.unflushed)
		a.c.residencies.Add(-a.unflushed)
		a.unflushed = 0
	}
}

// reserve takes one residency from the budget.
func (a *Applier) reserve() bool {
	if a.allow > 0 {
		a.allow--
		return true
	}
	n := a.budget.take()
	if n == 0 {
		return false
	}
	a.allow = n - 1
	return true
}

// release gives n residencies back, returning surplus reservations to the shared budget.
func (a *Applier) release(n int) {
	if n == 0 {
		return
	}
	a.unflushed += int64(n)
	a.allow += int64(n)
	if a.allow > 2*a.budget.chunk {
		a.budget.give(a.allow - a.budget.chunk)
		a.allow = a.budget.chunk
	}
}

// budget is the residency limit shared by all shards. Shards reserve it in chunks, so that they
// do not contend on one counter for every block; the limit holds exactly for the sum of
// reservations, and a shard may be refused while others still hold up to 2 chunks unused each.
type budget struct {
	max      int64 // 0 = unlimited
	chunk    int64
	reserved atomic.Int64
}

func newBudget(limit int64, shards int) *budget {
	b := &budget{max: limit, chunk: 1024}
	if limit > 0 {
		b.chunk = min(b.chunk, max(1, limit/int64(16*shards)))
	}
	return b
}

// take reserves up to one chunk and returns how much it got (0 at the limit).
func (b *budget) take() int64 {
	if b.max == 0 {
		return b.chunk
	}
	for {
		r := b.reserved.Load()
		n := min(b.chunk, b.max-r)
		if n <= 0 {
			return 0
		}
		if b.reserved.CompareAndSwap(r, r+n) {
			return n
		}
	}
}

func (b *budget) give(n int64) {
	if b.max != 0 {
		b.reserved.Add(-n)
	}
}

// EachBlock calls f for every block worker id holds: its rank, the engine's hash and the
// router's sequence hash, in no particular order.
func (a *Applier) EachBlock(id uint64, f func(rank uint32, engine, seq uint64)) {
	w := a.workers[id]
	if w == nil {
		return
	}
	for _, r := range w.ranks {
		r.engine.Each(func(k, v uint64) { f(r.rank, k, v) })
	}
}
