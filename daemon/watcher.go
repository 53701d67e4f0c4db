package daemon

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
)

// engines subscribes to the --zmq sources; nil in approximate mode.
func engines(ctx context.Context, c Config, r *router.Router, log *slog.Logger) *ingest.Engines {
	if c.NoKVEvents {
		return nil
	}
	e := ingest.NewEngines(ctx, r, c.ZMQLimits.Apply(ingest.EngineConfig{Logger: log}))
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

func (w *engineWatcher) Registered(g router.Registration) error {
	e := w.engines()
	if e == nil {
		return nil // approximate mode: no events to read
	}
	src := ingest.EngineSource{Worker: g.ID, Model: g.Model, Endpoint: g.Endpoint, Replay: g.Replay, Ranks: 1}
	if len(g.Ranks) > 0 {
		src.FirstRank, src.Ranks = slices.Min(g.Ranks), len(g.Ranks)
	}
	return e.Add(src)
}

func (w *engineWatcher) Unregistered(id uint64) {
	if e := w.engines(); e != nil {
		e.Remove(id)
	}
}

// resubscribe tells w of the engine endpoints of r's workers (restored from a snapshot).
func resubscribe(r *router.Router, w *engineWatcher, log *slog.Logger) {
	byID := map[uint64]*router.Registration{}
	var ids []uint64
	for _, wi := range r.Workers() {
		if wi.Endpoint == "" {
			continue
		}
		g := byID[wi.ID]
		if g == nil {
			g = &router.Registration{ID: wi.ID, Model: wi.Model, Endpoint: wi.Endpoint, Replay: wi.Replay}
			byID[wi.ID] = g
			ids = append(ids, wi.ID)
		}
		g.Ranks = append(g.Ranks, wi.Rank)
	}
	for _, id := range ids {
		if err := w.Registered(*byID[id]); err != nil {
			log.Warn("restored worker's event endpoint refused", "worker", id, "err", err)
		}
	}
}

func (w *engineWatcher) close() {
	if e := w.engines(); e != nil {
		e.Close()
	}
}
