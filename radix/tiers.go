package radix

import (
	"cmp"
	"slices"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// Storage tiers. A model's device index (New) is its primary index. The first block a worker
// reports in a lower tier (host, disk, external) creates that tier's index beside it (EnsureTier),
// which shares the device index's slot registry: one Slot names the same (worker, rank) in every
// tier, and a slot is released only once it holds nothing in any tier. Each tier keeps its own
// per-slot block count (Blocks on that tier's index).
//
// Match extends each slot's device depth through the lower tiers, in Dynamo's order: the host
// extension is the run of blocks the slot holds in the host tier from its device depth on, the
// disk extension continues from there through the disk tier, the external extension after that
// (Dynamo's query_lower_tiers). A slot that holds the query's first block in a lower tier only
// starts that tier at block 0. Without any lower tier the cost is one atomic load.

// numLower is the number of lower tiers.
const numLower = kvevent.NumTiers - 1

// lowerTiers are a model's lower-tier indexes; [t-1] is tier t's, nil until it exists.
type lowerTiers [numLower]*Index

// TierMatch is one slot's match through the tiers: Blocks[kvevent.Device] is its device depth,
// Blocks[t] for a lower tier t the extension t adds after the tiers before it. A plain value.
type TierMatch struct {
	Slot   Slot
	Blocks [kvevent.NumTiers]int32
}

// Total returns the slot's depth through every tier: device and all extensions.
func (t *TierMatch) Total() int32 {
	return t.Blocks[0] + t.Blocks[1] + t.Blocks[2] + t.Blocks[3]
}

// Tier returns the tier this index holds (Device for one made by New).
func (ix *Index) Tier() kvevent.Tier { return ix.tier }

// TierIndex returns the index of tier t of this model, nil if no block was ever stored in it.
// On a lower tier's index it returns nil for every tier but its own. Lock-free.
func (ix *Index) TierIndex(t kvevent.Tier) *Index {
	if t == ix.tier {
		return ix
	}
	if ix.tier != kvevent.Device || t >= kvevent.NumTiers {
		return nil
	}
	if lt := ix.lower.Load(); lt != nil {
		return lt[t-1]
	}
	return nil
}

// EnsureTier returns the index of tier t of this model (a device index), creating it on first
// use. Safe for concurrent use; creation is rare (once per tier per model).
func (ix *Index) EnsureTier(t kvevent.Tier) *Index {
	if x := ix.TierIndex(t); x != nil || ix.tier != kvevent.Device || t >= kvevent.NumTiers {
		return x
	}
	nx := newIndex(ix.blockSize, ix.slots, t)
	nx.track = ix.track
	for {
		old := ix.lower.Load()
		var lt lowerTiers
		if old != nil {
			lt = *old
			if lt[t-1] != nil {
				return lt[t-1]
			}
		}
		lt[t-1] = nx
		if ix.lower.CompareAndSwap(old, &lt) {
			return nx
		}
	}
}

// Tiered reports whether the model has any lower-tier index. Lock-free.
func (ix *Index) Tiered() bool { return ix.lower.Load() != nil }

// tierWalk is one slot's state in the extension walk.
type tierWalk struct {
	slot Slot
	pos  int32 // the next query block the slot may extend with
	d    [kvevent.NumTiers]int32
}

// extend fills m.Tiers from the device walk's m.Slots and m.Depth and the lower tiers lt.
//
// The walk keeps the slots in slot order (m.walk) and, per tier, visits the query's blocks from
// the shallowest slot position on. At block q only the slots whose run in this tier has reached
// q may extend: those holding block q in the tier, found from the block's holders (a few inline
// or in cells: each looked up among the slots by binary search; a bitset: each slot at q tested
// against it). The visit ends when no slot is at or beyond q, so its cost is the positions that
// some slot can still extend at, not the slots times the positions.
func (ix *Index) extend(lt *lowerTiers, seqs []uint64, m *Match) {
	m.Tiers = m.Tiers[:0]
	if len(seqs) == 0 {
		return
	}
	w := m.walk[:0]
	for i, s := range m.Slots {
		w = append(w, tierWalk{slot: s, pos: m.Depth[i], d: [kvevent.NumTiers]int32{m.Depth[i]}})
	}
	n := int32(len(seqs))
	for t, lix := range lt {
		if lix == nil {
			continue
		}
		tier := t + 1
		// Slots holding the first block in this tier start it at block 0 (Dynamo's root workers).
		m.hold = lix.AppendHolders(m.hold[:0], seqs[0])
		if len(m.hold) > 0 {
			w = m.mergeRoots(w)
		}
		if len(w) == 0 {
			continue
		}
		// starts[q]: the slots whose run in this tier starts at block q.
		starts := slices.Grow(m.starts[:0], int(n)+1)[:n+1]
		clear(starts)
		lo := n
		for i := range w {
			starts[w[i].pos]++
			lo = min(lo, w[i].pos)
		}
		m.starts = starts
		// at: the slots whose run is at block q now (started there or extended into it); later:
		// those that start beyond q.
		later := int32(len(w)) - starts[lo]
		at := starts[lo]
		// The tier's holders of the blocks from base on, prefetched a few windows ahead as the
		// device walk does: a run of offloaded blocks is a run of cache misses otherwise.
		var la lookahead
		base := lo
		if lo < n {
			la.start(lix, seqs[lo:])
		}
		for q := lo; q < n; q++ {
			if at == 0 {
				if later == 0 {
					break
				}
				// Jump to the next block a slot starts at.
				for q++; starts[q] == 0; q++ {
				}
				at, later = starts[q], later-starts[q]
				if q >= n {
					break
				}
				base = q
				la.start(lix, seqs[q:])
			}
			h, hs := la.at(int(q - base))
			moved := int32(0)
			if hs != nil && hs.bits != nil {
				for i := range w {
					if x := &w[i]; x.pos == q && hs.has(x.slot) {
						x.pos++
						x.d[tier]++
						moved++
					}
				}
			} else {
				m.hold = appendMembers(m.hold[:0], h, hs)
				for _, x := range m.hold {
					i, ok := slices.BinarySearchFunc(w, x, func(e tierWalk, x Slot) int { return cmp.Compare(e.slot, x) })
					if ok && w[i].pos == q {
						w[i].pos++
						w[i].d[tier]++
						moved++
					}
				}
			}
			at = moved
			if q+1 < n {
				at += starts[q+1]
				later -= starts[q+1]
			}
		}
	}
	for i := range w {
		if x := &w[i]; x.d[1]|x.d[2]|x.d[3] != 0 {
			m.Tiers = append(m.Tiers, TierMatch{Slot: x.slot, Blocks: x.d})
		}
	}
	m.walk = w
}

// mergeRoots merges the slots of m.hold (ascending) that w (ascending by slot) lacks into w,
// at block 0, and returns the merged walk (in m.walk2's storage, w's becoming the spare).
func (m *Match) mergeRoots(w []tierWalk) []tierWalk {
	out := m.walk2[:0]
	i := 0
	for _, s := range m.hold {
		for i < len(w) && w[i].slot < s {
			out = append(out, w[i])
			i++
		}
		if i < len(w) && w[i].slot == s {
			continue
		}
		out = append(out, tierWalk{slot: s})
	}
	out = append(out, w[i:]...)
	m.walk2 = w
	return out
}
