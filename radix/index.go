package radix

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// ErrBlockSize is returned by New for a block size that is not positive.
var ErrBlockSize = errors.New("radix: block size must be positive")

// Config configures one Index.
type Config struct {
	// BlockSize is the number of tokens per KV block of the model. Fixed for the index's life.
	BlockSize int
}

// Index is the prefix index of one model: for every block, by sequence hash, the set of worker
// slots holding it.
//
// Any number of goroutines may call every method concurrently. Readers (Match, MatchTokens, Has,
// AppendHolders, Blocks, Worker, AppendWorkers, Stats, Prefetch) never take a lock a writer holds;
// writers (Add, Remove) serialize per segment of the key space; Acquire, Release and Lookup
// serialize on the slot registry, which changes only when workers come and go. A reader running
// alongside writers sees, for each entry, a state that entry had during the call; a holder that
// no writer touches is always seen exactly.
type Index struct {
	blockSize int
	// salt randomizes key placement, so that crafted prompts cannot pile their blocks into one
	// probe chain (the block hash itself uses a public seed).
	salt uint64
	// slots is the slot registry, shared by the indexes of every tier of the model (the device
	// index owns it), so that one Slot names the same worker in each.
	slots *slotTable
	tier  kvevent.Tier
	track bool // matches mark the blocks they walk (TrackMatches)
	// lower holds the indexes of the lower tiers once any exists (device index only):
	// lower[t-1] for tier t, nil until its first block. Replaced whole, copy-on-write.
	lower atomic.Pointer[lowerTiers]
	segs  [numSegs]segment
}

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("%w: %d", ErrBlockSize, cfg.BlockSize)
	}
	return newIndex(cfg.BlockSize, new(slotTable), kvevent.Device), nil
}

func newIndex(blockSize int, slots *slotTable, tier kvevent.Tier) *Index {
	ix := &Index{blockSize: blockSize, salt: rand.Uint64(), slots: slots, tier: tier}
	for i := range ix.segs {
		ix.segs[i].init(i)
	}
	return ix
}

// BlockSize returns the model's tokens per block.
func (ix *Index) BlockSize() int { return ix.blockSize }

// mix spreads a key over segments and table positions (a bijection, so distinct keys stay
// distinct).
func (ix *Index) mix(key uint64) uint64 { return (key ^ ix.salt) * 0x9e3779b97f4a7c15 }

func (ix *Index) segment(m uint64) *segment { return &ix.segs[m>>(64-segBits)] }

// Add records that slot x holds the block with sequence hash seq and reports whether that is
// new. x must be a slot from Acquire.
func (ix *Index) Add(seq uint64, x Slot) bool {
	m := ix.mix(seq)
	g := ix.segment(m)
	g.mu.Lock()
	added := g.add(ix, seq, m, x)
	g.mu.Unlock()
	if added {
		ix.slots.count(x, ix.tier).Add(1)
	}
	return added
}

// Remove records that slot x no longer holds the block seq and reports whether it did.
func (ix *Index) Remove(seq uint64, x Slot) bool {
	m := ix.mix(seq)
	g := ix.segment(m)
	g.mu.Lock()
	removed := g.remove(ix, seq, m, x)
	g.mu.Unlock()
	if removed {
		ix.slots.count(x, ix.tier).Add(-1)
	}
	return removed
}

// Has reports whether slot x holds block seq. Lock-free.
func (ix *Index) Has(seq uint64, x Slot) bool {
	m := ix.mix(seq)
	h, s := ix.segment(m).holders(seq, m)
	if s != nil {
		return s.has(x)
	}
	return inlineHas(h, x)
}

// AppendHolders appends the slots holding block seq, ascending. Lock-free.
func (ix *Index) AppendHolders(dst []Slot, seq uint64) []Slot {
	m := ix.mix(seq)
	h, s := ix.segment(m).holders(seq, m)
	return appendMembers(dst, h, s)
}

// Stats describes the size of an index.
type Stats struct {
	Entries     int64 // blocks held by at least one worker
	Residencies int64 // (block, worker) pairs
	Workers     int   // slots in use
	TableSlots  int64 // allocated table slots, live, dead and empty
}

// Stats returns the index's size. Lock-free; a sum of counters read one after another, so it is
// exact only while no writer runs.
func (ix *Index) Stats() Stats {
	var st Stats
	for i := range ix.segs {
		g := &ix.segs[i]
		st.Entries += g.live.Load()
		st.TableSlots += int64(len(g.tab.Load().slots))
	}
	for _, w := range ix.AppendWorkers(nil) {
		st.Workers++
		st.Residencies += w.Blocks
	}
	return st
}
