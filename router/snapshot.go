package router

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

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

// DefaultChunkSize is the size Snapshot cuts chunks at, at worker boundaries.
const DefaultChunkSize = 4 << 20

// Snapshot writes the state of every registered worker — registration, event cursors and
// blocks — as wire.SnapshotWorker messages into chunks of about chunkSize bytes (0:
// DefaultChunkSize), each a run of whole messages, handed to emit (which must not keep the
// slice). A worker's state is read on its shard between two batches of its events (shard.Set.Do),
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
	)
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
		if len(buf) >= chunkSize {
			if err := flush(); err != nil {
				return st, err
			}
		}
	}
	return st, flush()
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
// Snapshot wrote it), before any event or registration reaches the router: it refuses a router
// that has workers. chunk(i, dst) returns chunk i of n, decoded into dst if it fits; chunks are
// read and applied in parallel, so chunk must be safe for concurrent use. Workers whose model
// conflicts with an earlier one's block size are refused and reported in the error, the rest
// restored. Workers that sent load reports are subject to Config.WorkerTimeout again from now.
func (r *Router) Restore(n int, chunk func(i int, dst []byte) ([]byte, error)) (SnapshotStats, error) {
	r.mu.Lock()
	empty := len(r.workers) == 0
	r.mu.Unlock()
	if !empty {
		return SnapshotStats{}, ErrNotEmpty
	}
	var (
		next     atomic.Int64
		mu       sync.Mutex
		st       SnapshotStats
		errs     []error
		restored []*model // models to publish once at the end
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for range min(n, max(runtime.GOMAXPROCS(0), 2)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				buf []byte
				w   wire.SnapshotWorker
				my  SnapshotStats
			)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					break
				}
				b, err := chunk(i, buf[:0])
				if err != nil {
					fail(fmt.Errorf("router: snapshot chunk %d: %w", i, err))
					continue
				}
				buf = b
				my.Chunks++
				my.Bytes += int64(len(b))
				for off := 0; off < len(b); {
					_, body, err := wire.ParseHeader(b[off:])
					if err == nil && len(b)-off-wire.HeaderSize < body {
						err = fmt.Errorf("message at offset %d: truncated", off)
					}
					if err == nil {
						err = wire.DecodeSnapshotWorker(b[off:off+wire.HeaderSize+body], &w)
					}
					if err != nil {
						// The rest of the chunk cannot be framed; its other workers are lost
						// with it, which the error says.
						fail(fmt.Errorf("router: snapshot chunk %d at offset %d: %w", i, off, err))
						break
					}
					off += wire.HeaderSize + body
					m, err := r.restoreWorker(&w)
					if err != nil {
						fail(err)
						continue
					}
					my.Workers++
					for _, rs := range w.Ranks {
						my.Residencies += int64(len(rs.Seqs))
						for _, l := range rs.Lower {
							my.Residencies += int64(len(l.Seqs))
						}
					}
					mu.Lock()
					if !slices.Contains(restored, m) {
						restored = append(restored, m)
					}
					mu.Unlock()
				}
			}
			mu.Lock()
			st.Workers += my.Workers
			st.Residencies += my.Residencies
			st.Bytes += my.Bytes
			st.Chunks += my.Chunks
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.mu.Lock()
	for _, m := range restored {
		r.publishLocked(m)
	}
	r.mu.Unlock()
	return st, errors.Join(errs...)
}

// restoreWorker registers one snapshot worker (without publishing its model's worker list)
// and imports its state on its shard.
func (r *Router) restoreWorker(w *wire.SnapshotWorker) (*model, error) {
	// The decoded strings alias the chunk's buffer, which the next chunk reuses.
	g := Registration{ID: w.ID, Model: strings.Clone(w.Model), BlockSize: w.BlockSize, Capacity: w.Capacity,
		MaxTokens: w.MaxTokens, Endpoint: strings.Clone(w.Endpoint), Replay: strings.Clone(w.Replay),
		HTTPEndpoint: strings.Clone(w.HTTPEndpoint), Weight: w.Weight, Role: Role(w.Role)}
	for _, rs := range w.Ranks {
		g.Ranks = append(g.Ranks, rs.Rank)
	}
	ranks, err := g.check()
	if err != nil {
		return nil, fmt.Errorf("router: restore worker %d: %w", w.ID, err)
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
		return nil, fmt.Errorf("router: restore worker %d: %w", w.ID, err)
	}
	if len(eps) > 0 && r.cfg.Endpoints != nil {
		if err := r.cfg.Endpoints.Registered(g.ID, g.Model, eps); err != nil {
			r.log.Warn("restored worker's event endpoints refused", "worker", w.ID, "err", err)
		}
	}
	var ierr error
	if err := r.set.Do(w.ID, func(a *shard.Applier) { _, ierr = a.Import(m.ix, w.ID, w.Ranks) }); err != nil {
		return m, err
	}
	if ierr != nil {
		return m, fmt.Errorf("router: restore worker %d: %w", w.ID, ierr)
	}
	return m, nil
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
