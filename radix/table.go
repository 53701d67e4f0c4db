package radix

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The index is split into segments by the top bits of the mixed key. Each segment is an
// open-addressing table with linear probing, its own writer lock and its own growth, so a
// rebuild copies one segment only and blocks only that segment's writers. Readers never lock.
//
// Reader safety rests on these rules:
//   - a slot's key is written before its holder word first becomes non-zero. A removed entry
//     stays as a dead entry (no holders) and revives in place if its key is stored again. A new
//     key may take over a dead slot, but each slot changes its key at most once per table (the
//     reused bit marks it), and the writer stores the new key before the new holder word. A
//     reader loads a key, then the holder word, then the key again: if the key changed, the slot
//     was taken over, which only happens to dead entries, so "no holders" is a true answer for
//     the key it wanted at that moment; and since a key changes only once, an unchanged key
//     means the holder word belongs to it. Keys are atomics because readers compare a bucket's
//     keys before knowing which slots are filled;
//   - a rebuild fills a new table privately and publishes it with one atomic store; writers use
//     only the newest table, readers may finish on an older one, which no one writes any more;
//   - a holder word changes with one atomic store (holders.go).
//
// Taking over dead slots keeps insertions short (a new key usually lands in its home bucket)
// and halves the rebuilds a steady churn of new and evicted blocks would otherwise cause.
const (
	segBits = 8
	numSegs = 1 << segBits

	// Load limits, counting dead entries. A rebuild sizes the table so that the live entries fill
	// at most lowLoad of it; it grows by about 3/2 each time.
	maxLoadNum, maxLoadDen = 4, 5  // 0.8
	lowLoadNum, lowLoadDen = 8, 15 // 0.8 / 1.5

	minTable = 16 // slots; segment bases spread over [16, 24)
)

type entry struct {
	key atomic.Uint64 // sequence hash; see the rules above
	h   atomic.Uint64 // holder word; 0 = empty slot
}

// A key's probe starts at the first slot of its home bucket of bucketSlots slots (one cache line
// of entries), so that the key is usually in the line the probe loads first, and the bucket's
// slots are compared without branches.
const bucketSlots = 4

type table struct {
	slots   []entry // a multiple of bucketSlots
	maxUsed int     // a write that would take used past this rebuilds first
}

type bucket [bucketSlots]entry

// bucketAt returns the home bucket of a mixed key.
func (t *table) bucketAt(m uint64) *bucket {
	p := t.home(m)
	return (*bucket)(t.slots[p : p+bucketSlots])
}

// find looks key up in its home bucket alone. ok is false when the probe must go on to the next
// bucket (the bucket is full of other keys); otherwise h is the holder word, 0 if absent.
// key must not be 0: an empty slot's key reads as 0.
func (b *bucket) find(key uint64) (h uint64, ok bool) {
	found := b2u(b[0].key.Load() == key) | b2u(b[1].key.Load() == key)<<1 |
		b2u(b[2].key.Load() == key)<<2 | b2u(b[3].key.Load() == key)<<3
	if found != 0 {
		// A slot being filled shows its key before its holder word: then h is 0, "not yet".
		e := &b[bits.TrailingZeros(found)&(bucketSlots-1)]
		readerPause()
		h = e.h.Load()
		if e.key.Load() != key {
			return 0, true // taken over: the key was dead (see the rules above)
		}
		return h, true
	}
	return 0, b[0].h.Load() == 0 || b[1].h.Load() == 0 || b[2].h.Load() == 0 || b[3].h.Load() == 0
}

// home maps a mixed key to the first slot of its home bucket. The top segBits bits chose the
// segment, so the bucket uses the bits below them (fast range reduction: any table size works).
func (t *table) home(m uint64) int {
	hi, _ := bits.Mul64(m<<segBits, uint64(len(t.slots)/bucketSlots))
	return int(hi) * bucketSlots
}

// find returns the holder word of key, or 0 if the table has no entry for it.
func (t *table) find(key, m uint64) uint64 {
	if key != 0 {
		if h, ok := t.bucketAt(m).find(key); ok {
			return h
		}
	}
	return t.findFrom(key, t.home(m))
}

