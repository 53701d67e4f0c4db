package radix

import (
	"math/bits"
	"slices"
	"sync/atomic"
)

// A holder word is the 64-bit value an entry keeps next to its key:
//
//	0                       empty table slot (no key)
//	occupied                the key is present but no slot holds it (a dead entry)
//	occupied | f2 f1 f0     up to three holders inline: three 20-bit fields, each slot+1 or 0
//	occupied | overflow | i more holders: i is the index of a holderSet in the segment's set table
//
// plus the reused bit on a slot whose key was replaced once already (see table.go), and the
// referenced bit (refBit) on an entry a match walked since an eviction sweep cleared it, when the
// index tracks matches. A holder word
// is replaced with one atomic store, so a reader always sees a whole state.
const (
	occupied = uint64(1) << 63
	overflow = uint64(1) << 62
	reused   = uint64(1) << 61
	// refBit marks an entry matched since the eviction sweep last passed it (Index.TrackMatches).
	refBit    = uint64(1) << 60
	fieldBits = 20
	fieldMask = uint64(1)<<fieldBits - 1
	inlineMax = 3
)

// holderSet holds the holders of an entry that has had more than inlineMax of them.
//
// Exactly one of cells and bits is set, before publication, and neither slice is ever
// reassigned: growing past its capacity publishes a new holderSet. Within a set, the writer
// changes single cells or bit words with atomic stores and operations, and a holder, once in, is
// never moved; so a reader sees every holder that no writer touches, exactly, and any other
// holder as it was at some moment. Sets are changed in place, not copied, so that holders
// joining and leaving allocate nothing; a set lives until its entry has no holder left, and a
// segment rebuild turns sets of at most inlineMax holders back into inline words.
type holderSet struct {
	key   uint64   // the sequence hash this set belongs to; readers check it (see segment.resolve)
	cells []uint32 // unordered; each 0 (free) or slot+1
	bits  []uint64 // bit s set: slot s holds the block
	n     int      // number of holders; REQUIRES the segment lock (readers never look)
	// fp is the XOR of slotKey over the holders, stored after each change to cells or bits: two
	// sets with the same fp hold the same slots but with probability 2^-64, whatever their
	// forms, which lets a walk skip a block whose holders are the block before's (see Match).
	fp atomic.Uint64
}

