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
		dst = append(dst, rs)
	}
	return dst
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
		if w.rank(rs.Rank) != nil {
			return added, fmt.Errorf("shard: worker %d: rank %d twice", id, rs.Rank)
		}
		slot, err := ix.Acquire(radix.WorkerKey{ID: id, Rank: rs.Rank})
		if err != nil {
			return added, fmt.Errorf("shard: worker %d rank %d: %w", id, rs.Rank, err)
		}
		r := &rankState{rank: rs.Rank, slot: slot, last: rs.Cursor, batch: rs.Batch}
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
