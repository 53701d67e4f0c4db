package router

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// SnapshotStats is what Snapshot wrote or Restore read; plain data.
type SnapshotStats struct {
	Workers     int
	Residencies int64 // (sequence, engine) pairs: a residency, or a duplicate of one
	Bytes       int64 // encoded, before compression
	Chunks      int
	// Skipped counts the workers Snapshot left out because the format cannot hold their state
	// (each logged at error level); Restore leaves it 0.
	Skipped int
}

// RestoreTiming is where a restore's time went: reading chunks (the store's checks and
// decompression), decoding messages, and building the state (registering workers, importing
// their engine maps, loading the index), each summed over the goroutines that restore in
// parallel. Plain data.
type RestoreTiming struct {
	Read, Decode, Build time.Duration
}

// DefaultChunkSize is the size Snapshot cuts chunks at, at worker boundaries.
const DefaultChunkSize = 4 << 20

// Snapshot writes the state of every registered worker — registration, event cursors and
// blocks — as wire.SnapshotWorker messages into chunks of about chunkSize bytes (0:
// DefaultChunkSize), each a run of whole messages, handed to emit (which must not keep the
// slice). The first chunk opens with a wire.SnapshotHeader; after the workers, in chunks of their
// own, comes the index by block (wire.SnapshotIndex: each block once, with all its holders),
// built from the same copies of the workers' state, so that the two agree exactly, and which
// Restore loads in bulk. Building it holds every block's (sequence hash, holder) pair, 16 bytes
// a residency, for the length of the write. A worker's state is read on its shard between two batches of its events (shard.Set.Do),
// so reads and event application pause only for that copy; workers are read one after the other,
// so the snapshot as a whole is fuzzy: replaying the event stream from any sequence whose events
// had all been handed to the router (Ingest) before Snapshot was called brings every worker up
// to date, events it already holds being dropped by their ids or, unnumbered, re-applied with
// the same result. Safe to call concurrently with everything else; one Snapshot at a time is
// enough.
func (r *Router) Snapshot(chunkSize int, emit func(chunk []byte) error) (SnapshotStats, error) {
	if chunkSize <= 0 {
		chunkSize = DefaultChunkSize
	}
	var st SnapshotStats
	// Registrations, copied under the lock; each worker's registered ranks in Ranks, without
	// blocks, until its shard fills in those it holds state for.
	r.mu.Lock()
	var sw []wire.SnapshotWorker
	for _, reg := range r.workers {
		w := wire.SnapshotWorker{
			ID: reg.id, Model: reg.model.name, BlockSize: reg.model.blockSize, Capacity: reg.capacity.Load(),
			MaxTokens: reg.maxTokens.Load(), Reports: reg.heartbeat.Load(), HTTPEndpoint: deref(reg.http.Load()), Weight: reg.getWeight(), Role: uint8(reg.getRole()),
			// The registered key, not Config.APIKeys': a replica or a restart forwards with it
			// (docs/security.md, "Credentials at the front door").
			APIKey: deref(reg.apiKey.Load()),
		}
		for _, rw := range reg.ranks {
			w.Ranks = append(w.Ranks, wire.SnapshotRank{Rank: rw.key.Rank})
			w.Endpoints = append(w.Endpoints, wire.SnapshotEndpoint{Endpoint: rw.endpoint, Replay: rw.replay})
		}
		sw = append(sw, w)
	}
	r.mu.Unlock()
	slices.SortFunc(sw, func(a, b wire.SnapshotWorker) int { return cmp.Compare(a.ID, b.ID) })
	var (
		buf      = make([]byte, 0, chunkSize+chunkSize/4)
		ranks    []wire.SnapshotRank
		pairs    []pair
		exported = make(map[uint32]struct{})
		byBlock  = map[indexKey]*blockPairs{}
	)
	buf = wire.AppendSnapshotHeader(buf, wire.SnapshotHeader{Version: wire.SnapshotVersion, IndexSection: true})
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		st.Chunks++
		st.Bytes += int64(len(buf))
		err := emit(buf)
		buf = buf[:0]
		return err
	}
	for i := range sw {
		w := &sw[i]
		ranks = ranks[:0]
		err := r.set.Do(w.ID, func(a *shard.Applier) { ranks = a.Export(w.ID, ranks) })
		if err != nil {
			return st, err
		}
		// Registered ranks with no events applied yet come back registered, with no blocks.
		clear(exported)
		for _, rs := range ranks {
			exported[rs.Rank] = struct{}{}
		}
		for _, reg := range w.Ranks {
			if _, ok := exported[reg.Rank]; !ok {
				ranks = append(ranks, wire.SnapshotRank{Rank: reg.Rank})
			}
		}
		var residencies int64
		for j := range ranks {
			pairs = sortPairs(&ranks[j], pairs)
			residencies += int64(len(ranks[j].Seqs))
			for _, l := range ranks[j].Lower {
				residencies += int64(len(l.Seqs))
			}
		}
		// The shard lists the ranks in its own order: each keeps its registered endpoints.
		eps := make([]wire.SnapshotEndpoint, len(ranks))
		for j := range ranks {
			for k, reg := range w.Ranks {
				if reg.Rank == ranks[j].Rank {
					eps[j] = w.Endpoints[k]
					break
				}
			}
		}
		w.Ranks, w.Endpoints = ranks, eps
		if err := w.Validate(); err != nil {
			// Register keeps every field within the format, so only state past its limits
			// (more than 2^32-1 bytes of blocks) gets here. Failing the whole snapshot would
			// leave every other worker unpersisted for as long as this one stays; this worker
			// alone is left out, logged and counted, and is missing after a restore until it
			// registers again or its events bring it back.
			st.Skipped++
			r.snapshotSkipped.Add(1)
			r.log.Error("snapshot: worker left out, the format cannot hold it", "worker", w.ID, "model", w.Model, "err", err)
			continue
		}
		st.Residencies += residencies
		buf = wire.AppendSnapshotWorker(buf, w)
		st.Workers++
		for j := range w.Ranks {
			rs := &w.Ranks[j]
			slot := wire.SnapshotSlot{ID: w.ID, Rank: rs.Rank}
			collect(byBlock, indexKey{w.Model, kvevent.Device}, slot, rs.Seqs)
			for k := range rs.Lower {
				collect(byBlock, indexKey{w.Model, rs.Lower[k].Tier}, slot, rs.Lower[k].Seqs)
			}
		}
		if len(buf) >= chunkSize {
			if err := flush(); err != nil {
				return st, err
			}
		}
	}
	if err := flush(); err != nil {
		return st, err
	}
	keys := slices.SortedFunc(maps.Keys(byBlock), func(a, b indexKey) int {
		return cmp.Or(strings.Compare(a.model, b.model), cmp.Compare(a.tier, b.tier))
	})
	var x wire.SnapshotIndex
	for _, k := range keys {
		bp := byBlock[k]
		delete(byBlock, k) // its pairs can go once written
		// By the live index's segments, then by block: a restore that takes the salt loads
		// each segment's blocks where they lie.
		var salt uint64
		if m := (*r.models.Load())[k.model]; m != nil {
			if ix := m.ix.TierIndex(k.tier); ix != nil {
				salt = ix.Salt()
				for i := range bp.pairs {
					bp.pairs[i].seg = uint8(ix.Segment(bp.pairs[i].seq))
				}
			}
		}
		slices.SortFunc(bp.pairs, func(a, b blockPair) int {
			return cmp.Or(cmp.Compare(a.seg, b.seg), cmp.Compare(a.seq, b.seq), cmp.Compare(a.slot, b.slot))
		})
		x = wire.SnapshotIndex{Model: k.model, Tier: k.tier, Salt: salt, Slots: bp.slots, Keys: x.Keys[:0], Counts: x.Counts[:0], Holders: x.Holders[:0]}
		for i, p := range bp.pairs {
			if i == 0 || p.seq != bp.pairs[i-1].seq {
				x.Keys, x.Counts = append(x.Keys, p.seq), append(x.Counts, 0)
			}
			x.Counts[len(x.Counts)-1]++
			x.Holders = append(x.Holders, p.slot)
			// A message ends at a block's end once it is about a chunk long.
			if end := i+1 == len(bp.pairs) || bp.pairs[i+1].seq != p.seq; end && (12*len(x.Keys)+4*len(x.Holders) >= chunkSize || i+1 == len(bp.pairs)) {
				if err := x.Validate(); err != nil {
					return st, fmt.Errorf("router: snapshot index of model %q: %w", k.model, err)
				}
				buf = wire.AppendSnapshotIndex(buf, &x)
				x.Keys, x.Counts, x.Holders = x.Keys[:0], x.Counts[:0], x.Holders[:0]
				if len(buf) >= chunkSize {
					if err := flush(); err != nil {
						return st, err
					}
				}
			}
		}
	}
	return st, flush()
}

