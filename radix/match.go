package radix

import (
	"math/bits"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/internal/prefetch"
)

// Match is the result of Index.Match together with the scratch the walk needs. Reuse one Match
// per goroutine: after warm-up a match allocates nothing. A Match is for one goroutine at a time.
type Match struct {
	// Slots lists every worker slot that holds the query's first block, ascending.
	Slots []Slot
	// Depth[i] is the number of contiguous leading query blocks Slots[i] holds (≥ 1). Their
	// total block counts, if wanted, are Index.FillBlocks(Slots, …).
	Depth []int32
	// Lookups is the number of query blocks the walk examined: it stops at the first block that
	// no remaining worker holds.
	Lookups int

	// Seqs holds the sequence hashes that MatchTokens computed.
	Seqs []uint64

	// Tiers lists, when the model has a lower-tier index, every slot that a lower tier extends
	// (at least one block beyond its device depth, which may be 0), ascending by slot; empty
	// otherwise. Slots and Depth stay the device match. See tiers.go.
	Tiers []TierMatch

	act    []int32  // positions in Slots still walking (list mode)
	root   []uint64 // bitset mode: the first block's holders, as the walk read them
	rank   []int32  // bitset mode: rank[w] = position in Slots of word w's first holder
	bits   []uint64 // bitset mode: slots still walking
	was    []uint64 // bitset mode: m.bits before the block that hands over to list mode; only [lo:hi) is set
	rootFP uint64   // bitset mode: the first block's holderSet.fp, read before m.root
	hasher Hasher

	walk, walk2 []tierWalk // the lower tiers' walk (tiers.go)
	hold        []Slot
	starts      []int32
}

// window is how many blocks the walk prefetches ahead: while it resolves and intersects one
// window of blocks, the home buckets of the next window are being loaded.
const window = 16

// When the first block's holders are a bitset the walk intersects bitsets a word at a time
// (walkBits); otherwise (inline or cells) it tests each walking slot ("list mode"). List mode
// therefore never walks more than cellsMax = 64 slots, which the cells case relies on.

// MatchTokens hashes the full blocks of tokens (with seed, see LoRASeed) into m.Seqs and matches
// them.
func (ix *Index) MatchTokens(tokens []uint32, seed uint64, m *Match) {
	m.Seqs = m.hasher.AppendSequence(m.Seqs[:0], tokens, ix.blockSize, seed)
	ix.Match(m.Seqs, m)
}

// Match walks the sequence hashes of a request (seqs[0] is the root block) and fills m with, for
// every slot that holds the first block, how many contiguous leading blocks it holds. A slot's
// depth ends at its first missing block, whatever it holds further down. The walk stops as soon
// as no slot is left. When the model has lower tiers, m.Tiers gets each slot's extensions
// through them. Lock-free; safe alongside writers.
func (ix *Index) Match(seqs []uint64, m *Match) {
	ix.match(seqs, m)
	if lt := ix.lower.Load(); lt != nil {
		ix.extend(lt, seqs, m)
	} else {
		m.Tiers = m.Tiers[:0]
	}
}

// match is Match on this index alone.
func (ix *Index) match(seqs []uint64, m *Match) {
	m.Slots, m.Depth, m.Lookups = m.Slots[:0], m.Depth[:0], 0
	if len(seqs) == 0 {
		return
	}
	var la lookahead
	la.start(ix, seqs)
	h, s := la.at(0)
	m.Lookups = 1
	bitsMode := s != nil && s.bits != nil
	if bitsMode {
		m.snapshotRoot(s)
	} else {
		m.Slots = appendMembers(m.Slots, h, s)
	}
	n := len(m.Slots)
	if n == 0 {
		return
	}
	m.Depth = slices.Grow(m.Depth, n)[:n]

	var i int
	var act []int32
	if bitsMode {
		i, act = ix.walkBits(&la, m)
	} else {
		i, act = 1, m.act[:0]
		for p := range n {
			act = append(act, int32(p))
		}
	}
	// The holders of the block before i, to skip blocks that have the same (a long prefix that
	// the same workers hold whole): an inline holder word (prev == inlined), or a holder set's
	// fingerprint (prev == fingerprinted). Only slots a writer is changing during the walk can
	// come out otherwise than by intersecting, and those may be seen either way anyway.
	const (
		unknown = iota
		inlined
		fingerprinted
	)
	prev, prevWord := unknown, uint64(0)
	if !bitsMode {
		if s != nil {
			prev, prevWord = fingerprinted, s.fp.Load()
		} else {
			prev, prevWord = inlined, h&^(reused|refBit)
		}
	}
	for i < len(seqs) && len(act) > 0 {
		if i >= la.end {
			la.advance()
		}
		base := la.base
		for _, h := range la.hs[i-base : la.end-base] {
			if h&overflow == 0 {
				if h &^= reused | refBit; prev == inlined && h == prevWord {
					i++
					continue
				}
				prev, prevWord = inlined, h
				// Up to three holders inline (the common case), without a call.
				f0, f1, f2 := h&fieldMask, h>>fieldBits&fieldMask, h>>(2*fieldBits)&fieldMask
				k := 0
				for _, p := range act {
					if f := uint64(m.Slots[p]) + 1; f == f0 || f == f1 || f == f2 {
						act[k] = p
						k++
					} else {
						m.Depth[p] = int32(i)
					}
				}
				act = act[:k]
			} else {
				hs := la.ss[i-base]
				if fp := hs.fp.Load(); prev == fingerprinted && fp == prevWord {
					i++
					continue
				} else {
					prev, prevWord = fingerprinted, fp
				}
				act = m.step(act, hs, int32(i))
			}
			i++
			if len(act) == 0 {
				break
			}
		}
	}
	m.Lookups = max(m.Lookups, i)
	for _, p := range act {
		m.Depth[p] = int32(i)
	}
	m.act = act[:0]
}