// slotKey is slot x's pseudo-random 64-bit key (splitmix64's finalizer), for holderSet.fp.
func slotKey(x Slot) uint64 {
	z := uint64(x) + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Cell arrays grow 8 → 16 → 32 → 64 (cellsMax); a bitset takes over when it is the smaller.
const (
	cellsMin = 8
	cellsMax = 64
)

func (s *holderSet) has(x Slot) bool {
	if s.bits != nil {
		w := int(x >> 6)
		return w < len(s.bits) && atomic.LoadUint64(&s.bits[w])&(1<<(x&63)) != 0
	}
	v := uint32(x) + 1
	for i := range s.cells {
		if atomic.LoadUint32(&s.cells[i]) == v {
			return true
		}
	}
	return false
}

// appendMembers appends the holders of an entry, ascending.
func appendMembers(dst []Slot, h uint64, s *holderSet) []Slot {
	n := len(dst)
	if s == nil {
		for shift := 0; shift < inlineMax*fieldBits; shift += fieldBits {
			if f := h >> shift & fieldMask; f != 0 {
				dst = append(dst, Slot(f-1))
			}
		}
		sortSmall(dst[n:])
		return dst
	}
	if s.bits == nil {
		for i := range s.cells {
			if v := atomic.LoadUint32(&s.cells[i]); v != 0 {
				dst = append(dst, Slot(v-1))
			}
		}
		sortSmall(dst[n:])
		return dst
	}
	for w := range s.bits {
		for b := atomic.LoadUint64(&s.bits[w]); b != 0; b &= b - 1 {
			dst = append(dst, Slot(w<<6|bits.TrailingZeros64(b)))
		}
	}
	return dst
}

// sortSmall sorts at most cellsMax holders without the generic sort's call overhead.
func sortSmall(s []Slot) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// dead reports whether an occupied slot's entry has no holders.
func dead(h uint64) bool { return h&^(reused|refBit) == occupied }

func inlineHas(h uint64, x Slot) bool {
	f := uint64(x) + 1
	return h&fieldMask == f || h>>fieldBits&fieldMask == f || h>>(2*fieldBits)&fieldMask == f
}

// inlineWord packs at most inlineMax holders into a holder word.
func inlineWord(members []Slot) uint64 {
	h := occupied
	for i, x := range members {
		h |= (uint64(x) + 1) << (i * fieldBits)
	}
	return h
}

// cellsLimit is the largest cell array worth keeping: beyond it a bitset over all slots is
// smaller (4 bytes a cell, 1 bit a slot). Below cellsMin, cells are skipped.
func (ix *Index) cellsLimit() int {
	words := (int(ix.slots.high.Load()) + 63) / 64
	return min(2*words, cellsMax)
}

func (ix *Index) newBits(key uint64, members []Slot, extra Slot) *holderSet {
	words := max((int(ix.slots.high.Load())+63)/64, int(extra)/64+1)
	s := &holderSet{key: key, bits: make([]uint64, words), n: len(members) + 1}
	fp := slotKey(extra)
	for _, x := range members {
		s.bits[x>>6] |= 1 << (x & 63)
		fp ^= slotKey(x)
	}
	s.bits[extra>>6] |= 1 << (extra & 63)
	s.fp.Store(fp)
	return s
}

func newCells(key uint64, size int, members []Slot, extra Slot) *holderSet {
	s := &holderSet{key: key, cells: make([]uint32, size), n: len(members) + 1}
	fp := slotKey(extra)
	for i, x := range members {
		s.cells[i] = uint32(x) + 1
		fp ^= slotKey(x)
	}
	s.cells[len(members)] = uint32(extra) + 1
	s.fp.Store(fp)
	return s
}

// overflowSet returns a new set holding members and extra, in the smaller form.
func (ix *Index) overflowSet(key uint64, members []Slot, extra Slot) *holderSet {
	need := len(members) + 1
	if lim := ix.cellsLimit(); lim >= cellsMin && need <= lim {
		size := cellsMin
		for size < need {
			size *= 2
		}
		return newCells(key, min(size, lim), members, extra)
	}
	return ix.newBits(key, members, extra)
}

// addHolder returns the holder word of key with slot x added and whether x was not a holder yet.
// It may publish or replace holder sets. REQUIRES g.mu.
func (g *segment) addHolder(ix *Index, key, h uint64, x Slot) (uint64, bool) {
	if h&overflow == 0 {
		if inlineHas(h, x) {
			return h, false
		}
		for shift := 0; shift < inlineMax*fieldBits; shift += fieldBits {
			if h>>shift&fieldMask == 0 {
				return h | (uint64(x)+1)<<shift, true
			}
		}
		var buf [inlineMax]Slot
		s := ix.overflowSet(key, appendMembers(buf[:0], h, nil), x)
		return occupied | overflow | h&reused | uint64(g.putSet(s)), true
	}
	idx := uint32(h)
	s := g.set(idx)
	if s.has(x) {
		return h, false
	}
	if s.bits != nil {
		if w := int(x >> 6); w < len(s.bits) {
			atomic.OrUint64(&s.bits[w], 1<<(x&63))
			s.fp.Store(s.fp.Load() ^ slotKey(x))
			s.n++
			return h, true
		}
		// x is a slot handed out after the bitset was sized.
		var buf [cellsMax]Slot
		g.replaceSet(idx, ix.newBits(key, appendMembers(buf[:0], 0, s), x))
		return h, true
	}
	if s.n < len(s.cells) {
		for i := range s.cells {
			if s.cells[i] == 0 {
				atomic.StoreUint32(&s.cells[i], uint32(x)+1)
				s.fp.Store(s.fp.Load() ^ slotKey(x))
				s.n++
				return h, true
			}
		}
	}
	var buf [cellsMax]Slot
	g.replaceSet(idx, ix.overflowSet(key, appendMembers(buf[:0], 0, s), x))
	return h, true
}

// removeHolder returns the holder word of key with slot x removed and whether x was a holder.
// REQUIRES g.mu.
func (g *segment) removeHolder(ix *Index, key, h uint64, x Slot) (uint64, bool) {
	if h&overflow == 0 {
		f := uint64(x) + 1
		for shift := 0; shift < inlineMax*fieldBits; shift += fieldBits {
			if h>>shift&fieldMask == f {
				return h &^ (fieldMask << shift), true
			}
		}
		return h, false
	}
	idx := uint32(h)
	s := g.set(idx)
	if s.bits != nil {
		w := int(x >> 6)
		if w >= len(s.bits) || atomic.AndUint64(&s.bits[w], ^(1<<(x&63)))&(1<<(x&63)) == 0 {
			return h, false
		}
	} else {
		i := slices.Index(s.cells, uint32(x)+1)
		if i < 0 {
			return h, false
		}
		atomic.StoreUint32(&s.cells[i], 0)
	}
	s.fp.Store(s.fp.Load() ^ slotKey(x))
	if s.n--; s.n == 0 {
		g.freeSet(idx)
		return occupied | h&reused, true
	}
	return h, true
}