// indexKey names one index: a model's, in one storage tier.
type indexKey struct {
	model string
	tier  kvevent.Tier
}

// blockPairs collects one index's (block, holder) pairs for the snapshot's index section.
type blockPairs struct {
	slots  []wire.SnapshotSlot
	pairs  []blockPair
	placed map[wire.SnapshotSlot]uint32
}

type blockPair struct {
	seq  uint64
	slot uint32 // a place in blockPairs.slots
	seg  uint8  // its segment in the live index
}

// collect adds the blocks seqs (sorted, as sortPairs leaves them) of slot to the pairs of index
// k, each once.
func collect(byBlock map[indexKey]*blockPairs, k indexKey, slot wire.SnapshotSlot, seqs []uint64) {
	if len(seqs) == 0 {
		return
	}
	bp := byBlock[k]
	if bp == nil {
		bp = &blockPairs{placed: map[wire.SnapshotSlot]uint32{}}
		byBlock[k] = bp
	}
	at, ok := bp.placed[slot]
	if !ok {
		at = uint32(len(bp.slots))
		bp.slots = append(bp.slots, slot)
		bp.placed[slot] = at
	}
	for i, seq := range seqs {
		if i == 0 || seq != seqs[i-1] {
			bp.pairs = append(bp.pairs, blockPair{seq: seq, slot: at})
		}
	}
}