// findFrom is find starting the probe at bucket start b. A slot never becomes empty again once
// filled, and a key goes to the first free slot of its probe, so an empty slot ends the search.
func (t *table) findFrom(key uint64, b int) uint64 {
	s := t.slots
	for {
		e := s[b : b+bucketSlots : b+bucketSlots]
		found := b2u(e[0].key.Load() == key) | b2u(e[1].key.Load() == key)<<1 |
			b2u(e[2].key.Load() == key)<<2 | b2u(e[3].key.Load() == key)<<3
		for ; found != 0; found &= found - 1 {
			x := &e[bits.TrailingZeros(found)&(bucketSlots-1)]
			readerPause()
			// h == 0: an empty slot (looking for key 0) or one being filled; a changed key: taken
			// over, the key was dead. Either way not a holder word of key.
			if h := x.h.Load(); h != 0 && x.key.Load() == key {
				return h
			}
		}
		if e[0].h.Load() == 0 || e[1].h.Load() == 0 || e[2].h.Load() == 0 || e[3].h.Load() == 0 {
			return 0
		}
		if b += bucketSlots; b == len(s) {
			b = 0
		}
	}
}

func b2u(b bool) uint {
	if b {
		return 1
	}
	return 0
}

// probe returns the position of key if the table has it; otherwise where it should go: the first
// dead slot of its probe that was never taken over (reuse), else the empty slot that ends the
// probe. REQUIRES the segment lock.
func (t *table) probe(key, m uint64) (i int, found, reuse bool) {
	s := t.slots
	take := -1
	for i = t.home(m); ; {
		e := &s[i]
		h := e.h.Load()
		if h == 0 {
			if take >= 0 {
				return take, false, true
			}
			return i, false, false
		}
		if e.key.Load() == key {
			return i, true, false
		}
		if take < 0 && h&^refBit == occupied {
			take = i
		}
		if i++; i == len(s) {
			i = 0
		}
	}
}

// segment keeps the fields every lookup reads apart from the writers' fields, which change on
// every write (a lock word shared with readers would send its cache line back and forth between
// cores on each write), each part in its own 128-byte line pair.
type segment struct {
	tab  atomic.Pointer[table]
	sets atomic.Pointer[setTable]
	base int // capacity seed: segments grow out of phase (see newTable)
	_    [128 - 24]byte

	mu   sync.Mutex
	used int          // REQUIRES mu: live + dead entries in tab
	live atomic.Int64 // entries with at least one holder; written under mu
	free []uint32     // REQUIRES mu: unused set table indexes
	// compacted collects, during a rebuild, sets turned back into inline words; they are freed
	// once the new table is published, so readers of the old one still find them.
	compacted []uint32 // REQUIRES mu
	_         [128 - 72]byte
}

type setTable struct {
	p []atomic.Pointer[holderSet]
}

// newTable returns an empty table that holds need live entries at no more than lowLoad.
//
// Segments start from different bases (16 to 23 slots, spread over one growth factor), so they
// reach their growth points at different total sizes and the index as a whole sits near the
// average load instead of all segments doubling at once, which would swing memory by 1.5×.
func newTable(base, need int) *table {
	return newTableAt(base, need, lowLoadNum, lowLoadDen)
}

// newTableAt is newTable filled to at most num/den (below maxLoad).
func newTableAt(base, need, num, den int) *table {
	c := base
	for c*num < need*den {
		c = c * 3 / 2
	}
	c = (c + bucketSlots - 1) &^ (bucketSlots - 1)
	return &table{slots: make([]entry, c), maxUsed: c * maxLoadNum / maxLoadDen}
}

func (g *segment) init(i int) {
	g.base = minTable + i*minTable/2/numSegs
	g.tab.Store(newTable(g.base, 0))
	g.sets.Store(&setTable{})
}

// rebuild copies the live entries into a new table sized for need and publishes it.
// REQUIRES g.mu.
func (g *segment) rebuild(ix *Index, need int) *table {
	old := g.tab.Load()
	t := newTable(g.base, need)
	for i := range old.slots {
		e := &old.slots[i]
		h := e.h.Load()
		if h == 0 || dead(h) {
			continue
		}
		h &^= reused // a fresh slot
		if h&overflow != 0 {
			if s := g.set(uint32(h)); s.n <= inlineMax {
				var buf [inlineMax]Slot
				g.compacted = append(g.compacted, uint32(h))
				h = inlineWord(appendMembers(buf[:0], 0, s))
			}
		}
		key := e.key.Load()
		j, _, _ := t.probe(key, ix.mix(key))
		// t is not published yet: plain stores (an atomic store is a locked instruction on
		// amd64, twice per entry copied); publishing t with an atomic store orders them.
		*(*uint64)(unsafe.Pointer(&t.slots[j].key)) = key
		*(*uint64)(unsafe.Pointer(&t.slots[j].h)) = h
	}
	g.used = int(g.live.Load())
	g.tab.Store(t)
	for _, idx := range g.compacted {
		g.freeSet(idx)
	}
	g.compacted = g.compacted[:0]
	return t
}

