package shard

import (
	"math/bits"
	"slices"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/internal/u64map"
	"github.com/kvrouterd/kvrouterd/kvevent"
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
	unflushed int64  // residencies removed by the current call, counted once at its end
	evict     bool   // Config.Evict
	rng       uint64 // makeRoom's random stream

	h        radix.Hasher
	seqs     []uint64 // an event's sequence hashes
	locals   []uint64 // an event's local hashes, kept only with KeepTree
	loraName string
	saltName string
	loraSeed uint64

	// bulk is ImportBulk's scratch: a tier's engine and sequence hashes, and Build's ordering.
	bulk struct {
		engines, seqs []uint64
		order         []int32
	}
}

type worker struct {
	ix    *radix.Index
	ranks []*rankState
}

// rankState is one (worker, dp rank): one engine, one slot, one event stream. Its device
// tier's blocks are the embedded tierState; a lower tier's come in lower, allocated on the
// rank's first block in any lower tier (nil for the many ranks that never offload).
type rankState struct {
	rank  uint32
	slot  radix.Slot
	last  uint64 // last event id applied; 0 = none yet
	batch uint64 // Event.Batch of the last engine batch applied; 0 = none yet
	tierState
	lower *[numLower]*tierState // lower[t-1]: tier t's, nil until its first block
}

// numLower is how many tiers lie below the device.
const numLower = kvevent.NumTiers - 1

// tierState is what a rank holds in one storage tier. Each tier has its own engine hash map: an
// engine names a block by the same hash when it offloads it, and the copy in one tier must not
// be removed by an event about another.
type tierState struct {
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

// tier returns the rank's state in tier t, nil if it has none (and create is false).
func (a *Applier) tier(r *rankState, t Tier, create bool) *tierState {
	if t == Device {
		return &r.tierState
	}
	if r.lower == nil {
		if !create {
			return nil
		}
		r.lower = new([numLower]*tierState)
	}
	ts := r.lower[t-1]
	if ts == nil && create {
		ts = new(tierState)
		if a.KeepTree {
			ts.tree = new(blockTree)
		}
		r.lower[t-1] = ts
	}
	return ts
}

// tiers calls f for each tier the rank holds state in, the device first.
func (r *rankState) tiers(f func(t Tier, ts *tierState)) {
	f(Device, &r.tierState)
	if r.lower != nil {
		for i, ts := range r.lower {
			if ts != nil {
				f(Tier(i+1), ts)
			}
		}
	}
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
		// An engine clears its own cache: one (worker, rank), one tier (Dynamo routes a clear
		// to its storage tier's index). Another rank of the worker is another cache, and the
		// rank's other tiers other stores, whose blocks and chains stay.
		if ev.Tier >= kvevent.NumTiers {
			o.Status = OtherTier
			return
		}
		a.c.clears.Add(1)
		if ts := a.tier(r, ev.Tier, false); ts != nil {
			o.Applied = a.clearTier(w.ix.TierIndex(ev.Tier), r, ts)
		}
	default:
		o.Status = BadKind
	}
}

func (a *Applier) stored(w *worker, r *rankState, ev *Event, o *Outcome) {
	if ev.Tier >= kvevent.NumTiers {
		o.Status = OtherTier
		return
	}
	ix := w.ix
	bs := ix.BlockSize()
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
		p, ok := a.parent(r, ev.Tier, ev.Parent)
		if !ok {
			o.Status = UnknownParent
			return
		}
		parent = p
	}
	ts := &r.tierState
	if ev.Tier != Device {
		ix, ts = ix.EnsureTier(ev.Tier), a.tier(r, ev.Tier, true)
	}
	switch seed := a.seed(ev.LoRA, ev.Salt); {
	case ev.Locals != nil:
		a.seqs = append(a.seqs[:0], ev.Locals...)
	case ev.MM != nil:
		a.seqs = a.h.AppendLocalMM(a.seqs[:0], ev.Tokens, bs, seed, ev.MM)
	default:
		a.seqs = a.h.AppendLocal(a.seqs[:0], ev.Tokens, bs, seed)
	}
	if ts.tree != nil {
		a.locals = append(a.locals[:0], a.seqs...)
	}
	radix.ChainInPlace(a.seqs, parent, hasParent)
	// Every block below costs a lookup in the engine map and one in the index, each likely a
	// cache miss: start them all now so that they overlap.
	ts.engine.Prefetch(ev.Hashes)
	ix.Prefetch(a.seqs)
	for i, eh := range ev.Hashes {
		seq := a.seqs[i]
		if old, ok := ts.engine.Get(eh); ok {
			if old == seq {
				if ts.tree != nil {
					a.note(ts, i, parent, hasParent) // restored without its tree, it gets it back
				}
				continue
			}
			// The engine reuses this hash for other content: the old block is gone.
			a.drop(ix, r.slot, ts, old)
		}
		if !a.reserve() && !(a.evict && a.makeRoom() && a.reserve()) {
			if ix.Has(seq, r.slot) {
				// Same content under another engine hash: no new residency, no budget needed.
				ts.engine.Put(eh, seq)
				ts.addDup(seq)
				if ts.tree != nil {
					a.note(ts, i, parent, hasParent)
				}
				continue
			}
			o.Status, o.Skipped = OverBudget, n-i
			// The engine hash no longer names what the index holds for it.
			ts.engine.Del(eh)
			break
		}
		ts.engine.Put(eh, seq)
		if ix.Add(seq, r.slot) {
			o.Applied++
		} else {
			a.allow++
			ts.addDup(seq)
		}
		if ts.tree != nil {
			a.note(ts, i, parent, hasParent)
		}
	}
	if o.Applied != 0 {
		a.c.stored.Add(int64(o.Applied))
		a.c.residencies.Add(int64(o.Applied))
		if ev.Tier != Device {
			a.c.tierResidencies[ev.Tier].Add(int64(o.Applied))
		}
	}
}