// pair is a block of a snapshot rank, for sorting its arrays together.
type pair struct{ seq, engine, local, parent uint64 }

// sortPairs sorts rs's blocks by sequence hash (then engine hash), using scratch.
func sortPairs(rs *wire.SnapshotRank, scratch []pair) []pair {
	scratch = sortBlocks(rs.Seqs, rs.Engines, rs.Locals, rs.Parents, scratch)
	for j := range rs.Lower {
		l := &rs.Lower[j]
		scratch = sortBlocks(l.Seqs, l.Engines, l.Locals, l.Parents, scratch)
	}
	return scratch
}

// sortBlocks sorts one tier's blocks of a rank as sortPairs says.
func sortBlocks(seqs, engines, locals, parents []uint64, scratch []pair) []pair {
	scratch = slices.Grow(scratch[:0], len(seqs))
	tree := len(locals) == len(seqs) && len(parents) == len(seqs)
	for i, s := range seqs {
		p := pair{seq: s, engine: engines[i]}
		if tree {
			p.local, p.parent = locals[i], parents[i]
		}
		scratch = append(scratch, p)
	}
	slices.SortFunc(scratch, func(a, b pair) int {
		if c := cmp.Compare(a.seq, b.seq); c != 0 {
			return c
		}
		return cmp.Compare(a.engine, b.engine)
	})
	for i, p := range scratch {
		seqs[i], engines[i] = p.seq, p.engine
		if tree {
			locals[i], parents[i] = p.local, p.parent
		}
	}
	return scratch
}

// ErrNotEmpty is returned by Restore into a router that has workers already.
var ErrNotEmpty = errors.New("router: restore into a router that has workers")

