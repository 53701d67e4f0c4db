package shard

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

// RankState is one (worker, rank)'s state as a snapshot holds it; see kvevent.RankState.
type RankState = kvevent.RankState

// Export appends worker id's ranks to dst, reusing the Seqs and Engines of dst's spare capacity,
// and returns it (dst unchanged if the Applier does not know the worker). Blocks come in no
// particular order. Called on the goroutine that applies the worker's events (Set.Do), it sees
// the state after every event applied so far and before any later one.
func (a *Applier) Export(id uint64, dst []RankState) []RankState {
	w := a.workers[id]
	if w == nil {
		return dst
	}
	for _, r := range w.ranks {
		var rs RankState
		if len(dst) < cap(dst) {
			rs = dst[:len(dst)+1][len(dst)]
		}
		rs.Rank, rs.Cursor, rs.Batch = r.rank, r.last, r.batch
		rs.Seqs, rs.Engines = r.export(rs.Seqs[:0], rs.Engines[:0])
		rs.Locals, rs.Parents = rs.Locals[:0], rs.Parents[:0]
		if r.tree != nil {
			rs.Locals, rs.Parents = r.tree.export(rs.Seqs, rs.Locals, rs.Parents)
		}
		rs.Lower = rs.Lower[:0]
		if r.lower != nil {
			for i, ts := range r.lower {
				if ts == nil || ts.engine.Len() == 0 {
					continue
				}
				var tb TierBlocks
				if len(rs.Lower) < cap(rs.Lower) {
					tb = rs.Lower[:len(rs.Lower)+1][len(rs.Lower)]
				}
				tb.Tier = Tier(i + 1)
				tb.Seqs, tb.Engines = ts.export(tb.Seqs[:0], tb.Engines[:0])
				tb.Locals, tb.Parents = tb.Locals[:0], tb.Parents[:0]
				if ts.tree != nil {
					tb.Locals, tb.Parents = ts.tree.export(tb.Seqs, tb.Locals, tb.Parents)
				}
				rs.Lower = append(rs.Lower, tb)
			}
		}
		dst = append(dst, rs)
	}
	return dst
}

// export appends the tier's blocks: their sequence hashes to seqs, their engine hashes to
// engines.
func (ts *tierState) export(seqs, engines []uint64) ([]uint64, []uint64) {
	n := ts.engine.Len()
	seqs, engines = slices.Grow(seqs, n), slices.Grow(engines, n)
	ts.engine.Each(func(eh, seq uint64) {
		engines = append(engines, eh)
		seqs = append(seqs, seq)
	})
	return seqs, engines
}

// TierBlocks are one rank's blocks in one lower tier; see kvevent.TierBlocks.
type TierBlocks = kvevent.TierBlocks

// export appends the local hash and parent of every block of seqs, in that order (a root's
// parent is itself), or nothing if one is missing: a tree is written whole or not at all.
func (t *blockTree) export(seqs, locals, parents []uint64) ([]uint64, []uint64) {
	locals, parents = slices.Grow(locals, len(seqs)), slices.Grow(parents, len(seqs))
	for _, seq := range seqs {
		l, ok := t.local.Get(seq)
		if !ok {
			return locals[:0], parents[:0]
		}
		p, ok := t.parent.Get(seq)
		if !ok {
			p = seq
		}
		locals, parents = append(locals, l), append(parents, p)
	}
	return locals, parents
}

// ErrExists is returned by Import for a worker the Applier already holds state for.
var ErrExists = errors.New("shard: worker already has state")

// Import gives worker id, of the model whose index is ix, the state of ranks (as Export
// produced it, in any order), without events: the engine maps, cursors and the index's
// residencies (counted as stored blocks, so that Residencies stays StoredBlocks minus
// RemovedBlocks). It refuses a worker it already knows. Past the residency budget the rest is
// left out and counted in SkippedBlocks, and the error says so; a rank twice is an error. It
// returns the residencies added.
func (a *Applier) Import(ix *radix.Index, id uint64, ranks []RankState) (int, error) {
	return a.importRanks(ix, id, ranks, nil)
}

