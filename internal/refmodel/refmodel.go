// Package refmodel is a plain, obviously correct model of kvrouterd's index and event
// application, used only by tests to check the real packages under randomized streams. It favours
// clarity over speed everywhere: maps of maps, no slots, hashing straight from the specification.
// Not safe for concurrent use.
package refmodel

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/zeebo/xxh3"
)

// Index is the model of radix.Index: block → set of workers.
type Index struct {
	holders map[uint64]map[radix.WorkerKey]bool
	blocks  map[radix.WorkerKey]int
}

// NewIndex returns an empty model index.
func NewIndex() *Index {
	return &Index{holders: map[uint64]map[radix.WorkerKey]bool{}, blocks: map[radix.WorkerKey]int{}}
}

// Add records that w holds seq and reports whether that is new.
func (m *Index) Add(seq uint64, w radix.WorkerKey) bool {
	if m.holders[seq][w] {
		return false
	}
	if m.holders[seq] == nil {
		m.holders[seq] = map[radix.WorkerKey]bool{}
	}
	m.holders[seq][w] = true
	m.blocks[w]++
	return true
}

// Remove records that w no longer holds seq and reports whether it did.
func (m *Index) Remove(seq uint64, w radix.WorkerKey) bool {
	if !m.holders[seq][w] {
		return false
	}
	delete(m.holders[seq], w)
	if len(m.holders[seq]) == 0 {
		delete(m.holders, seq)
	}
	m.blocks[w]--
	if m.blocks[w] == 0 {
		delete(m.blocks, w)
	}
	return true
}

// Match returns, for every worker holding seqs[0], the number of leading blocks it holds.
func (m *Index) Match(seqs []uint64) map[radix.WorkerKey]int {
	out := map[radix.WorkerKey]int{}
	if len(seqs) == 0 {
		return out
	}
	for w := range m.holders[seqs[0]] {
		d := 0
		for d < len(seqs) && m.holders[seqs[d]][w] {
			d++
		}
		out[w] = d
	}
	return out
}

// CheckMatch matches q on ix into mt and returns an error describing the first difference from the
// model: a worker's depth, its cached block count, or the shape of the result (slots ascending,
// depths within the query).
func (m *Index) CheckMatch(ix *radix.Index, q []uint64, mt *radix.Match) error {
	ix.Match(q, mt)
	if len(mt.Depth) != len(mt.Slots) {
		return fmt.Errorf("match arrays differ in length: %d slots, %d depths", len(mt.Slots), len(mt.Depth))
	}
	got := map[radix.WorkerKey]int{}
	for i, s := range mt.Slots {
		if i > 0 && mt.Slots[i-1] >= s {
			return fmt.Errorf("slots not strictly ascending: %v", mt.Slots)
		}
		w, ok := ix.Worker(s)
		if !ok {
			return fmt.Errorf("slot %d in a match is not in use", s)
		}
		got[w] = int(mt.Depth[i])
		if n := int(ix.Blocks(s)); n != m.Blocks(w) {
			return fmt.Errorf("worker %v: cached %d, model %d", w, n, m.Blocks(w))
		}
	}
	if want := m.Match(q); !maps.Equal(got, want) {
		return fmt.Errorf("query of %d blocks: index %v, model %v", len(q), got, want)
	}
	return nil
}

// Blocks returns how many blocks w holds.
func (m *Index) Blocks(w radix.WorkerKey) int { return m.blocks[w] }

// BlocksOf returns the set of blocks w holds.
func (m *Index) BlocksOf(w radix.WorkerKey) map[uint64]bool {
	out := map[uint64]bool{}
	for seq, hs := range m.holders {
		if hs[w] {
			out[seq] = true
		}
	}
	return out
}

// Workers returns the workers holding at least one block with their counts.
func (m *Index) Workers() map[radix.WorkerKey]int { return maps.Clone(m.blocks) }