// Restore registers the workers of a snapshot's chunks and gives them their state (as
// Snapshot wrote it, or a snapshot of the first format, without header or index section),
// before any event or registration reaches the router: it refuses a router that has workers.
// chunk(i, dst) returns chunk i of n, decoded into dst if it fits; chunks are read and applied
// in parallel, so chunk must be safe for concurrent use. Workers whose model conflicts with an
// earlier one's block size are refused and reported in the error, the rest restored. Workers
// that sent load reports are subject to Config.WorkerTimeout again from now.
//
// With an index section, the workers' records give them their slots, engine maps and cursors
// first, and each index is then loaded by block (radix.Index.Load); the index section must
// account for exactly the residencies the records do, or Restore fails.
func (r *Router) Restore(n int, chunk func(i int, dst []byte) ([]byte, error)) (SnapshotStats, error) {
	st, _, err := r.RestoreTimed(n, chunk)
	return st, err
}

// RestoreTimed is Restore, also telling where its time went.
func (r *Router) RestoreTimed(n int, chunk func(i int, dst []byte) ([]byte, error)) (SnapshotStats, RestoreTiming, error) {
	var tm RestoreTiming
	r.mu.Lock()
	empty := len(r.workers) == 0
	r.mu.Unlock()
	if !empty {
		return SnapshotStats{}, tm, ErrNotEmpty
	}
	var (
		st   SnapshotStats
		rs   = restoreState{r: r}
		hd   wire.SnapshotHeader
		head []byte // chunk 0, read first for the header
	)
	if n > 0 {
		b, err := chunk(0, nil)
		if err != nil {
			return st, tm, fmt.Errorf("router: snapshot chunk 0: %w", err)
		}
		head = b
		if typ, body, err := wire.ParseHeader(b); err == nil && typ == wire.TypeSnapshotHeader {
			if len(b) < wire.HeaderSize+body {
				return st, tm, fmt.Errorf("router: snapshot chunk 0: the header is truncated")
			}
			if err := wire.DecodeSnapshotHeader(b[:wire.HeaderSize+body], &hd); err != nil {
				return st, tm, fmt.Errorf("router: snapshot: %w", err)
			}
		}
	}
	rs.bulk, rs.head, rs.read, rs.gate = hd.IndexSection, head, chunk, newChunkGate(n)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	// Twice as many readers as CPUs: each waits while its worker's shard imports it, and the
	// shards should never wait for a reader.
	for range min(n, max(2*runtime.GOMAXPROCS(0), 2)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rd chunkReader
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					break
				}
				rs.restoreChunk(&rd, i)
				rs.gate.done(i)
			}
			rs.mu.Lock()
			st.Workers += rd.st.Workers
			st.Residencies += rd.st.Residencies
			st.Bytes += rd.st.Bytes
			st.Chunks += rd.st.Chunks
			tm.Read += rd.tm.Read
			tm.Decode += rd.tm.Decode
			tm.Build += rd.tm.Build
			rs.mu.Unlock()
		}()
	}
	wg.Wait()
	if rs.bulk {
		tm.Build += rs.loadEdges()
		if rs.loaded != rs.added {
			// Also after errors: a worker over the residency budget is restored in part (its
			// blocks left out of the section's too), and this check catches what is missing
			// for any other reason.
			rs.fail(fmt.Errorf("router: the snapshot's index section holds %d residencies, its workers' records %d: not restored", rs.loaded, rs.added))
		}
	}
	r.mu.Lock()
	for _, m := range rs.restored {
		r.publishLocked(m)
	}
	r.mu.Unlock()
	return st, tm, errors.Join(rs.errs...)
}