// parent returns the sequence hash of the block the engine calls eh, looked up in tier t of r
// first and then in its other tiers: an engine that offloads a device block's child to the host
// names a parent that only the device holds (and the reverse when it reloads).
func (a *Applier) parent(r *rankState, t Tier, eh uint64) (uint64, bool) {
	if ts := a.tier(r, t, false); ts != nil {
		if seq, ok := ts.engine.Get(eh); ok {
			return seq, true
		}
	}
	if t == Device && r.lower == nil {
		return 0, false
	}
	for u := Device; u < kvevent.NumTiers; u++ {
		if u == t {
			continue
		}
		if ts := a.tier(r, u, false); ts != nil {
			if seq, ok := ts.engine.Get(eh); ok {
				return seq, true
			}
		}
	}
	return 0, false
}

func (a *Applier) removed(w *worker, r *rankState, ev *Event, o *Outcome) {
	if ev.Tier >= kvevent.NumTiers {
		o.Status = OtherTier
		return
	}
	ts := a.tier(r, ev.Tier, false)
	if ts == nil {
		// Nothing was ever stored in this tier for the rank.
		o.Skipped, o.Status = len(ev.Hashes), UnknownBlocks
		return
	}
	ix := w.ix.TierIndex(ev.Tier)
	ts.engine.Prefetch(ev.Hashes)
	a.seqs = a.seqs[:0]
	for _, eh := range ev.Hashes {
		seq, ok := ts.engine.Del(eh)
		if !ok {
			o.Skipped++
			continue
		}
		a.seqs = append(a.seqs, seq)
	}
	ix.Prefetch(a.seqs)
	for _, seq := range a.seqs {
		if a.drop(ix, r.slot, ts, seq) {
			o.Applied++
		}
	}
	if o.Skipped != 0 {
		o.Status = UnknownBlocks
	}
}

func (r *tierState) addDup(seq uint64) {
	if r.dup == nil {
		r.dup = make(map[uint64]uint32)
	}
	r.dup[seq]++
}

// drop releases one engine hash's claim on seq in tier state r (whose index is ix) and reports
// whether the residency of slot went away.
func (a *Applier) drop(ix *radix.Index, slot radix.Slot, r *tierState, seq uint64) bool {
	if n := r.dup[seq]; n > 0 {
		if n == 1 {
			delete(r.dup, seq)
		} else {
			r.dup[seq] = n - 1
		}
		return false
	}
	if !ix.Remove(seq, slot) {
		return false
	}
	if r.tree != nil {
		r.tree.local.Del(seq)
		r.tree.parent.Del(seq)
	}
	if t := ix.Tier(); t != Device {
		a.c.tierResidencies[t].Add(-1)
	}
	a.release(1)
	return true
}