// lookahead serves a walk the holders of its blocks in order. Blocks come in windows of
// window blocks (window k is blocks [k·window, (k+1)·window)); before resolving window k it
// prefetches the home buckets of window k+2, so every window's misses have two windows of work
// to complete behind, instead of adding up. It lives on the walk's stack.
type lookahead struct {
	ix        *Index
	seqs      []uint64
	base, end int // blocks [base, end) are resolved into hs/ss
	// buckets[k%3] holds the planned buckets of window k.
	buckets [3][window]*bucket
	hs      [window]uint64
	ss      [window]*holderSet // valid where hs has the overflow bit
}

func (la *lookahead) start(ix *Index, seqs []uint64) {
	la.ix, la.seqs = ix, seqs
	// Plan the first two windows, the root block included, then resolve the root alone: the
	// rest is in flight while the caller expands the root's holders.
	la.plan(0)
	la.plan(1)
	la.base, la.end = 0, 1
	ix.resolve(seqs[:1], la.buckets[0][:1], la.hs[:1], la.ss[:1])
}

// plan prefetches window k, if the query has it.
func (la *lookahead) plan(k int) {
	lo := k * window
	if lo >= len(la.seqs) {
		return
	}
	hi := min(lo+window, len(la.seqs))
	la.ix.plan(la.seqs[lo:hi], la.buckets[k%3][:hi-lo])
}

// at returns the holders of block i; i counts up by one from 0.
func (la *lookahead) at(i int) (uint64, *holderSet) {
	if i >= la.end {
		la.advance()
	}
	h := la.hs[i-la.base]
	if h&overflow == 0 {
		return h, nil
	}
	return h, la.ss[i-la.base]
}

// advance resolves the rest of the window holding block la.end, after planning two windows on.
func (la *lookahead) advance() {
	lo := la.end
	k := lo / window
	hi := min((k+1)*window, len(la.seqs))
	la.plan(k + 2)
	off := lo - k*window
	la.ix.resolve(la.seqs[lo:hi], la.buckets[k%3][off:off+hi-lo], la.hs[:hi-lo], la.ss[:hi-lo])
	la.base, la.end = lo, hi
}

// step intersects the walking positions act with the holder set s of block i: the slots that
// lack it stop at depth i. (Inline holders are handled in Match's loop.)
func (m *Match) step(act []int32, s *holderSet, i int32) []int32 {
	k := 0
	switch {
	case s.bits != nil:
		for _, p := range act {
			if s.has(m.Slots[p]) {
				act[k] = p
				k++
			} else {
				m.Depth[p] = i
			}
		}
	default:
		// Cells are unordered: look each holder up among the walking slots (ascending, and at
		// most 64 in list mode, so a mask marks the ones to keep).
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
				m.Depth[p] = i
			}
		}
	}
	return act[:k]
}

