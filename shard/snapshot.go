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
		n := r.engine.Len()
		rs.Rank, rs.Cursor, rs.Batch = r.rank, r.last, r.batch
		rs.Seqs, rs.Engines = slices.Grow(rs.Seqs[:0], n), slices.Grow(rs.Engines[:0], n)
		r.engine.Each(func(eh, seq uint64) {
			rs.Engines = append(rs.Engines, eh)
			rs.Seqs = append(rs.Seqs, seq)
		})
		rs.Locals, rs.Parents = rs.Locals[:0], rs.Parents[:0]
		if r.tree != nil {
			rs.Locals, rs.Parents = r.tree.export(rs.Seqs, rs.Locals, rs.Parents)
		}
		dst = append(dst, rs)
	}
	return dst
}

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
		r.engine.Grow(len(rs.Engines))
		w.ranks = append(w.ranks, r)
		const ahead = 16
		for j, eh := range rs.Engines {
			if j%ahead == 0 {
				end := min(j+ahead, len(rs.Engines))
				ix.Prefetch(rs.Seqs[j:end])
			}
			seq := rs.Seqs[j]
			if _, ok := r.engine.Get(eh); ok {
				continue // an engine hash twice: the first one stands
			}
			if !a.reserve() {
				if ix.Has(seq, slot) {
					r.engine.Put(eh, seq)
					r.addDup(seq)
					continue
				}
				skipped++
				continue
			}
			r.engine.Put(eh, seq)
			if ix.Add(seq, slot) {
				added++
			} else {
				a.allow++
				r.addDup(seq)
			}
			if r.tree != nil && len(rs.Locals) != 0 {
				r.tree.local.Put(seq, rs.Locals[j])
				if p := rs.Parents[j]; p != seq {
					r.tree.parent.Put(seq, p)
				}
			}
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

// TreeBlock is one block of a worker as DumpTree lists it: the engine's hash, the local and
// sequence hashes, and the engine hash of the block before it (none at the root of a chain).
type TreeBlock struct {
	Rank      uint32
	Engine    uint64
	Local     uint64
	Seq       uint64
	Parent    uint64
	HasParent bool
}

// DumpTree appends worker id's blocks to dst, rank by rank, each rank's in depth-first order
// from its roots (children by sequence hash), so that every block comes after its parent and a
// chain's blocks follow each other. It returns dst and the number of blocks it left out: those
// whose tree is not known (restored without it, or KeepTree unset) and those whose parent the
// rank no longer holds, which no match reaches. Called on the worker's shard goroutine
// (Set.Do), as Export is.
func (a *Applier) DumpTree(id uint64, dst []TreeBlock) ([]TreeBlock, int) {
	w := a.workers[id]
	if w == nil {
		return dst, 0
	}
	left := 0
	for _, r := range w.ranks {
		if r.tree == nil {
			left += r.engine.Len()
			continue
		}
		// The rank's blocks by sequence hash, each with its engine hashes (two when the same
		// content is held under two).
		engines := make(map[uint64][]uint64, r.engine.Len())
		r.engine.Each(func(eh, seq uint64) { engines[seq] = append(engines[seq], eh) })
		children := make(map[uint64][]uint64)
		var roots []uint64
		for seq := range engines {
			if _, ok := r.tree.local.Get(seq); !ok {
				continue
			}
			if p, ok := r.tree.parent.Get(seq); ok {
				children[p] = append(children[p], seq)
			} else {
				roots = append(roots, seq)
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
			ehs := engines[seq]
			slices.Sort(ehs)
			b := TreeBlock{Rank: r.rank, Seq: seq}
			b.Local, _ = r.tree.local.Get(seq)
			if p, ok := r.tree.parent.Get(seq); ok {
				b.Parent, b.HasParent = engines[p][0], true // sorted when p was listed
			}
			for _, eh := range ehs {
				b.Engine = eh
				dst = append(dst, b)
			}
			kids := children[seq]
			slices.Sort(kids)
			for i := len(kids) - 1; i >= 0; i-- {
				stack = append(stack, kids[i])
			}
		}
		for _, ehs := range engines {
			left += len(ehs)
		}
		left -= len(dst) - start
	}
	return dst, left
}