// add makes x a holder of key. REQUIRES g.mu.
func (g *segment) add(ix *Index, key, m uint64, x Slot) bool {
	t := g.tab.Load()
	i, found, reuse := t.probe(key, m)
	if !found {
		flags := uint64(0)
		if reuse {
			flags = reused // the slot's one change of key in this table
		} else if g.used >= t.maxUsed {
			t = g.rebuild(ix, int(g.live.Load())+1)
			i, _, _ = t.probe(key, m) // a fresh table has no dead slots
		}
		if !reuse {
			g.used++
		}
		e := &t.slots[i]
		e.key.Store(key) // before the holder word: see the rules above
		e.h.Store(occupied | flags | (uint64(x) + 1))
		g.live.Add(1)
		return true
	}
	e := &t.slots[i]
	h := e.h.Load()
	nh, added := g.addHolder(ix, key, h, x)
	if !added {
		return false
	}
	if nh != h {
		e.h.Store(nh)
	}
	if dead(h) {
		g.live.Add(1)
	}
	return true
}

// remove drops x from the holders of key. REQUIRES g.mu.
func (g *segment) remove(ix *Index, key, m uint64, x Slot) bool {
	t := g.tab.Load()
	i, found, _ := t.probe(key, m)
	if !found {
		return false
	}
	e := &t.slots[i]
	h := e.h.Load()
	nh, removed := g.removeHolder(ix, key, h, x)
	if !removed {
		return false
	}
	if nh != h {
		e.h.Store(nh)
	}
	if dead(nh) {
		live := int(g.live.Add(-1))
		// Mostly dead: rebuild smaller so that memory follows the index down.
		if g.used > 4*minTable && live < g.used/4 {
			g.rebuild(ix, live)
		}
	}
	return true
}

// holders returns the holder word of key and, for an overflow word, its holder set. Lock-free.
func (g *segment) holders(key, m uint64) (uint64, *holderSet) {
	return g.holdersFrom(g.tab.Load(), key, m)
}

// holdersFrom is holders starting from table t, which may be stale (tests pass an old one).
func (g *segment) holdersFrom(t *table, key, m uint64) (uint64, *holderSet) {
	return g.resolve(key, m, t.find(key, m))
}

// resolve finishes a lookup of key that found holder word h in some table: for an overflow word it
// fetches the set, retrying from the newest table if the word was stale.
func (g *segment) resolve(key, m, h uint64) (uint64, *holderSet) {
	for attempt := 0; ; attempt++ {
		if h&overflow == 0 {
			return h, nil
		}
		// The set index was read from a holder word that may be stale by now: the set may have
		// been freed and its index reused for another key. The key check catches that; a retry
		// reads the newest table.
		st := g.sets.Load()
		if idx := uint32(h); int(idx) < len(st.p) {
			if s := st.p[idx].Load(); s != nil && s.key == key {
				return h, s
			}
		}
		if attempt == 3 {
			// Writers keep changing this entry under us; wait for them once.
			g.mu.Lock()
			h = g.tab.Load().find(key, m)
			var s *holderSet
			if h&overflow != 0 {
				s = g.set(uint32(h))
			}
			g.mu.Unlock()
			return h, s
		}
		h = g.tab.Load().find(key, m)
	}
}

// set returns the holder set at idx. REQUIRES g.mu.
func (g *segment) set(idx uint32) *holderSet { return g.sets.Load().p[idx].Load() }

// putSet stores s at a free index and returns it. REQUIRES g.mu.
func (g *segment) putSet(s *holderSet) uint32 {
	if len(g.free) == 0 {
		old := g.sets.Load()
		n := max(2*len(old.p), 8)
		nt := &setTable{p: make([]atomic.Pointer[holderSet], n)}
		for i := range old.p {
			nt.p[i].Store(old.p[i].Load())
		}
		for i := n - 1; i >= len(old.p); i-- {
			g.free = append(g.free, uint32(i))
		}
		g.sets.Store(nt)
	}
	idx := g.free[len(g.free)-1]
	g.free = g.free[:len(g.free)-1]
	g.sets.Load().p[idx].Store(s)
	return idx
}

// replaceSet publishes s in place of the set at idx (same key). REQUIRES g.mu.
func (g *segment) replaceSet(idx uint32, s *holderSet) { g.sets.Load().p[idx].Store(s) }

// freeSet releases the set at idx. REQUIRES g.mu.
func (g *segment) freeSet(idx uint32) {
	g.sets.Load().p[idx].Store(nil)
	g.free = append(g.free, idx)
}