// snapshotRoot reads the first block's holder bitset once into m.root and lists its slots in
// m.Slots; m.rank makes a slot's position in Slots a prefix popcount away.
func (m *Match) snapshotRoot(s *holderSet) {
	words := len(s.bits)
	m.rootFP = s.fp.Load()
	m.root = slices.Grow(m.root[:0], words)[:words]
	m.rank = slices.Grow(m.rank[:0], words)[:words]
	n := int32(0)
	for w := range s.bits {
		b := atomic.LoadUint64(&s.bits[w])
		m.root[w], m.rank[w] = b, n
		n += int32(bits.OnesCount64(b))
		if b == 1<<64-1 {
			// A full word (a prefix every worker of a large fleet holds): 64 slots in a row,
			// without a dependent bit scan each.
			base := Slot(w << 6)
			for j := range Slot(64) {
				m.Slots = append(m.Slots, base+j)
			}
			continue
		}
		for ; b != 0; b &= b - 1 {
			m.Slots = append(m.Slots, Slot(w<<6|bits.TrailingZeros64(b)))
		}
	}
}

// posOf returns the position in Slots of the holder at bit b of word w of the root.
func (m *Match) posOf(w, b int) int32 {
	return m.rank[w] + int32(bits.OnesCount64(m.root[w]&(1<<b-1)))
}

// stop ends the walk at depth d for the slots set in dropped of word w, of those set in walking
// (the word's slots still walking before this block).
func (m *Match) stop(w int, dropped, walking uint64, d int32) {
	if walking == m.root[w] {
		// The word's first stop (the usual case: a shared prefix ends for most of its holders):
		// its slots are one contiguous run, all set to d. Those that walk on are set again
		// when they stop, which comes later.
		start := m.rank[w]
		clear32(m.Depth[start:start+int32(bits.OnesCount64(walking))], d)
		return
	}
	for ; dropped != 0; dropped &= dropped - 1 {
		m.Depth[m.posOf(w, bits.TrailingZeros64(dropped))] = d
	}
}

func clear32(s []int32, v int32) {
	for i := range s {
		s[i] = v
	}
}