// Holders returns the workers holding seq, sorted.
func (m *Index) Holders(seq uint64) []radix.WorkerKey {
	ws := slices.Collect(maps.Keys(m.holders[seq]))
	slices.SortFunc(ws, func(a, b radix.WorkerKey) int {
		if a.ID != b.ID {
			return cmpU64(a.ID, b.ID)
		}
		return cmpU64(uint64(a.Rank), uint64(b.Rank))
	})
	return ws
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Fleet is the model of shard.Applier for one model's index.
type Fleet struct {
	BlockSize int
	MaxBlocks int64 // 0 = unlimited
	Index     *Index
	workers   map[uint64]map[uint32]*rank
}

type rank struct {
	engine map[uint64]uint64 // engine hash → sequence hash
	dup    map[uint64]int    // extra engine hashes per sequence hash
	last   uint64
}

// NewFleet returns an empty fleet model.
func NewFleet(blockSize int, maxBlocks int64) *Fleet {
	return &Fleet{BlockSize: blockSize, MaxBlocks: maxBlocks, Index: NewIndex(),
		workers: map[uint64]map[uint32]*rank{}}
}

func (f *Fleet) resident() int64 {
	n := 0
	for _, c := range f.Index.blocks {
		n += c
	}
	return int64(n)
}

// Apply applies one event of worker id and returns the outcome the real Applier must produce.
func (f *Fleet) Apply(id uint64, ev *kvevent.Event) shard.Outcome {
	o := shard.Outcome{Worker: id, Rank: ev.Rank, EventID: ev.ID, Kind: ev.Kind}
	if f.workers[id] == nil {
		f.workers[id] = map[uint32]*rank{}
	}
	r := f.workers[id][ev.Rank]
	if r == nil {
		r = &rank{engine: map[uint64]uint64{}, dup: map[uint64]int{}}
		f.workers[id][ev.Rank] = r
	}
	if ev.ID != 0 {
		if r.last != 0 && ev.ID <= r.last {
			o.Status = shard.Duplicate
			return o
		}
		if r.last != 0 && ev.ID > r.last+1 {
			o.Gap = ev.ID - r.last - 1
		}
		r.last = ev.ID
	}
	w := radix.WorkerKey{ID: id, Rank: ev.Rank}
	switch ev.Kind {
	case kvevent.Stored:
		f.stored(w, r, ev, &o)
	case kvevent.Removed:
		if ev.Tier != kvevent.Device {
			o.Status = shard.OtherTier
			return o
		}
		for _, eh := range ev.Hashes {
			seq, ok := r.engine[eh]
			if !ok {
				o.Skipped++
				continue
			}
			delete(r.engine, eh)
			if f.drop(w, r, seq) {
				o.Applied++
			}
		}
		if o.Skipped > 0 {
			o.Status = shard.UnknownBlocks
		}
	case kvevent.Cleared:
		o.Applied = f.clearRank(w, r)
	default:
		o.Status = shard.BadKind
	}
	return o
}

func (f *Fleet) stored(w radix.WorkerKey, r *rank, ev *kvevent.Event, o *shard.Outcome) {
	if ev.Tier != kvevent.Device {
		o.Status = shard.OtherTier
		return
	}
	if ev.BlockSize != 0 && ev.BlockSize != f.BlockSize {
		o.Status = shard.BadBlockSize
		return
	}
	if len(ev.Tokens) != len(ev.Hashes)*f.BlockSize {
		o.Status = shard.BadTokens
		return
	}
	var prev uint64
	hasPrev := ev.HasParent
	if hasPrev {
		p, ok := r.engine[ev.Parent]
		if !ok {
			o.Status = shard.UnknownParent
			return
		}
		prev = p
	}
	for i, eh := range ev.Hashes {
		var mm []uint64
		if i < len(ev.MM) {
			mm = ev.MM[i]
		}
		local := LocalHash(ev.Tokens[i*f.BlockSize:(i+1)*f.BlockSize], ev.LoRA, mm)
		seq := local
		if hasPrev {
			seq = SeqHash(prev, local)
		}
		prev, hasPrev = seq, true
		if old, ok := r.engine[eh]; ok {
			if old == seq {
				continue
			}
			delete(r.engine, eh)
			f.drop(w, r, old)
		}
		if f.MaxBlocks > 0 && !f.Index.holders[seq][w] && f.resident() >= f.MaxBlocks {
			o.Status, o.Skipped = shard.OverBudget, len(ev.Hashes)-i
			return
		}
		r.engine[eh] = seq
		if f.Index.Add(seq, w) {
			o.Applied++
		} else {
			r.dup[seq]++
		}
	}
}

func (f *Fleet) drop(w radix.WorkerKey, r *rank, seq uint64) bool {
	if r.dup[seq] > 0 {
		r.dup[seq]--
		return false
	}
	return f.Index.Remove(seq, w)
}

func (f *Fleet) clear(id uint64) int {
	n := 0
	for rk, r := range f.workers[id] {
		n += f.clearRank(radix.WorkerKey{ID: id, Rank: rk}, r)
	}
	return n
}

// clearRank drops every block of rank r, worker w, and returns how many residencies went away.
func (f *Fleet) clearRank(w radix.WorkerKey, r *rank) int {
	n := 0
	for _, seq := range r.engine {
		if f.Index.Remove(seq, w) {
			n++
		}
	}
	r.engine = map[uint64]uint64{}
	r.dup = map[uint64]int{}
	return n
}

// RemoveWorker drops worker id entirely and returns how many residencies went away.
func (f *Fleet) RemoveWorker(id uint64) int {
	n := f.clear(id)
	delete(f.workers, id)
	return n
}

// Cursor returns the last event id applied for (worker, rank).
func (f *Fleet) Cursor(id uint64, rk uint32) uint64 {
	if r := f.workers[id][rk]; r != nil {
		return r.last
	}
	return 0
}

// LocalHash is the specification of a block's local hash, written without any of radix's code.
func LocalHash(tokens []uint32, lora string, mm []uint64) uint64 {
	seed := uint64(1337)
	if lora != "" {
		seed += xxh3.HashString(lora)
	}
	b := make([]byte, 0, 4*len(tokens)+8*len(mm))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	sorted := slices.Sorted(slices.Values(mm))
	for _, x := range sorted {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return xxh3.HashSeed(b, seed)
}

// SeqHash is the specification of sequence-hash chaining.
func SeqHash(prev, local uint64) uint64 {
	b := binary.LittleEndian.AppendUint64(nil, prev)
	b = binary.LittleEndian.AppendUint64(b, local)
	return xxh3.HashSeed(b, 1337)
}

// SeqHashes returns the sequence hashes of the full blocks of tokens (a request from the root).
func SeqHashes(tokens []uint32, blockSize int, lora string) []uint64 {
	var out []uint64
	for i := 0; (i+1)*blockSize <= len(tokens); i++ {
		l := LocalHash(tokens[i*blockSize:(i+1)*blockSize], lora, nil)
		if i > 0 {
			l = SeqHash(out[i-1], l)
		}
		out = append(out, l)
	}
	return out
}