// note records, for a tier with a tree (KeepTree), block i of the stored event being applied
// (now held by r): its local hash and its parent, the block before it in the event or, for the
// first, the event's parent (none at the root of a chain).
func (a *Applier) note(r *tierState, i int, parent uint64, hasParent bool) {
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

// clearRank removes every block of rank r of w, in every tier, and returns how many residencies
// went away.
func (a *Applier) clearRank(w *worker, r *rankState) int {
	n := 0
	r.tiers(func(t Tier, ts *tierState) { n += a.clearTier(w.ix.TierIndex(t), r, ts) })
	return n
}

// clearTier removes every block of r's tier state ts, whose index is ix, and returns how many
// residencies went away.
func (a *Applier) clearTier(ix *radix.Index, r *rankState, ts *tierState) int {
	n := 0
	ts.engine.Each(func(_, seq uint64) {
		if ix.Remove(seq, r.slot) {
			n++
		}
	})
	ts.engine.Reset()
	ts.dup = nil
	if ts.tree != nil {
		ts.tree.local.Reset()
		ts.tree.parent.Reset()
	}
	if t := ix.Tier(); t != Device && n != 0 {
		a.c.tierResidencies[t].Add(-int64(n))
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

// Clear drops every block of worker id (every rank, every storage tier), keeping its slots and
// event cursors, as a Cleared event of each rank and tier would, and returns how many
// residencies went away: a resync starts from nothing.
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

// Blocks returns how many engine hashes worker id holds over all ranks in the device tier
// (what its engine maps hold; residencies can be fewer when two engine hashes name the same
// content). TierBlocks counts another tier's.
func (a *Applier) Blocks(id uint64) int { return a.TierBlocks(id, Device) }

// TierBlocks returns how many engine hashes worker id holds over all ranks in tier t.
func (a *Applier) TierBlocks(id uint64, t Tier) int {
	n := 0
	if w := a.workers[id]; w != nil {
		for _, r := range w.ranks {
			if ts := a.tier(r, t, false); ts != nil {
				n += ts.engine.Len()
			}
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

// EachBlock calls f for every block worker id holds in the device tier: its rank, the engine's
// hash and the router's sequence hash, in no particular order.
func (a *Applier) EachBlock(id uint64, f func(rank uint32, engine, seq uint64)) {
	w := a.workers[id]
	if w == nil {
		return
	}
	for _, r := range w.ranks {
		r.engine.Each(func(k, v uint64) { f(r.rank, k, v) })
	}
}

// evictBatch is the most residencies makeRoom frees at a time (the victim's choice is paid once
// for them), and at most a sixteenth of the victim's blocks.
const evictBatch = 64

// makeRoom frees up to evictBatch residencies of this shard's (Config.Evict) and reports whether
// it freed any: from the (rank, tier) holding the most blocks, each time the first block no
// match marked since the marks were last cleared (radix.Index.Referenced), looking from a
// random slot of its engine map on. If a whole turn finds every block marked, the marks of all
// are cleared (they age) and the block at the start goes. Random starts, not a sweeping hand:
// deletions in one place of an open-addressing map with insertions everywhere pack the slots
// ahead of the hand into one long run.
func (a *Applier) makeRoom() bool {
	var (
		vix  *radix.Index
		vr   *rankState
		vts  *tierState
		most int
	)
	for _, w := range a.workers {
		for _, r := range w.ranks {
			r.tiers(func(t Tier, ts *tierState) {
				if n := ts.engine.Len(); n > most {
					most, vr, vts, vix = n, r, ts, w.ix.TierIndex(t)
				}
			})
		}
	}
	if vts == nil {
		return false
	}
	freed, want := 0, min(evictBatch, max(1, most/16))
	c := vts.engine.Cap()
	for tries := 0; tries < 4*want && freed < want && vts.engine.Len() > 0; tries++ {
		var (
			first, victim uint64 // engine hashes
			firstSeq, seq uint64
			seen, found   bool
		)
		start := a.rand(c)
		for i, steps := start, 0; steps < c; i, steps = i+1, steps+1 {
			if i == c {
				i = 0
			}
			eh, s, ok := vts.engine.At(i)
			if !ok {
				continue
			}
			if !seen {
				first, firstSeq, seen = eh, s, true
			}
			if !vix.Referenced(s) {
				victim, seq, found = eh, s, true
				break
			}
		}
		if !seen {
			break
		}
		if !found { // every block marked: they age, and the first from the start goes
			vts.engine.Each(func(_, s uint64) { vix.Unref(s) })
			victim, seq = first, firstSeq
		}
		vts.engine.Del(victim)
		if a.drop(vix, vr.slot, vts, seq) {
			freed++
		}
	}
	if freed == 0 {
		return false
	}
	a.c.evicted.Add(int64(freed))
	return true
}

// rand returns a pseudo-random int in [0, n) (xorshift64*, the Applier's own stream).
func (a *Applier) rand(n int) int {
	if a.rng == 0 {
		a.rng = 0x9e3779b97f4a7c15
	}
	a.rng ^= a.rng >> 12
	a.rng ^= a.rng << 25
	a.rng ^= a.rng >> 27
	hi, _ := bits.Mul64(a.rng*0x2545f4914f6cdd1d, uint64(n))
	return int(hi)
}