// restoreState is one Restore's shared state.
type restoreState struct {
	r    *Router
	bulk bool // the snapshot has an index section: workers are imported without their blocks' residencies
	mu   sync.Mutex
	errs []error
	// added is the residencies the workers' records gave (ImportBulk), which the index section
	// must give again (loaded); skipped the (index, slot, block)s left out over the residency
	// budget.
	added, loaded int64
	skipped       map[skippedKey]struct{}
	// salted is each index the section has loaded into, given the salt it was written under
	// before its first block; edges the blocks of segments that may span messages, loaded
	// last (splitEdges).
	salted map[*radix.Index]bool
	edges  map[*radix.Index][]radix.Blocks
	// restored is the models of the workers restored, to publish once at the end.
	restored []*model

	head []byte                                  // chunk 0, read first for the header
	read func(i int, dst []byte) ([]byte, error) // Restore's chunk
	gate *chunkGate
}

// chunkReader is one reader goroutine's buffers and counts.
type chunkReader struct {
	buf []byte
	w   wire.SnapshotWorker
	x   wire.SnapshotIndex // an index message, its slices reused
	st  SnapshotStats
	tm  RestoreTiming
}

// restoreChunk reads chunk i and restores what it holds: workers' records, or (once the
// chunks before it are in) a part of the index section.
func (rs *restoreState) restoreChunk(rd *chunkReader, i int) {
	b := rs.head
	t0 := time.Now()
	if i != 0 {
		var err error
		if b, err = rs.read(i, rd.buf[:0]); err != nil {
			rs.fail(fmt.Errorf("router: snapshot chunk %d: %w", i, err))
			return
		}
		rd.buf = b
	}
	rd.tm.Read += time.Since(t0)
	rd.st.Chunks++
	rd.st.Bytes += int64(len(b))
	if typ, _, err := wire.ParseHeader(b); err == nil && typ == wire.TypeSnapshotIndex {
		if !rs.bulk {
			rs.fail(fmt.Errorf("router: snapshot chunk %d: an index section without the header that announces it", i))
			return
		}
		// The index section follows every worker's record: once the chunks before this one
		// are in, every holder has its slot, and this chunk's blocks go into the index now,
		// from the reader's own buffers.
		rs.gate.done(i)
		rs.gate.wait(i)
		decode, build := rs.loadIndex(i, b, &rd.x)
		rd.tm.Decode += decode
		rd.tm.Build += build
		return
	}
	for off := 0; off < len(b); {
		typ, body, err := wire.ParseHeader(b[off:])
		if err == nil && len(b)-off-wire.HeaderSize < body {
			err = fmt.Errorf("message at offset %d: truncated", off)
		}
		if err == nil && typ == wire.TypeSnapshotHeader && i == 0 && off == 0 {
			off += wire.HeaderSize + body
			continue
		}
		t1 := time.Now()
		if err == nil {
			err = wire.DecodeSnapshotWorker(b[off:off+wire.HeaderSize+body], &rd.w)
		}
		if err != nil {
			// The rest of the chunk cannot be framed; its other workers are lost with it,
			// which the error says.
			rs.fail(fmt.Errorf("router: snapshot chunk %d at offset %d: %w", i, off, err))
			return
		}
		off += wire.HeaderSize + body
		t2 := time.Now()
		rd.tm.Decode += t2.Sub(t1)
		m, err := rs.worker(&rd.w)
		rd.tm.Build += time.Since(t2)
		if err != nil {
			rs.fail(err)
			continue
		}
		rd.st.Workers++
		for _, rk := range rd.w.Ranks {
			rd.st.Residencies += int64(len(rk.Seqs))
			for _, l := range rk.Lower {
				rd.st.Residencies += int64(len(l.Seqs))
			}
		}
		rs.mu.Lock()
		if !slices.Contains(rs.restored, m) {
			rs.restored = append(rs.restored, m)
		}
		rs.mu.Unlock()
	}
}

// chunkGate holds the index section's chunks until every chunk before them is in.
type chunkGate struct {
	mu   sync.Mutex
	cond sync.Cond
	in   []bool
	low  int // chunks [0, low) are in
}

func newChunkGate(n int) *chunkGate {
	g := &chunkGate{in: make([]bool, n)}
	g.cond.L = &g.mu
	return g
}

