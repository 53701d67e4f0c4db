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

// MatchTiers returns, for every worker that holds seqs[0] in the device tier or any block of
// the query in a lower tier, its device depth and each lower tier's extension, as Dynamo's
// query_lower_tiers defines them: every worker starts at its device depth (0 if it holds no
// first block); the host extension is the run of blocks from there that the host tier holds,
// the disk extension the run from the end of that through the disk tier, then external. Only
// workers with a lower-tier extension are listed. tiers[t] is tier t's model (nil for none).
func MatchTiers(tiers [kvevent.NumTiers]*Index, seqs []uint64) map[radix.WorkerKey][kvevent.NumTiers]int {
	out := map[radix.WorkerKey][kvevent.NumTiers]int{}
	if len(seqs) == 0 {
		return out
	}
	dev := tiers[kvevent.Device].Match(seqs)
	ws := map[radix.WorkerKey]bool{}
	for _, ix := range tiers {
		if ix != nil {
			for w := range ix.blocks {
				ws[w] = true
			}
		}
	}
	for w := range ws {
		var d [kvevent.NumTiers]int
		d[kvevent.Device] = dev[w]
		pos := d[kvevent.Device]
		for t := 1; t < kvevent.NumTiers; t++ {
			if tiers[t] == nil {
				continue
			}
			for pos < len(seqs) && tiers[t].holders[seqs[pos]][w] {
				pos++
				d[t]++
			}
		}
		if d[1]+d[2]+d[3] > 0 {
			out[w] = d
		}
	}
	return out
}

// CheckTiers compares the lower-tier part of a match mt of q on ix (ix.Match already run)
// with the model of every tier.
func CheckTiers(tiers [kvevent.NumTiers]*Index, ix *radix.Index, q []uint64, mt *radix.Match) error {
	got := map[radix.WorkerKey][kvevent.NumTiers]int{}
	for i, x := range mt.Tiers {
		if i > 0 && mt.Tiers[i-1].Slot >= x.Slot {
			return fmt.Errorf("tier slots not strictly ascending: %v", mt.Tiers)
		}
		w, ok := ix.Worker(x.Slot)
		if !ok {
			return fmt.Errorf("slot %d in a tier match is not in use", x.Slot)
		}
		var d [kvevent.NumTiers]int
		for t := range d {
			d[t] = int(x.Blocks[t])
		}
		got[w] = d
	}
	if want := MatchTiers(tiers, q); !maps.Equal(got, want) {
		return fmt.Errorf("tiered query of %d blocks: index %v, model %v", len(q), got, want)
	}
	for t := 1; t < kvevent.NumTiers; t++ {
		tix := ix.TierIndex(kvevent.Tier(t))
		if tiers[t] == nil || tix == nil {
			if tix != nil && len(tix.AppendWorkers(nil)) > 0 || tiers[t] != nil && len(tiers[t].blocks) > 0 && tix == nil {
				return fmt.Errorf("tier %v: index and model disagree on its existence", kvevent.Tier(t))
			}
			continue
		}
		for _, wb := range tix.AppendWorkers(nil) {
			if int(wb.Blocks) != tiers[t].Blocks(wb.Worker) {
				return fmt.Errorf("tier %v worker %v: cached %d, model %d", kvevent.Tier(t), wb.Worker, wb.Blocks, tiers[t].Blocks(wb.Worker))
			}
		}
	}
	return nil
}

// Fleet is the model of shard.Applier for one model's index.
type Fleet struct {
	BlockSize int
	MaxBlocks int64 // 0 = unlimited (over every tier)
	Index     *Index
	// Tiers[t] is tier t's model: Tiers[Device] is Index, a lower tier's is created by its
	// first stored event.
	Tiers   [kvevent.NumTiers]*Index
	workers map[uint64]map[uint32]*rank
}

type rank struct {
	tiers [kvevent.NumTiers]*tierState
	last  uint64
}

type tierState struct {
	engine map[uint64]uint64 // engine hash → sequence hash
	dup    map[uint64]int    // extra engine hashes per sequence hash
}

func newTierState() *tierState {
	return &tierState{engine: map[uint64]uint64{}, dup: map[uint64]int{}}
}

