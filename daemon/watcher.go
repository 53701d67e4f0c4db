package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
)

// engines subscribes to the --zmq sources; nil in approximate mode.
func engines(ctx context.Context, c Config, r *router.Router, log *slog.Logger) *ingest.Engines {
	if c.NoKVEvents {
		return nil
	}
	// A subscription takes up each rank's stream after the last batch the index holds from it
	// (restored from the snapshot): what the engine published meanwhile is replayed, or lost
	// for good and the rank's blocks kept (cleared with --clear-on-gap).
	e := ingest.NewEngines(ctx, r, c.ZMQLimits.Apply(ingest.EngineConfig{Logger: log, StaleAfter: c.ZMQStaleAfter, KeepOnGap: !c.ClearOnGap, Resume: r.Batch}))
	for _, src := range c.ZMQ {
		if err := e.Add(src); err != nil {
			log.Error("engine source refused", "source", src.String(), "err", err)
		}
	}
	return e
}

// engineWatcher subscribes to the event endpoints workers register with (Dynamo's /register
// endpoint and replay_endpoint). Set once, before the HTTP API serves.
type engineWatcher struct {
	mu sync.Mutex
	e  *ingest.Engines
	// paused are the ranks whose subscription a test paused (listenerControl); REQUIRES mu.
	paused map[rankKey]bool
}

func (w *engineWatcher) pause(k rankKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.paused == nil {
		w.paused = map[rankKey]bool{}
	}
	w.paused[k] = true
}

func (w *engineWatcher) unpause(k rankKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.paused, k)
}

func (w *engineWatcher) isPaused(k rankKey) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.paused[k]
}

// forget drops worker's paused ranks (every rank, for rank < 0): a rank registered again or
// gone is no longer paused.
func (w *engineWatcher) forget(worker uint64, rank int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.paused {
		if k.worker == worker && (rank < 0 || int64(k.rank) == rank) {
			delete(w.paused, k)
		}
	}
}

func (w *engineWatcher) set(e *ingest.Engines) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.e = e
}

func (w *engineWatcher) engines() *ingest.Engines {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.e
}

// Registered subscribes to each rank's own sockets: ranks registered one at a time, each with
// its endpoint, are each read from theirs.
func (w *engineWatcher) Registered(worker uint64, model string, ranks []router.RankEndpoint) error {
	e := w.engines()
	if e == nil {
		return nil // approximate mode: no events to read
	}
	var errs []error
	for _, rk := range ranks {
		w.forget(worker, int64(rk.Rank))
		if err := e.Add(engineSource(worker, model, rk)); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", rk.Rank, err))
		}
	}
	return errors.Join(errs...)
}

// Check refuses endpoints no subscription can read: the error of the first rank refused.
func (w *engineWatcher) Check(worker uint64, model string, ranks []router.RankEndpoint) error {
	for _, rk := range ranks {
		if err := engineSource(worker, model, rk).Validate(); err != nil {
			return fmt.Errorf("rank %d: %w", rk.Rank, err)
		}
	}
	return nil
}

func engineSource(worker uint64, model string, rk router.RankEndpoint) ingest.EngineSource {
	return ingest.EngineSource{Worker: worker, Model: model, Endpoint: rk.Endpoint, Replay: rk.Replay, FirstRank: rk.Rank, Ranks: 1}
}

func (w *engineWatcher) Unregistered(id uint64) {
	w.forget(id, -1)
	if e := w.engines(); e != nil {
		e.Remove(id)
	}
}

func (w *engineWatcher) UnregisteredRank(id uint64, rank uint32) {
	w.forget(id, int64(rank))
	if e := w.engines(); e != nil {
		e.RemoveRank(id, rank)
	}
}

// resubscribe tells w of the engine endpoints of r's workers (restored from a snapshot).
func resubscribe(r *router.Router, w *engineWatcher, log *slog.Logger) {
	byID := map[uint64][]router.RankEndpoint{}
	models := map[uint64]string{}
	var ids []uint64
	for _, wi := range r.Workers() {
		if wi.Endpoint == "" {
			continue
		}
		if _, ok := byID[wi.ID]; !ok {
			ids = append(ids, wi.ID)
			models[wi.ID] = wi.Model
		}
		byID[wi.ID] = append(byID[wi.ID], router.RankEndpoint{Rank: wi.Rank, Endpoint: wi.Endpoint, Replay: wi.Replay})
	}
	for _, id := range ids {
		if err := w.Registered(id, models[id], byID[id]); err != nil {
			log.Warn("restored worker's event endpoint refused", "worker", id, "err", err)
		}
	}
}

func (w *engineWatcher) close() {
	if e := w.engines(); e != nil {
		e.Close()
	}
}
