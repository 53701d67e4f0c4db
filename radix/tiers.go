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

func bySlot(a, b tierWalk) int { return cmp.Compare(a.slot, b.slot) }

func byPos(a, b tierWalk) int {
	if c := cmp.Compare(a.pos, b.pos); c != 0 {
		return c
	}
	return cmp.Compare(a.slot, b.slot)
}

// extend fills m.Tiers from the device walk's m.Slots and m.Depth and the lower tiers lt.
func (ix *Index) extend(lt *lowerTiers, seqs []uint64, m *Match) {
	m.Tiers = m.Tiers[:0]
	if len(seqs) == 0 {
		return
	}
	w := m.walk[:0]
	for i, s := range m.Slots {
		w = append(w, tierWalk{slot: s, pos: m.Depth[i], d: [kvevent.NumTiers]int32{m.Depth[i]}})
	}
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
		// Walk the query's blocks from the shallowest position on: at each block, the slots
		// whose run has reached it and still goes on test it; a slot joins when the walk
		// reaches its position and leaves at its first block missing in this tier.
		slices.SortFunc(w, byPos)
		act := m.act[:0]
		next, q := 0, w[0].pos
		for {
			for next < len(w) && w[next].pos == q {
				act = append(act, int32(next))
				next++
			}
			if len(act) == 0 {
				if next == len(w) {
					break
				}
				q = w[next].pos
				continue
			}
			if int(q) >= len(seqs) {
				break
			}
			mk := lix.mix(seqs[q])
			h, s := lix.segment(mk).holders(seqs[q], mk)
			k := 0
			for _, e := range act {
				x := &w[e]
				if s != nil && s.has(x.slot) || s == nil && inlineHas(h, x.slot) {
					x.pos++
					x.d[tier]++
					act[k] = e
					k++
				}
			}
			act = act[:k]
			q++
		}
		m.act = act[:0]
		slices.SortFunc(w, bySlot)
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