// Skipped is told of each block Bulk import left out over the residency budget: the caller must
// leave the (block, slot) pair out of the index too.
type Skipped func(tier Tier, slot radix.Slot, seq uint64)

// ImportBulk is Import for a restore that adds the index's residencies itself, in bulk
// (radix.Index.Load, each block once with all its holders): it gives the worker its slots,
// engine maps (each built in one pass), trees, cursors and counts, and leaves the index alone.
// Each tier's blocks must be sorted by sequence hash and its engine hashes distinct, as
// snapshots write them; what the budget leaves out is counted as Import counts it and told to
// skipped. The residencies it returns, per rank and tier, are the
// distinct sequence hashes the caller's Load must give the rank's slot.
func (a *Applier) ImportBulk(ix *radix.Index, id uint64, ranks []RankState, skipped Skipped) (int, error) {
	if skipped == nil {
		skipped = func(Tier, radix.Slot, uint64) {}
	}
	return a.importRanks(ix, id, ranks, skipped)
}

// importRanks is Import (bulk nil) and ImportBulk.
func (a *Applier) importRanks(ix *radix.Index, id uint64, ranks []RankState, bulk Skipped) (int, error) {
	if a.workers[id] != nil {
		return 0, ErrExists
	}
	w := &worker{ix: ix}
	a.workers[id] = w
	added, skipped := 0, 0
	for i := range ranks {
		rs := &ranks[i]
		if len(rs.Seqs) != len(rs.Engines) {
			return added, fmt.Errorf("shard: worker %d rank %d: %d sequence hashes, %d engine hashes", id, rs.Rank, len(rs.Seqs), len(rs.Engines))
		}
		if len(rs.Locals) != len(rs.Parents) || len(rs.Locals) != 0 && len(rs.Locals) != len(rs.Seqs) {
			return added, fmt.Errorf("shard: worker %d rank %d: %d local hashes and %d parents for %d blocks", id, rs.Rank, len(rs.Locals), len(rs.Parents), len(rs.Seqs))
		}
		if w.rank(rs.Rank) != nil {
			return added, fmt.Errorf("shard: worker %d: rank %d twice", id, rs.Rank)
		}
		slot, err := ix.Acquire(radix.WorkerKey{ID: id, Rank: rs.Rank})
		if err != nil {
			return added, fmt.Errorf("shard: worker %d rank %d: %w", id, rs.Rank, err)
		}
		r := a.newRank(rs.Rank, slot)
		r.last, r.batch = rs.Cursor, rs.Batch
		w.ranks = append(w.ranks, r)
		n, sk, err := a.importTier(ix, r, Device, &r.tierState, rs.Seqs, rs.Engines, rs.Locals, rs.Parents, bulk)
		if err != nil {
			return added, fmt.Errorf("shard: worker %d rank %d: %w", id, rs.Rank, err)
		}
		added, skipped = added+n, skipped+sk
		var seen [kvevent.NumTiers]bool
		for j := range rs.Lower {
			tb := &rs.Lower[j]
			switch {
			case tb.Tier == Device || tb.Tier >= kvevent.NumTiers || seen[tb.Tier]:
				return added, fmt.Errorf("shard: worker %d rank %d: lower tier %v twice or not a lower tier", id, rs.Rank, tb.Tier)
			case len(tb.Seqs) != len(tb.Engines):
				return added, fmt.Errorf("shard: worker %d rank %d tier %v: %d sequence hashes, %d engine hashes", id, rs.Rank, tb.Tier, len(tb.Seqs), len(tb.Engines))
			case len(tb.Locals) != len(tb.Parents) || len(tb.Locals) != 0 && len(tb.Locals) != len(tb.Seqs):
				return added, fmt.Errorf("shard: worker %d rank %d tier %v: %d local hashes and %d parents for %d blocks", id, rs.Rank, tb.Tier, len(tb.Locals), len(tb.Parents), len(tb.Seqs))
			}
			seen[tb.Tier] = true
			if len(tb.Seqs) == 0 {
				continue
			}
			n, sk, err := a.importTier(ix.EnsureTier(tb.Tier), r, tb.Tier, a.tier(r, tb.Tier, true), tb.Seqs, tb.Engines, tb.Locals, tb.Parents, bulk)
			if err != nil {
				return added, fmt.Errorf("shard: worker %d rank %d tier %v: %w", id, rs.Rank, tb.Tier, err)
			}
			a.c.tierResidencies[tb.Tier].Add(int64(n))
			added, skipped = added+n, skipped+sk
		}
	}
	if added != 0 {
		a.c.stored.Add(int64(added))
		a.c.residencies.Add(int64(added))
	}
	if skipped != 0 {
		a.c.skipped.Add(int64(skipped))
		return added, fmt.Errorf("shard: worker %d: %d blocks over the residency budget left out", id, skipped)
	}
	return added, nil
}