// NewFleet returns an empty fleet model.
func NewFleet(blockSize int, maxBlocks int64) *Fleet {
	f := &Fleet{BlockSize: blockSize, MaxBlocks: maxBlocks, Index: NewIndex(),
		workers: map[uint64]map[uint32]*rank{}}
	f.Tiers[kvevent.Device] = f.Index
	return f
}

func (f *Fleet) resident() int64 {
	n := 0
	for _, ix := range f.Tiers {
		if ix != nil {
			for _, c := range ix.blocks {
				n += c
			}
		}
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
		r = &rank{}
		r.tiers[kvevent.Device] = newTierState()
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
	if ev.Tier >= kvevent.NumTiers {
		o.Status = shard.OtherTier
		return o
	}
	switch ev.Kind {
	case kvevent.Stored:
		f.stored(w, r, ev, &o)
	case kvevent.Removed:
		ts := r.tiers[ev.Tier]
		if ts == nil {
			o.Skipped, o.Status = len(ev.Hashes), shard.UnknownBlocks
			return o
		}
		for _, eh := range ev.Hashes {
			seq, ok := ts.engine[eh]
			if !ok {
				o.Skipped++
				continue
			}
			delete(ts.engine, eh)
			if f.drop(w, ev.Tier, ts, seq) {
				o.Applied++
			}
		}
		if o.Skipped > 0 {
			o.Status = shard.UnknownBlocks
		}
	case kvevent.Cleared:
		// A clear is about its own tier only.
		if ts := r.tiers[ev.Tier]; ts != nil {
			o.Applied = f.clearTier(w, ev.Tier, ts)
		}
	default:
		o.Status = shard.BadKind
	}
	return o
}

func (f *Fleet) stored(w radix.WorkerKey, r *rank, ev *kvevent.Event, o *shard.Outcome) {
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
		// The parent is looked up in the event's own tier, then in the rank's others.
		p, ok := uint64(0), false
		if ts := r.tiers[ev.Tier]; ts != nil {
			p, ok = ts.engine[ev.Parent]
		}
		for t := 0; !ok && t < kvevent.NumTiers; t++ {
			if ts := r.tiers[t]; ts != nil && kvevent.Tier(t) != ev.Tier {
				p, ok = ts.engine[ev.Parent]
			}
		}
		if !ok {
			o.Status = shard.UnknownParent
			return
		}
		prev = p
	}
	ts := r.tiers[ev.Tier]
	if ts == nil {
		ts = newTierState()
		r.tiers[ev.Tier] = ts
	}
	ix := f.Tiers[ev.Tier]
	if ix == nil {
		ix = NewIndex()
		f.Tiers[ev.Tier] = ix
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
		if old, ok := ts.engine[eh]; ok {
			if old == seq {
				continue
			}
			delete(ts.engine, eh)
			f.drop(w, ev.Tier, ts, old)
		}
		if f.MaxBlocks > 0 && !ix.holders[seq][w] && f.resident() >= f.MaxBlocks {
			o.Status, o.Skipped = shard.OverBudget, len(ev.Hashes)-i
			return
		}
		ts.engine[eh] = seq
		if ix.Add(seq, w) {
			o.Applied++
		} else {
			ts.dup[seq]++
		}
	}
}

func (f *Fleet) drop(w radix.WorkerKey, t kvevent.Tier, ts *tierState, seq uint64) bool {
	if ts.dup[seq] > 0 {
		ts.dup[seq]--
		return false
	}
	return f.Tiers[t].Remove(seq, w)
}

func (f *Fleet) clear(id uint64) int {
	n := 0
	for rk, r := range f.workers[id] {
		n += f.clearRank(radix.WorkerKey{ID: id, Rank: rk}, r)
	}
	return n
}

// clearRank drops every block of rank r, worker w, in every tier, and returns how many
// residencies went away.
func (f *Fleet) clearRank(w radix.WorkerKey, r *rank) int {
	n := 0
	for t, ts := range r.tiers {
		if ts != nil {
			n += f.clearTier(w, kvevent.Tier(t), ts)
		}
	}
	return n
}

// clearTier drops every block of one tier of a rank of worker w.
func (f *Fleet) clearTier(w radix.WorkerKey, t kvevent.Tier, ts *tierState) int {
	n := 0
	for _, seq := range ts.engine {
		if f.Tiers[t].Remove(seq, w) {
			n++
		}
	}
	ts.engine = map[uint64]uint64{}
	ts.dup = map[uint64]int{}
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