// done says chunk i is in (again is harmless).
func (g *chunkGate) done(i int) {
	g.mu.Lock()
	g.in[i] = true
	for g.low < len(g.in) && g.in[g.low] {
		g.low++
	}
	g.mu.Unlock()
	g.cond.Broadcast()
}

// wait returns once every chunk before i is in.
func (g *chunkGate) wait(i int) {
	g.mu.Lock()
	for g.low < i {
		g.cond.Wait()
	}
	g.mu.Unlock()
}

// loadIndex loads the SnapshotIndex messages of chunk i, b, into their indexes, each decoded
// into x (the reader's, reused), its holders mapped in place from places to the slots the
// workers were given. It returns the time spent decoding and mapping, and loading.
func (rs *restoreState) loadIndex(i int, b []byte, x *wire.SnapshotIndex) (decode, build time.Duration) {
	models := *rs.r.models.Load()
	var slots []radix.Slot
	for off := 0; off < len(b); {
		t0 := time.Now()
		_, body, err := wire.ParseHeader(b[off:])
		if err == nil && len(b)-off-wire.HeaderSize < body {
			err = fmt.Errorf("message at offset %d: truncated", off)
		}
		if err == nil {
			err = wire.DecodeSnapshotIndex(b[off:off+wire.HeaderSize+body], x)
		}
		if err != nil {
			rs.fail(fmt.Errorf("router: snapshot chunk %d at offset %d: %w", i, off, err))
			return decode, build
		}
		off += wire.HeaderSize + body
		m := models[x.Model]
		if m == nil {
			rs.fail(fmt.Errorf("router: snapshot index of model %q, which no worker of the snapshot serves", x.Model))
			return decode, build
		}
		ix := m.ix.EnsureTier(x.Tier)
		slots = slots[:0]
		for _, s := range x.Slots {
			slot, ok := ix.Lookup(radix.WorkerKey{ID: s.ID, Rank: s.Rank})
			if !ok {
				rs.fail(fmt.Errorf("router: snapshot index of model %q holds worker %d rank %d, which its records do not", x.Model, s.ID, s.Rank))
				return decode, build
			}
			slots = append(slots, slot)
		}
		// In place: a radix.Slot is a uint32, and each place becomes its slot.
		hs := unsafe.Slice((*radix.Slot)(unsafe.SliceData(x.Holders)), len(x.Holders))
		for j, place := range x.Holders {
			hs[j] = slots[place]
		}
		blocks := radix.Blocks{Keys: x.Keys, Counts: x.Counts, Holders: hs}
		rs.mu.Lock()
		if !rs.salted[ix] {
			// An index that has held nothing takes the salt it was written under, and with
			// it the order its blocks were listed in: loaded where they lie.
			if rs.salted == nil {
				rs.salted = map[*radix.Index]bool{}
			}
			_ = ix.SetSalt(x.Salt)
			rs.salted[ix] = true
		}
		if rs.skipped != nil {
			blocks = rs.keep(ix, blocks)
		}
		rs.loaded += int64(len(blocks.Holders))
		// The first and last segments of a message may go on in the messages beside it:
		// they are kept aside and loaded once whole (loadEdges), so that no segment's table
		// is built twice. The segments between are whole here.
		mid, edges := splitEdges(ix, blocks)
		if len(edges) > 0 {
			if rs.edges == nil {
				rs.edges = map[*radix.Index][]radix.Blocks{}
			}
			rs.edges[ix] = append(rs.edges[ix], edges...)
		}
		rs.mu.Unlock()
		t1 := time.Now()
		decode += t1.Sub(t0)
		if len(mid.Keys) > 0 {
			if err := ix.Load(mid); err != nil {
				rs.fail(fmt.Errorf("router: snapshot index of tier %v: %w", ix.Tier(), err))
			}
		}
		build += time.Since(t1) * time.Duration(min(runtime.GOMAXPROCS(0), 256))
	}
	return decode, build
}