// importTier adds the blocks of one tier t of rank r (its state ts, its index ix) and returns the
// residencies added and the blocks left out over the budget. In bulk (bulk not nil) it leaves
// the index to the caller: a block is new unless it is the block before it (seqs sorted).
func (a *Applier) importTier(ix *radix.Index, r *rankState, t Tier, ts *tierState, seqs, engines, locals, parents []uint64, bulk Skipped) (added, skipped int, err error) {
	ts.engine.Grow(len(engines))
	if bulk != nil {
		if !slices.IsSorted(seqs) {
			return 0, 0, errors.New("blocks not sorted by sequence hash: not a snapshot's")
		}
		// Which blocks are taken in (the budget's say), then the engine map built in one pass.
		var (
			last    uint64 // the sequence hash of the block before
			lastIn  bool   // it was taken in
			started bool
		)
		ehs, sqs := a.bulk.engines[:0], a.bulk.seqs[:0]
		for j, eh := range engines {
			seq := seqs[j]
			if !started || seq != last {
				last, started = seq, true
				if lastIn = a.reserve(); !lastIn {
					skipped++
					bulk(t, r.slot, seq)
					continue
				}
				added++
			} else if !lastIn {
				continue
			} else {
				ts.addDup(seq) // a second engine hash of the block
			}
			ehs, sqs = append(ehs, eh), append(sqs, seq)
			if ts.tree != nil && len(locals) != 0 {
				ts.tree.local.Put(seq, locals[j])
				if p := parents[j]; p != seq {
					ts.tree.parent.Put(seq, p)
				}
			}
		}
		a.bulk.engines, a.bulk.seqs = ehs, sqs
		var ok bool
		if a.bulk.order, ok = ts.engine.Build(ehs, sqs, a.bulk.order); !ok {
			return added, skipped, errors.New("an engine hash twice in a tier: not a snapshot's")
		}
		return added, skipped, nil
	}
	const ahead = 16
	for j, eh := range engines {
		if j%ahead == 0 {
			end := min(j+ahead, len(engines))
			ix.Prefetch(seqs[j:end])
		}
		seq := seqs[j]
		if _, ok := ts.engine.Get(eh); ok {
			continue // an engine hash twice: the first one stands
		}
		if !a.reserve() {
			if ix.Has(seq, r.slot) {
				ts.engine.Put(eh, seq)
				ts.addDup(seq)
				continue
			}
			skipped++
			continue
		}
		ts.engine.Put(eh, seq)
		if ix.Add(seq, r.slot) {
			added++
		} else {
			a.allow++
			ts.addDup(seq)
		}
		if ts.tree != nil && len(locals) != 0 {
			ts.tree.local.Put(seq, locals[j])
			if p := parents[j]; p != seq {
				ts.tree.parent.Put(seq, p)
			}
		}
	}
	return added, skipped, nil
}

// TreeBlock is one block of a worker as DumpTree lists it: the engine's hash, the local and
// sequence hashes, the engine hash of the block before it (none at the root of a chain), and
// the storage tier it is held in.
type TreeBlock struct {
	Rank      uint32
	Tier      Tier
	Engine    uint64
	Local     uint64
	Seq       uint64
	Parent    uint64
	HasParent bool
}

