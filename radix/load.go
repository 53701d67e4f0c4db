package radix

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// ErrLoad is wrapped by every error of Load about its input.
var ErrLoad = errors.New("radix: bad bulk load")

// Blocks is a run of blocks for Load: block Keys[i] is held by Counts[i] slots, which Holders
// lists run after run in the order of Keys, each run strictly ascending. Plain data.
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
	// Scatter the blocks by segment, keys, counts and holders alike, so that each segment's
	// load reads its input in order.
	var start [numSegs + 1]int
	var hstart [numSegs + 1]int
	seg := make([]uint8, nk)
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
	sk, sc, sh := make([]uint64, nk), make([]uint32, nk), make([]Slot, nh)
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
			for {
				s := int(next.Add(1) - 1)
				if s >= numSegs {
					break
				}
				lo, hi := start[s], start[s+1]
				if lo == hi {
					continue
				}
				if err := ix.segs[s].load(ix, sk[lo:hi], sc[lo:hi], sh[hstart[s]:hstart[s+1]], blocks); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
			for x, n := range blocks {
				if n != 0 {
					ix.slots.info(Slot(x)).blocks[ix.tier].Add(n)
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// load inserts one segment's share of a Load into a new table holding its live entries and
// them, then publishes it; blocks counts the residencies added per slot.
func (g *segment) load(ix *Index, keys []uint64, counts []uint32, holders []Slot, blocks []int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	live := int(g.live.Load())
	nt := newTable(g.base, live+len(keys))
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
	h := 0
	for i, key := range keys {
		members := holders[h : h+int(counts[i])]
		h += int(counts[i])
		for j := 1; j < len(members); j++ {
			if members[j] <= members[j-1] {
				return fmt.Errorf("%w: the holders of block %#x are not strictly ascending", ErrLoad, key)
			}
		}
		m := ix.mix(key)
		j, found, _ := nt.probe(key, m)
		if found {
			return fmt.Errorf("%w: block %#x twice, or already in the index", ErrLoad, key)
		}
		var word uint64
		if len(members) <= inlineMax {
			word = inlineWord(members)
		} else {
			last := len(members) - 1
			word = occupied | overflow | uint64(g.putSet(ix.overflowSet(key, members[:last], members[last])))
		}
		// nt is not published yet: plain stores, as in rebuild.
		*(*uint64)(unsafe.Pointer(&nt.slots[j].key)) = key
		*(*uint64)(unsafe.Pointer(&nt.slots[j].h)) = word
		for _, x := range members {
			blocks[x]++
		}
	}
	g.used = live + len(keys)
	g.live.Store(int64(live + len(keys)))
	g.tab.Store(nt)
	return nil
}
