package radix

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// loadFillNum/loadFillDen is the most a Load fills a table to.
const loadFillNum, loadFillDen = 3, 4

// ErrLoad is wrapped by every error of Load about its input.
var ErrLoad = errors.New("radix: bad bulk load")

// Blocks is a run of blocks for Load: block Keys[i] is held by Counts[i] distinct slots, which
// Holders lists run after run in the order of Keys, each run in any order. Plain data.
type Blocks struct {
	Keys    []uint64
	Counts  []uint32
	Holders []Slot
}

// Load adds blocks in bulk, given in parts. It is how a snapshot restore builds an index: each
// block is inserted once with its whole holder set, segment by segment, segments in parallel,
// each segment's table sized once and filled privately before it is published. The result is
// the index that Add of every (block, slot) pair would give. Every key must be new to the index,
// and every slot acquired. On an error the index holds some of the blocks: the caller discards
// it. Safe for concurrent use with readers; writers of the same index (Add, Remove) wait for
// each segment's load.
func (ix *Index) Load(parts ...Blocks) error {
	high := Slot(ix.slots.high.Load())
	nk, nh := 0, 0
	for p := range parts {
		b := &parts[p]
		if len(b.Counts) != len(b.Keys) {
			return fmt.Errorf("%w: %d keys, %d holder counts", ErrLoad, len(b.Keys), len(b.Counts))
		}
		total := 0
		for i, c := range b.Counts {
			if c == 0 || c > MaxSlots {
				return fmt.Errorf("%w: block %d has %d holders", ErrLoad, i, c)
			}
			total += int(c)
		}
		if total != len(b.Holders) {
			return fmt.Errorf("%w: %d holders counted, %d given", ErrLoad, total, len(b.Holders))
		}
		for _, x := range b.Holders {
			if x >= high || !ix.slots.info(x).live.Load() {
				return fmt.Errorf("%w: slot %d is not acquired", ErrLoad, x)
			}
		}
		nk, nh = nk+len(b.Keys), nh+total
	}
	// Count the blocks and holders of each segment; blocks not already listed by segment are
	// then copied into that order (below), so that each segment's load reads its input in order.
	var start [numSegs + 1]int
	var hstart [numSegs + 1]int
	// Scratch comes from a pool: a restore streams its index section through many Loads.
	own := loadPool.Get().(*loadScratch)
	defer loadPool.Put(own)
	seg := growTo(&own.seg, nk)
	i := 0
	for p := range parts {
		b := &parts[p]
		for j, k := range b.Keys {
			s := uint8(ix.mix(k) >> (64 - segBits))
			seg[i] = s
			start[int(s)+1]++
			hstart[int(s)+1] += int(b.Counts[j])
			i++
		}
	}
	for s := range numSegs {
		start[s+1] += start[s]
		hstart[s+1] += hstart[s]
	}
	// Keys already grouped by segment (a snapshot written under this index's salt) are read
	// where they lie (from several parts, each segment's run gathered into a buffer of its
	// goroutine first); others are scattered into copies first.
	grouped := true
	for i := 1; i < nk && grouped; i++ {
		grouped = seg[i] >= seg[i-1]
	}
	var sk []uint64
	var sc []uint32
	var sh []Slot
	if !grouped {
		sk, sc, sh = make([]uint64, nk), make([]uint32, nk), make([]Slot, nh)
		pos, hpos := start, hstart
		i = 0
		for p := range parts {
			b := &parts[p]
			h := 0
			for j, k := range b.Keys {
				s, c := seg[i], int(b.Counts[j])
				sk[pos[s]], sc[pos[s]] = k, b.Counts[j]
				pos[s]++
				copy(sh[hpos[s]:hpos[s]+c], b.Holders[h:h+c])
				hpos[s] += c
				h += c
				i++
			}
		}
	}
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range min(runtime.GOMAXPROCS(0), numSegs) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			blocks := make([]int64, high)
			seen := make([]uint64, (int(high)+63)/64)
			scr := loadPool.Get().(*loadScratch)
			defer loadPool.Put(scr)
			gk, gc, gh := scr.keys, scr.counts, scr.holders
			defer func() { scr.keys, scr.counts, scr.holders = gk, gc, gh }()
			for {
				s := int(next.Add(1) - 1)
				if s >= numSegs {
					break
				}
				lo, hi := start[s], start[s+1]
				if lo == hi {
					continue
				}
				var keys []uint64
				var counts []uint32
				var holders []Slot
				switch {
				case grouped && len(parts) == 1:
					b := &parts[0]
					keys, counts, holders = b.Keys[lo:hi], b.Counts[lo:hi], b.Holders[hstart[s]:hstart[s+1]]
				case grouped:
					gk, gc, gh = gather(parts, lo, hi, hstart[s], hstart[s+1], gk[:0], gc[:0], gh[:0])
					keys, counts, holders = gk, gc, gh
				default:
					keys, counts, holders = sk[lo:hi], sc[lo:hi], sh[hstart[s]:hstart[s+1]]
				}
				if err := ix.segs[s].load(ix, keys, counts, holders, blocks, seen, scr); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
			for x, n := range blocks {
				if n != 0 {
					ix.slots.count(Slot(x), ix.tier).Add(n)
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// ErrSalt is returned by SetSalt on an index that has held blocks.
var ErrSalt = errors.New("radix: the salt of an index that has held blocks")

// Salt is the index's placement salt (see SetSalt). Lock-free.
func (ix *Index) Salt() uint64 { return ix.salt }

// SetSalt gives an index that has never held a block the placement salt of another, so that a
// snapshot of that one, its blocks listed by Segment, loads without being sorted again (Load).
// The salt only spreads keys over the table; a secret one keeps crafted prompts from piling
// into one probe chain, and a snapshot's is as secret as the snapshot. Call it before the index
// is shared: it is not safe alongside readers or writers.
func (ix *Index) SetSalt(salt uint64) error {
	for i := range ix.segs {
		if g := &ix.segs[i]; g.used != 0 || g.live.Load() != 0 {
			return ErrSalt
		}
	}
	ix.salt = salt
	return nil
}

// Segment is the segment key falls in, 0 to 255: Load reads blocks listed in order of Segment
// where they lie, without copying them into that order first. Lock-free.
func (ix *Index) Segment(key uint64) int { return int(ix.mix(key) >> (64 - segBits)) }

// gather appends the blocks [lo, hi) of parts taken end to end, and their holders [hlo, hhi),
// to the buffers k, c and h.
func gather(parts []Blocks, lo, hi, hlo, hhi int, k []uint64, c []uint32, h []Slot) ([]uint64, []uint32, []Slot) {
	for p := range parts {
		b := &parts[p]
		n, nh := len(b.Keys), len(b.Holders)
		if lo < n && hi > 0 {
			k = append(k, b.Keys[max(lo, 0):min(hi, n)]...)
			c = append(c, b.Counts[max(lo, 0):min(hi, n)]...)
		}
		if hlo < nh && hhi > 0 {
			h = append(h, b.Holders[max(hlo, 0):min(hhi, nh)]...)
		}
		lo, hi, hlo, hhi = lo-n, hi-n, hlo-nh, hhi-nh
		if hi <= 0 && hhi <= 0 {
			break
		}
	}
	return k, c, h
}

// load inserts one segment's share of a Load into a new table holding its live entries and
// them, then publishes it; blocks counts the residencies added per slot, seen is a zeroed
// bitset over the slots, left zeroed. Into an empty segment the keys are laid down in the order
// of their home buckets, each at its home or just after the one before: the table a linear probe
// would build, written front to back.
func (g *segment) load(ix *Index, keys []uint64, counts []uint32, holders []Slot, blocks []int64, seen []uint64, sc *loadScratch) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	live := int(g.live.Load())
	// Fuller than a rebuild leaves a table (3/4, not 8/15): a restore's tables are the bulk of
	// its new memory, and the index grows from there like any other.
	nt := newTableAt(g.base, live+len(keys), loadFillNum, loadFillDen)
	if live > 0 {
		// The live entries first, as a rebuild copies them (dead ones are left behind).
		old := g.tab.Load()
		for i := range old.slots {
			e := &old.slots[i]
			if h := e.h.Load(); h != 0 && !dead(h) {
				key := e.key.Load()
				j, _, _ := nt.probe(key, ix.mix(key))
				*(*uint64)(unsafe.Pointer(&nt.slots[j].key)) = key
				*(*uint64)(unsafe.Pointer(&nt.slots[j].h)) = h &^ reused
			}
		}
	}
	// Each key's holders start at off[i]; its home bucket orders the keys.
	c := len(nt.slots)
	nb := c / bucketSlots
	off := growTo(&sc.off, len(keys)+1)
	off[0] = 0
	start := growTo(&sc.start, nb+1)
	clear(start)
	home := growTo(&sc.home, len(keys))
	for i, key := range keys {
		off[i+1] = off[i] + int32(counts[i])
		b := int32(nt.home(ix.mix(key)) / bucketSlots)
		home[i] = b
		start[b+1]++
	}
	for b := range nb {
		start[b+1] += start[b]
	}
	order := growTo(&sc.order, len(keys))
	for i, b := range home {
		order[start[b]] = int32(i)
		start[b]++
	}
	var wrapped []int32
	next := 0
	for _, i := range order {
		key := keys[i]
		members := holders[off[i]:off[i+1]]
		word, err := g.holderWord(ix, key, members, seen)
		if err != nil {
			return err
		}
		for _, x := range members {
			blocks[x]++
		}
		var j int
		if live > 0 {
			var found bool
			if j, found, _ = nt.probe(key, ix.mix(key)); found {
				return fmt.Errorf("%w: block %#x twice, or already in the index", ErrLoad, key)
			}
		} else {
			if j = max(int(home[i])*bucketSlots, next); j >= c {
				wrapped = append(wrapped, i)
				continue
			}
			next = j + 1
			// A key twice has one home: the other sits in the run laid down just before.
			// (Slot j itself is new: reading it first would fault its page in twice, once
			// to read the zero page and again to write.)
			for p := j - 1; p >= int(home[i])*bucketSlots; p-- {
				if nt.slots[p].key.Load() == key {
					return fmt.Errorf("%w: block %#x twice", ErrLoad, key)
				}
			}
		}
		// nt is not published yet: plain stores, as in rebuild.
		*(*uint64)(unsafe.Pointer(&nt.slots[j].key)) = key
		*(*uint64)(unsafe.Pointer(&nt.slots[j].h)) = word
	}
	for _, i := range wrapped { // past the end: the probe goes on from slot 0
		key := keys[i]
		j, found, _ := nt.probe(key, ix.mix(key))
		if found {
			return fmt.Errorf("%w: block %#x twice", ErrLoad, key)
		}
		word, err := g.holderWord(ix, key, holders[off[i]:off[i+1]], seen)
		if err != nil {
			return err
		}
		*(*uint64)(unsafe.Pointer(&nt.slots[j].key)) = key
		*(*uint64)(unsafe.Pointer(&nt.slots[j].h)) = word
	}
	g.used = live + len(keys)
	g.live.Store(int64(live + len(keys)))
	g.tab.Store(nt)
	return nil
}

// holderWord is the holder word of key held by members (distinct, in any order), its set put
// into the segment when they are more than inlineMax. seen is a zeroed bitset over the slots,
// left zeroed.
func (g *segment) holderWord(ix *Index, key uint64, members []Slot, seen []uint64) (uint64, error) {
	if len(members) <= inlineMax {
		for i := 1; i < len(members); i++ {
			if members[i] == members[0] || i == 2 && members[2] == members[1] {
				return 0, fmt.Errorf("%w: a holder of block %#x twice", ErrLoad, key)
			}
		}
		return inlineWord(members), nil
	}
	dup := false
	for _, x := range members {
		w, b := x>>6, uint64(1)<<(x&63)
		dup = dup || seen[w]&b != 0
		seen[w] |= b
	}
	for _, x := range members {
		seen[x>>6] = 0
	}
	if dup {
		return 0, fmt.Errorf("%w: a holder of block %#x twice", ErrLoad, key)
	}
	last := len(members) - 1
	return occupied | overflow | uint64(g.putSet(ix.overflowSet(key, members[:last], members[last]))), nil
}

// loadScratch is a Load goroutine's buffers for the segments it loads one after the other
// (off, start, home, order; a segment's run gathered from several parts into keys, counts and
// holders), or a Load's own (seg).
type loadScratch struct {
	off, start, home, order []int32
	seg                     []uint8
	keys                    []uint64
	counts                  []uint32
	holders                 []Slot
}

var loadPool = sync.Pool{New: func() any { return new(loadScratch) }}

// growTo returns (*b)[:n], reallocating *b when it is shorter; the contents are the caller's
// to set.
func growTo[T any](b *[]T, n int) []T {
	if cap(*b) < n {
		*b = make([]T, n)
	}
	*b = (*b)[:n]
	return *b
}