// DumpTree appends worker id's blocks to dst, rank by rank, each rank's device tier first and
// then its lower tiers (host, disk, external), each tier's blocks in depth-first order from its
// roots (children by sequence hash), so that every block comes after its parent and a chain's
// blocks follow each other. A lower-tier block's parent may be held in another tier of the
// rank (an offloaded child of a device block); it is named by that tier's engine hash, listed
// earlier. It returns dst and the number of blocks it left out: those whose tree is not known
// (restored without it, or KeepTree unset) and those whose parent the rank no longer holds in
// any tier, which no match reaches. Called on the worker's shard goroutine (Set.Do), as Export
// is.
func (a *Applier) DumpTree(id uint64, dst []TreeBlock) ([]TreeBlock, int) {
	w := a.workers[id]
	if w == nil {
		return dst, 0
	}
	left := 0
	for _, r := range w.ranks {
		// Each tier's blocks by sequence hash, each with its engine hashes (two when the same
		// content is held under two), sorted.
		var engines [kvevent.NumTiers]map[uint64][]uint64
		r.tiers(func(t Tier, ts *tierState) {
			m := make(map[uint64][]uint64, ts.engine.Len())
			ts.engine.Each(func(eh, seq uint64) { m[seq] = append(m[seq], eh) })
			for _, ehs := range m {
				slices.Sort(ehs)
			}
			engines[t] = m
		})
		// parentEngine names the block seq of tier t by an engine hash: its own tier's, else
		// the first other tier's that holds it.
		parentEngine := func(t Tier, seq uint64) (uint64, bool) {
			if ehs := engines[t][seq]; len(ehs) > 0 {
				return ehs[0], true
			}
			for u := range engines {
				if ehs := engines[u][seq]; len(ehs) > 0 {
					return ehs[0], true
				}
			}
			return 0, false
		}
		r.tiers(func(t Tier, ts *tierState) {
			var listed int
			dst, listed = dumpTier(dst, r.rank, t, ts, engines[t], parentEngine)
			left += ts.engine.Len() - listed
		})
	}
	return dst, left
}

// dumpTier appends the blocks of one tier of a rank in depth-first order and returns how many
// it listed (engine hashes, as the tier's map holds them).
func dumpTier(dst []TreeBlock, rank uint32, t Tier, ts *tierState, engines map[uint64][]uint64, parentEngine func(Tier, uint64) (uint64, bool)) ([]TreeBlock, int) {
	if ts.tree == nil {
		return dst, 0
	}
	children := make(map[uint64][]uint64)
	var roots []uint64
	for seq := range engines {
		if _, ok := ts.tree.local.Get(seq); !ok {
			continue
		}
		p, ok := ts.tree.parent.Get(seq)
		switch {
		case !ok:
			roots = append(roots, seq)
		case engines[p] != nil:
			children[p] = append(children[p], seq)
		default:
			// The parent lives in another tier of the rank (or nowhere): this block starts a
			// run of its own tier, listed after the tier that holds the parent.
			if _, held := parentEngine(t, p); held {
				roots = append(roots, seq)
			}
		}
	}
	slices.Sort(roots)
	start := len(dst)
	stack := slices.Clone(roots)
	slices.Reverse(stack)
	seen := make(map[uint64]bool, len(engines))
	for len(stack) > 0 {
		seq := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[seq] { // only a hash cycle could bring a block back
			continue
		}
		seen[seq] = true
		b := TreeBlock{Rank: rank, Tier: t, Seq: seq}
		b.Local, _ = ts.tree.local.Get(seq)
		if p, ok := ts.tree.parent.Get(seq); ok {
			b.Parent, b.HasParent = parentEngine(t, p)
		}
		for _, eh := range engines[seq] {
			b.Engine = eh
			dst = append(dst, b)
		}
		kids := children[seq]
		slices.Sort(kids)
		for i := len(kids) - 1; i >= 0; i-- {
			stack = append(stack, kids[i])
		}
	}
	return dst, len(dst) - start
}