// walkBits walks while many slots are still in: the walking set is a bitset intersected a word
// at a time with the holder bitsets. At the first entry without a bitset (few holders) it hands
// over to list mode: it returns the next block to look at and the positions still walking.
func (ix *Index) walkBits(la *lookahead, m *Match) (int, []int32) {
	seqs := la.seqs
	m.bits = append(m.bits[:0], m.root...)
	lo, hi := 0, len(m.bits)
	for m.bits[lo] == 0 {
		lo++
	}
	for m.bits[hi-1] == 0 {
		hi--
	}
	prev := m.rootFP // of the block before i
	for i := 1; i < len(seqs); {
		h, s := la.at(i)
		m.Lookups++
		if s == nil || s.bits == nil {
			// Few holders here: keep those still walking, the rest stop at i. Each word stops
			// against what walked before this block (m.was), so that a word none of whose
			// slots has stopped yet is set whole (stop's fast path) even though a holder in it
			// walks on: with a thousand workers sharing a prefix and a few walking past it,
			// that is every word.
			var buf [cellsMax]Slot
			act := m.act[:0]
			m.was = slices.Grow(m.was[:0], len(m.bits))[:len(m.bits)]
			copy(m.was[lo:hi], m.bits[lo:hi])
			for _, x := range appendMembers(buf[:0], h, s) {
				if w := int(x >> 6); w >= lo && w < hi && m.bits[w]&(1<<(x&63)) != 0 {
					m.bits[w] &^= 1 << (x & 63)
					act = append(act, m.posOf(w, int(x&63)))
				}
			}
			m.dropWas(lo, hi, int32(i))
			return i + 1, act
		}
		// The same holders as the block before (the usual case deep in a prefix that a large
		// group of workers shares): every slot still walking holds this block too. Each fp is
		// read atomically, so only slots that a writer is adding or removing right now can be
		// seen otherwise than by intersecting, and those may be seen either way anyway.
		if fp := s.fp.Load(); fp == prev {
			i++
			continue
		} else {
			prev = fp
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
			if d := a &^ b; d != 0 {
				m.stop(w, d, a, int32(i))
			}
			m.bits[w] = a & b
			any |= a & b
		}
		i++
		if any == 0 {
			return i, m.act[:0]
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

// dropWas is dropBits where each word walked m.was[w] before this block: set whole if none of
// its slots has stopped yet, though some walk on (set again when they stop). A method of its own
// rather than a loop in walkBits: inline, it slowed walkBits's intersection loop (measured with
// 10,000 workers).
func (m *Match) dropWas(lo, hi int, d int32) {
	for w := lo; w < hi; w++ {
		if b := m.bits[w]; b != 0 {
			m.stop(w, b, m.was[w], d)
			m.bits[w] = 0
		}
	}
}

// dropBits ends the walk at depth d for every slot still set in m.bits[lo:hi].
func (m *Match) dropBits(lo, hi int, d int32) {
	for w := lo; w < hi; w++ {
		if b := m.bits[w]; b != 0 {
			m.stop(w, b, b, d)
			m.bits[w] = 0
		}
	}
}

// plan finds the home bucket of each key and prefetches them.
func (ix *Index) plan(keys []uint64, buckets []*bucket) {
	for j, k := range keys {
		m := ix.mix(k)
		buckets[j] = ix.segment(m).tab.Load().bucketAt(m)
	}
	prefetchBuckets(buckets[:len(keys)])
}

func prefetchBuckets(b []*bucket) {
	prefetch.Lines(unsafe.Slice((*unsafe.Pointer)(unsafe.Pointer(unsafe.SliceData(b))), len(b)))
}

// Prefetch starts loading where seqs would be probed, for a writer about to Add or Remove them:
// the misses then overlap instead of coming one per block. It loads two buckets per key: adding a
// new key probes on to the first empty slot, often past the home bucket (measured: +7% applied
// blocks/s at 10^6 residencies over the home bucket alone). Safe for concurrent use.
func (ix *Index) Prefetch(seqs []uint64) {
	var buckets [2 * window]*bucket
	for len(seqs) > 0 {
		n := min(len(seqs), window)
		for j, k := range seqs[:n] {
			m := ix.mix(k)
			t := ix.segment(m).tab.Load()
			p := t.home(m)
			buckets[2*j] = (*bucket)(t.slots[p : p+bucketSlots])
			if p += bucketSlots; p == len(t.slots) {
				p = 0
			}
			buckets[2*j+1] = (*bucket)(t.slots[p : p+bucketSlots])
		}
		prefetchBuckets(buckets[:2*n])
		seqs = seqs[n:]
	}
}

// resolve sets hs[j] (and ss[j] for an overflow word) to the holders of keys[j], from the
// planned buckets; a key not settled by its home bucket takes the full probe of the newest table.
func (ix *Index) resolve(keys []uint64, buckets []*bucket, hs []uint64, ss []*holderSet) {
	for j, k := range keys {
		h, ok := buckets[j].find(k)
		if !ok || k == 0 || h&overflow != 0 {
			m := ix.mix(k)
			g := ix.segment(m)
			if !ok || k == 0 {
				// The probe goes on past a full home bucket (or key 0 needs the careful path).
				h = g.tab.Load().find(k, m)
			}
			if h&overflow != 0 {
				h, ss[j] = g.resolve(k, m, h)
			}
		}
		hs[j] = h
		if ix.track && h != 0 && h&refBit == 0 {
			ix.touch(k)
		}
	}
}

// touch marks block k's entry as matched (refBit), following its probe from the home bucket as
// find does. Lock-free; a writer storing a new holder word at the same moment may clear the
// mark, which costs the block its reprieve only.
func (ix *Index) touch(k uint64) {
	m := ix.mix(k)
	t := ix.segment(m).tab.Load()
	s := t.slots
	for b := t.home(m); ; {
		e := s[b : b+bucketSlots : b+bucketSlots]
		empty := false
		for i := range e {
			x := &e[i]
			h := x.h.Load()
			if h != 0 && x.key.Load() == k {
				if h&refBit == 0 {
					x.h.Or(refBit)
				}
				return
			}
			empty = empty || h == 0
		}
		if empty {
			return
		}
		if b += bucketSlots; b == len(s) {
			b = 0
		}
	}
}

// TrackMatches makes matches mark the blocks they walk (see Unref), for an index whose owner
// evicts the least recently matched blocks. Call it before the index is shared; the device
// index's setting holds for its lower tiers too.
func (ix *Index) TrackMatches() { ix.track = true }

// Referenced reports whether a match marked block seq since the last Unref. Lock-free.
func (ix *Index) Referenced(seq uint64) bool {
	m := ix.mix(seq)
	return ix.segment(m).tab.Load().find(seq, m)&refBit != 0
}

// Unref reports whether a match marked block seq since the last Unref, and clears the mark, as
// an eviction does that ages blocks every one of which was used. Takes the segment's lock.
func (ix *Index) Unref(seq uint64) bool {
	m := ix.mix(seq)
	g := ix.segment(m)
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.tab.Load()
	i, found, _ := t.probe(seq, m)
	if !found {
		return false
	}
	if e := &t.slots[i]; e.h.Load()&refBit != 0 {
		e.h.And(^refBit)
		return true
	}
	return false
}