// splitEdges returns the blocks of b between its first and last segment's, in place, and
// copies of those two segments' (b whole, copied, if it has no segment between them).
func splitEdges(ix *radix.Index, b radix.Blocks) (mid radix.Blocks, edges []radix.Blocks) {
	n := len(b.Keys)
	if n == 0 {
		return mid, nil
	}
	lo, hi := 1, n-1 // the first run is [0, lo), the last [hi, n)
	for first := ix.Segment(b.Keys[0]); lo < n && ix.Segment(b.Keys[lo]) == first; lo++ {
	}
	for last := ix.Segment(b.Keys[n-1]); hi > 0 && ix.Segment(b.Keys[hi-1]) == last; hi-- {
	}
	piece := func(i, j int) radix.Blocks {
		h0, h1 := 0, 0
		for _, c := range b.Counts[:i] {
			h0 += int(c)
		}
		h1 = h0
		for _, c := range b.Counts[i:j] {
			h1 += int(c)
		}
		return radix.Blocks{Keys: slices.Clone(b.Keys[i:j]), Counts: slices.Clone(b.Counts[i:j]), Holders: slices.Clone(b.Holders[h0:h1])}
	}
	if lo >= hi {
		return mid, []radix.Blocks{piece(0, n)}
	}
	first, last := piece(0, lo), piece(hi, n)
	hlo := len(first.Holders)
	mid = radix.Blocks{Keys: b.Keys[lo:hi], Counts: b.Counts[lo:hi], Holders: b.Holders[hlo : len(b.Holders)-len(last.Holders)]}
	return mid, []radix.Blocks{first, last}
}

// loadEdges loads the segments splitEdges kept aside, each index's at once, its pieces in the
// order of their segments. It returns the loads' time × the goroutines each used.
func (rs *restoreState) loadEdges() time.Duration {
	t0 := time.Now()
	for ix, pieces := range rs.edges {
		slices.SortStableFunc(pieces, func(a, b radix.Blocks) int {
			return cmp.Compare(ix.Segment(a.Keys[0]), ix.Segment(b.Keys[0]))
		})
		if err := ix.Load(pieces...); err != nil {
			rs.fail(fmt.Errorf("router: snapshot index of tier %v: %w", ix.Tier(), err))
		}
	}
	rs.edges = nil
	return time.Since(t0) * time.Duration(min(runtime.GOMAXPROCS(0), 256))
}

type skippedKey struct {
	ix   *radix.Index
	slot radix.Slot
	seq  uint64
}

func (rs *restoreState) fail(err error) {
	rs.mu.Lock()
	rs.errs = append(rs.errs, err)
	rs.mu.Unlock()
}

// keep returns the blocks of part without the holders the residency budget left out of ix.
func (rs *restoreState) keep(ix *radix.Index, part radix.Blocks) radix.Blocks {
	var out radix.Blocks
	h := 0
	for i, key := range part.Keys {
		c := int(part.Counts[i])
		kept := 0
		for _, slot := range part.Holders[h : h+c] {
			if _, left := rs.skipped[skippedKey{ix, slot, key}]; !left {
				out.Holders = append(out.Holders, slot)
				kept++
			}
		}
		h += c
		if kept > 0 {
			out.Keys, out.Counts = append(out.Keys, key), append(out.Counts, uint32(kept))
		}
	}
	return out
}

// worker restores one snapshot worker: registered and its state imported (without its
// residencies in the index, in bulk).
func (rs *restoreState) worker(w *wire.SnapshotWorker) (*model, error) {
	if !rs.bulk {
		m, _, err := rs.r.restoreWorker(w, nil)
		return m, err
	}
	var m *model
	skip := func(t shard.Tier, slot radix.Slot, seq uint64) {
		rs.mu.Lock()
		if rs.skipped == nil {
			rs.skipped = map[skippedKey]struct{}{}
		}
		rs.skipped[skippedKey{m.ix.EnsureTier(t), slot, seq}] = struct{}{}
		rs.mu.Unlock()
	}
	m, added, err := rs.r.restoreWorker(w, func(mm *model) shard.Skipped { m = mm; return skip })
	rs.mu.Lock()
	rs.added += int64(added)
	rs.mu.Unlock()
	return m, err
}

