package radix

import (
	"math/bits"
	"slices"
	"sync/atomic"
)

// Match is the result of Index.Match together with the scratch the walk needs. Reuse one Match
// per goroutine: after warm-up a match allocates nothing. A Match is for one goroutine at a time.
type Match struct {
	// Slots lists every worker slot that holds the query's first block, ascending.
	Slots []Slot
	// Depth[i] is the number of contiguous leading query blocks Slots[i] holds (≥ 1).
	Depth []int32
	// Cached[i] is the total number of blocks Slots[i] holds in the index.
	Cached []int64
	// Lookups is the number of entries the walk looked up: it stops at the first block that no
	// remaining worker holds.
	Lookups int

	// Seqs holds the sequence hashes that MatchTokens computed.
	Seqs []uint64

	act    []int32  // positions in Slots still walking (list mode)
	bits   []uint64 // slots still walking (bitset mode)
	pos    []int32  // slot → position in Slots (bitset mode)
	hasher Hasher
}

// bitsModeMin is the number of first-block holders from which the walk intersects bitsets word
// by word instead of testing each walking slot. List mode therefore never walks more than
// max(bitsModeMin-1, cellsMax) = 64 slots, which the cells case relies on.
const bitsModeMin = 64

// MatchTokens hashes the full blocks of tokens (with seed, see LoRASeed) into m.Seqs and matches
// them.
func (ix *Index) MatchTokens(tokens []uint32, seed uint64, m *Match) {
	m.Seqs = m.hasher.AppendSequence(m.Seqs[:0], tokens, ix.blockSize, seed)
	ix.Match(m.Seqs, m)
}

// Match walks the sequence hashes of a request (seqs[0] is the root block) and fills m with, for
// every slot that holds the first block, how many contiguous leading blocks it holds. A slot's
// depth ends at its first missing block, whatever it holds further down. The walk stops as soon
// as no slot is left. Lock-free; safe alongside writers.
func (ix *Index) Match(seqs []uint64, m *Match) {
	m.Slots, m.Depth, m.Cached, m.Lookups = m.Slots[:0], m.Depth[:0], m.Cached[:0], 0
	if len(seqs) == 0 {
		return
	}
	h, s := ix.holders(seqs[0])
	m.Lookups = 1
	m.Slots = appendMembers(m.Slots, h, s)
	n := len(m.Slots)
	if n == 0 {
		return
	}
	m.Depth = slices.Grow(m.Depth, n)[:n]
	m.Cached = slices.Grow(m.Cached, n)[:n]
	for i, x := range m.Slots {
		m.Cached[i] = ix.Blocks(x)
	}

	var i int
	var act []int32
	if s != nil && s.bits != nil && n >= bitsModeMin {
		i, act = ix.walkBits(seqs, m)
	} else {
		i, act = 1, m.act[:0]
		for p := range n {
			act = append(act, int32(p))
		}
	}
	for ; i < len(seqs) && len(act) > 0; i++ {
		h, s := ix.holders(seqs[i])
		m.Lookups++
		k := 0
		switch {
		case s == nil:
			f0, f1, f2 := h&fieldMask, h>>fieldBits&fieldMask, h>>(2*fieldBits)&fieldMask
			for _, p := range act {
				if f := uint64(m.Slots[p]) + 1; f == f0 || f == f1 || f == f2 {
					act[k] = p
					k++
				} else {
					m.Depth[p] = int32(i)
				}
			}
		case s.bits != nil:
			for _, p := range act {
				if s.has(m.Slots[p]) {
					act[k] = p
					k++
				} else {
					m.Depth[p] = int32(i)
				}
			}
		default:
			// Cells are unordered: look each holder up among the walking slots (ascending, and
			// at most 64 in list mode, so a mask marks the ones to keep).
			var keep uint64
			for c := range s.cells {
				v := atomic.LoadUint32(&s.cells[c])
				if v == 0 {
					continue
				}
				x := Slot(v - 1)
				lo, hi := 0, len(act)
				for lo < hi {
					if mid := int(uint(lo+hi) >> 1); m.Slots[act[mid]] < x {
						lo = mid + 1
					} else {
						hi = mid
					}
				}
				if lo < len(act) && m.Slots[act[lo]] == x {
					keep |= 1 << lo
				}
			}
			for j, p := range act {
				if keep&(1<<j) != 0 {
					act[k] = p
					k++
				} else {
					m.Depth[p] = int32(i)
				}
			}
		}
		act = act[:k]
	}
	for _, p := range act {
		m.Depth[p] = int32(i)
	}
	m.act = act[:0]
}

// walkBits walks while many slots are still in: the walking set is a bitset intersected a word
// at a time with the holder bitsets. At the first entry without a bitset (few holders) it hands
// over to list mode: it returns the next block to look at and the positions still walking.
func (ix *Index) walkBits(seqs []uint64, m *Match) (int, []int32) {
	hi := int(m.Slots[len(m.Slots)-1])>>6 + 1
	m.bits = slices.Grow(m.bits[:0], hi)[:hi]
	clear(m.bits)
	if need := hi << 6; len(m.pos) < need {
		m.pos = slices.Grow(m.pos[:0], need)[:need]
	}
	for p, x := range m.Slots {
		m.bits[x>>6] |= 1 << (x & 63)
		m.pos[x] = int32(p)
	}
	lo := int(m.Slots[0]) >> 6
	for i := 1; i < len(seqs); i++ {
		h, s := ix.holders(seqs[i])
		m.Lookups++
		if s == nil || s.bits == nil {
			// Few holders here: keep those still walking, the rest stop at i.
			var buf [bitsModeMin]Slot
			act := m.act[:0]
			for _, x := range appendMembers(buf[:0], h, s) {
				if w := int(x >> 6); w >= lo && w < hi && m.bits[w]&(1<<(x&63)) != 0 {
					m.bits[w] &^= 1 << (x & 63)
					act = append(act, m.pos[x])
				}
			}
			m.dropBits(lo, hi, int32(i))
			return i + 1, act
		}
		any := uint64(0)
		for w := lo; w < hi; w++ {
			a := m.bits[w]
			if a == 0 {
				continue
			}
			var b uint64
			if w < len(s.bits) {
				b = atomic.LoadUint64(&s.bits[w])
			}
			for d := a &^ b; d != 0; d &= d - 1 {
				m.Depth[m.pos[w<<6|bits.TrailingZeros64(d)]] = int32(i)
			}
			m.bits[w] = a & b
			any |= a & b
		}
		if any == 0 {
			return i + 1, m.act[:0]
		}
		for m.bits[lo] == 0 {
			lo++
		}
		for m.bits[hi-1] == 0 {
			hi--
		}
	}
	m.dropBits(lo, hi, int32(len(seqs)))
	return len(seqs), m.act[:0]
}

// dropBits ends the walk at depth d for every slot still set in m.bits[lo:hi], and clears them.
func (m *Match) dropBits(lo, hi int, d int32) {
	for w := lo; w < hi; w++ {
		for b := m.bits[w]; b != 0; b &= b - 1 {
			m.Depth[m.pos[w<<6|bits.TrailingZeros64(b)]] = d
		}
		m.bits[w] = 0
	}
}

func (ix *Index) holders(seq uint64) (uint64, *holderSet) {
	m := ix.mix(seq)
	return ix.segment(m).holders(seq, m)
}
