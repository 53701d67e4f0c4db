package router

import (
	"slices"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Ingest checks one worker's events as ApplyEvents does and hands them to the worker's shard
// without waiting for them to apply: the path of event streams (NATS, ZMQ), whose publishers do
// not register. A worker or data-parallel rank seen for the first time is registered for model
// with the block size its stored events state (or the model's, or the default). Events of one
// worker apply in the order Ingest was called for them. A batch that fails the checks changes
// nothing and is returned as a *FieldError; stream anomalies (gaps, duplicates, unknown parents)
// go to Config.Observer as they apply. Safe for concurrent use; events and their slices may be
// reused once Ingest returns.
func (r *Router) Ingest(worker uint64, model string, events []kvevent.Event) error {
	if len(events) > MaxEventsPerBatch { // before registering anything
		return fieldErr(ErrInvalid, "events", "%d events, at most %d per batch", len(events), MaxEventsPerBatch)
	}
	want, err := ranksNamed(events)
	if err != nil {
		return err
	}
	bs := 0
	for i := range events {
		if events[i].Kind == kvevent.Stored && events[i].BlockSize != 0 {
			bs = events[i].BlockSize
			break
		}
	}
	// Checked before anything is registered, against the block size they will be applied with:
	// a refused batch changes nothing (a malformed first batch used to create its model and
	// fix the model's block size). Its ranks are registered by ensure.
	ebs, settled, registered := r.ingestBlockSize(worker, model, bs)
	for i := range events {
		ev := &events[i]
		if settled && !registered && ev.Kind == kvevent.Stored && ev.BlockSize != 0 && ev.BlockSize != ebs {
			// The registration refuses it naming the block size. A registered worker's is
			// refused here, before ensure would register the batch's new ranks.
			continue
		}
		if err := checkEvent(ev, i, ebs, nil); err != nil {
			r.noteRefused(worker, events, ebs)
			return err
		}
	}
	reg, ranks, err := r.ensure(worker, model, bs, want)
	if err != nil {
		return err
	}
	m := reg.model
	if err := checkEvents(events, m.blockSize, ranks); err != nil {
		r.noteRefused(worker, events, m.blockSize)
		return err
	}
	reg.lastSeen.Store(r.cfg.Now())
	if len(events) == 0 {
		return nil
	}
	b := r.set.NewBatch(m.ix, worker)
	b.Applied = &reg.applied
	for i := range events {
		b.Add(&events[i])
	}
	reg.received.Add(int64(len(events)))
	if err := r.set.Enqueue(b); err != nil {
		reg.received.Add(-int64(len(events)))
		return ErrClosed
	}
	reg.lastEvent.Store(time.Now().UnixNano())
	return nil
}

// ranksNamed returns the distinct ranks events name, refusing more than a worker may have
// (wire.MaxSnapshotRanks). Linear in len(events): a batch usually names one rank, and one that
// names many is looked up in a set.
func ranksNamed(events []kvevent.Event) ([]uint32, error) {
	const few = 16
	var (
		want []uint32
		seen map[uint32]struct{} // want's ranks, once there are more than few
	)
	for i := range events {
		rank := events[i].Rank
		if len(want) > 0 && want[len(want)-1] == rank {
			continue
		}
		if seen == nil && slices.Contains(want, rank) {
			continue
		}
		if _, ok := seen[rank]; ok {
			continue
		}
		if len(want) == wire.MaxSnapshotRanks {
			return nil, fieldErr(ErrTooLong, evField(i, "dp_rank"), "the batch names more than %d ranks, at most %d per worker",
				wire.MaxSnapshotRanks, wire.MaxSnapshotRanks)
		}
		want = append(want, rank)
		switch {
		case seen != nil:
			seen[rank] = struct{}{}
		case len(want) > few:
			seen = make(map[uint32]struct{}, 2*few)
			for _, x := range want {
				seen[x] = struct{}{}
			}
		}
	}
	return want, nil
}

// ingestBlockSize is the block size events of worker for model will be applied with: its model's
// (settled; registered when worker is), or bs (the events' own, 0 for none) or the default for a
// model ensure would create.
func (r *Router) ingestBlockSize(worker uint64, model string, bs int) (_ int, settled, registered bool) {
	r.mu.Lock()
	reg := r.workers[worker]
	r.mu.Unlock()
	switch m := r.model(model); {
	case reg != nil:
		return reg.model.blockSize, true, true
	case m != nil:
		return m.blockSize, true, false
	case bs != 0:
		return bs, false, false
	}
	return r.cfg.BlockSize, false, false
}

// ensure returns worker's registration and ranks, registering the worker for model (with block
// size bs, 0 for the model's or the default) and any of ranks it lacks.
func (r *Router) ensure(worker uint64, model string, bs int, want []uint32) (*registration, []uint32, error) {
	reg, ranks := r.ranksOf(worker)
	if reg != nil && model != "" && model != reg.model.name {
		return nil, nil, fieldErr(ErrConflict, "model", "worker %d serves model %q, not %q", worker, reg.model.name, model)
	}
	var missing []uint32
	for _, rank := range want {
		if _, ok := slices.BinarySearch(ranks, rank); !ok {
			missing = append(missing, rank)
		}
	}
	if reg != nil && len(missing) == 0 {
		return reg, ranks, nil
	}
	if reg == nil && model == "" {
		return nil, nil, fieldErr(ErrUnknownWorker, "worker_id", "worker %d is not registered and the events name no model", worker)
	}
	name := model
	if reg != nil {
		name = reg.model.name
		bs = 0 // the model's block size is settled; a disagreeing event fails its check
	}
	if len(missing) == 0 {
		missing = []uint32{0}
	}
	if err := r.Register(Registration{ID: worker, Model: name, BlockSize: bs, Ranks: missing, KeepRole: true}); err != nil {
		return nil, nil, err
	}
	r.discovered.Add(1)
	r.log.Info("worker discovered from its events", "worker", worker, "model", name, "ranks", missing)
	if reg, ranks = r.ranksOf(worker); reg == nil {
		return nil, nil, fieldErr(ErrUnknownWorker, "worker_id", "worker %d was unregistered meanwhile", worker)
	}
	return reg, ranks, nil
}

// LoadReport is a worker's own account of its load, published periodically by the worker or a
// bridge beside it. It doubles as a heartbeat: see Config.WorkerTimeout.
type LoadReport struct {
	Worker           uint64  `json:"worker_id"`
	Rank             uint32  `json:"dp_rank"`
	Model            string  `json:"model"`
	ActiveBlocks     int64   `json:"active_blocks"`
	WaitingRequests  int64   `json:"waiting_requests"`
	KVUsage          float64 `json:"kv_usage"` // fraction of the KV cache in use, 0 to 1
	MaxBatchedTokens int64   `json:"max_batched_tokens"`
}

// Report records a load report. A worker not registered yet is registered for the report's
// model. From its first report on, the worker is subject to Config.WorkerTimeout. Safe for
// concurrent use.
func (r *Router) Report(rep *LoadReport) error {
	if !(rep.KVUsage >= 0 && rep.KVUsage <= 1) {
		return fieldErr(ErrInvalid, "kv_usage", "%v is not a fraction between 0 and 1", rep.KVUsage)
	}
	if rep.ActiveBlocks < 0 || rep.WaitingRequests < 0 || rep.MaxBatchedTokens < 0 {
		return fieldErr(ErrInvalid, "active_blocks", "counts must not be negative")
	}
	reg, _, err := r.ensure(rep.Worker, rep.Model, 0, []uint32{rep.Rank})
	if err != nil {
		return err
	}
	cp := *rep
	cp.Model = reg.model.name
	r.mu.Lock()
	for _, w := range reg.ranks {
		if w.key.Rank == rep.Rank {
			w.report.Store(&cp)
		}
	}
	if rep.MaxBatchedTokens > 0 {
		reg.maxTokens.Store(rep.MaxBatchedTokens)
	}
	r.mu.Unlock()
	reg.heartbeat.Store(true)
	reg.lastSeen.Store(r.cfg.Now())
	r.drain()
	return nil
}

// DropSilent unregisters every worker that has sent a load report and has been silent (no
// report, no event) for longer than timeout, and returns how many. Its blocks leave the index;
// its next event or report registers it again. The Router calls it periodically when
// Config.WorkerTimeout is set.
func (r *Router) DropSilent(timeout time.Duration) int {
	deadline := r.cfg.Now() - int64(timeout)
	var silent []uint64
	r.mu.Lock()
	for id, reg := range r.workers {
		if reg.heartbeat.Load() && reg.lastSeen.Load() < deadline {
			silent = append(silent, id)
		}
	}
	r.mu.Unlock()
	n := 0
	for _, id := range silent {
		if err := r.unregister(id); err == nil {
			n++
			r.timedOut.Add(1)
			r.log.Warn("worker silent past the timeout: removed from routing, its blocks dropped", "worker", id, "timeout", timeout)
		}
	}
	return n
}

// Flush returns once every event handed to Ingest before it is applied.
func (r *Router) Flush() error {
	if err := r.set.Barrier(); err != nil {
		return ErrClosed
	}
	return nil
}

// Batch returns the Event.Batch of the last engine batch applied for (worker, rank), after
// every event handed over before it: 1 + the batch's sequence on the rank's engine socket, 0
// for none (or a closed router). A new subscription to the rank resumes the engine's stream
// after it (ingest.EngineConfig.Resume).
func (r *Router) Batch(worker uint64, rank uint32) uint64 {
	var b uint64
	if err := r.set.Do(worker, func(a *shard.Applier) { b = a.Batch(worker, rank) }); err != nil {
		return 0
	}
	return b
}