// restoreWorker registers one snapshot worker (without publishing its model's worker list)
// and imports its state on its shard; with bulk, without its residencies in the index
// (shard.Applier.ImportBulk, told of what it leaves out by bulk's function for the worker's
// model). It returns the residencies imported.
func (r *Router) restoreWorker(w *wire.SnapshotWorker, bulk func(*model) shard.Skipped) (*model, int, error) {
	// The decoded strings alias the chunk's buffer, which the next chunk reuses.
	g := Registration{ID: w.ID, Model: strings.Clone(w.Model), BlockSize: w.BlockSize, Capacity: w.Capacity,
		MaxTokens: w.MaxTokens, Endpoint: strings.Clone(w.Endpoint), Replay: strings.Clone(w.Replay),
		HTTPEndpoint: strings.Clone(w.HTTPEndpoint), APIKey: strings.Clone(w.APIKey), Weight: w.Weight, Role: Role(w.Role)}
	for _, rs := range w.Ranks {
		g.Ranks = append(g.Ranks, rs.Rank)
	}
	ranks, err := g.check()
	if err != nil {
		return nil, 0, fmt.Errorf("router: restore worker %d: %w", w.ID, err)
	}
	g.Ranks = ranks
	// Each rank's own endpoints; a snapshot from before they were kept has the first rank's.
	var eps []RankEndpoint
	if len(w.Endpoints) == len(w.Ranks) && len(w.Endpoints) > 0 {
		for i, e := range w.Endpoints {
			if e.Endpoint != "" {
				eps = append(eps, RankEndpoint{Rank: w.Ranks[i].Rank, Endpoint: strings.Clone(e.Endpoint), Replay: strings.Clone(e.Replay)})
			}
		}
	} else if eps, err = g.rankEndpoints(ranks); err != nil {
		r.log.Warn("restored worker's event endpoint refused", "worker", w.ID, "endpoint", g.Endpoint, "err", err)
		eps = nil
	}
	r.mu.Lock()
	_, err = r.registerLocked(g, eps, false)
	var m *model
	if reg := r.workers[w.ID]; err == nil && reg != nil {
		m = reg.model
		if w.Reports {
			reg.heartbeat.Store(true)
		}
		reg.lastSeen.Store(r.cfg.Now())
	}
	r.mu.Unlock()
	if err != nil {
		return nil, 0, fmt.Errorf("router: restore worker %d: %w", w.ID, err)
	}
	if len(eps) > 0 && r.cfg.Endpoints != nil {
		if err := r.cfg.Endpoints.Registered(g.ID, g.Model, eps); err != nil {
			r.log.Warn("restored worker's event endpoints refused", "worker", w.ID, "err", err)
		}
	}
	var (
		ierr  error
		added int
	)
	if err := r.set.Do(w.ID, func(a *shard.Applier) {
		if bulk == nil {
			added, ierr = a.Import(m.ix, w.ID, w.Ranks)
		} else {
			added, ierr = a.ImportBulk(m.ix, w.ID, w.Ranks, bulk(m))
		}
	}); err != nil {
		return m, added, err
	}
	if ierr != nil {
		return m, added, fmt.Errorf("router: restore worker %d: %w", w.ID, ierr)
	}
	return m, added, nil
}

// ClearAll drops every worker's blocks, keeping registrations and event cursors, after the
// events already handed over: for when events were lost in a way no cursor shows (a stream that
// lost messages to retention), so that the index holds nothing it cannot vouch for. It returns
// the residencies removed.
func (r *Router) ClearAll() (int64, error) {
	r.mu.Lock()
	ids := make([]uint64, 0, len(r.workers))
	for id := range r.workers {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	var n int64
	for _, id := range ids {
		if err := r.set.Do(id, func(a *shard.Applier) { n += int64(a.Clear(id)) }); err != nil {
			return n, err
		}
	}
	return n, nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
