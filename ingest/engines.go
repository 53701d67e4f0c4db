package ingest

import (
	"context"
	"log/slog"
	"sync"
)

// Engines keeps one Subscriber per engine source, as flags and registrations (Dynamo's
// /register with an endpoint) add and remove them. Safe for concurrent use.
type Engines struct {
	ctx  context.Context
	sink EventSink
	cfg  EngineConfig
	log  *slog.Logger

	mu     sync.Mutex
	subs   map[engineKey]*Subscriber
	closed bool

	ranks sync.Map // rankKey → *rankLoop of subs, for RankState; changed under mu
}

// engineKey identifies a source: a worker's ranks from FirstRank on.
type engineKey struct {
	worker uint64
	rank   uint32
}

// NewEngines returns an empty set of subscriptions feeding sink until ctx ends or Close.
func NewEngines(ctx context.Context, sink EventSink, cfg EngineConfig) *Engines {
	cfg.defaults()
	return &Engines{ctx: ctx, sink: sink, cfg: cfg, log: cfg.Logger, subs: map[engineKey]*Subscriber{}}
}

// Add subscribes to src. A source already subscribed for the same worker and first rank is
// kept if it is the same, else replaced.
func (e *Engines) Add(src EngineSource) error {
	if err := src.Validate(); err != nil {
		return err
	}
	k := engineKey{src.Worker, src.FirstRank}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return context.Canceled
	}
	if old := e.subs[k]; old != nil {
		if old.Source() == src {
			return nil
		}
		old.Close()
		delete(e.subs, k)
		e.unindexLocked(old)
	}
	sub, err := NewSubscriber(src, e.sink, e.cfg)
	if err != nil {
		return err
	}
	if err := sub.Start(e.ctx); err != nil {
		return err
	}
	e.subs[k] = sub
	e.indexLocked(sub)
	e.log.Info("subscribed to an engine's KV events", "source", src.String())
	return nil
}

// Remove ends the subscriptions of worker.
func (e *Engines) Remove(worker uint64) {
	e.remove(func(k engineKey, _ EngineSource) bool { return k.worker == worker })
}

// RemoveRank ends the subscription of worker's rank, if the rank has one of its own (registered
// one rank at a time, as Dynamo's /register does); a subscription of several ranks stays.
func (e *Engines) RemoveRank(worker uint64, rank uint32) {
	e.remove(func(k engineKey, src EngineSource) bool {
		return k.worker == worker && k.rank == rank && src.Ranks <= 1
	})
}

// remove ends the subscriptions match picks.
func (e *Engines) remove(match func(engineKey, EngineSource) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, sub := range e.subs {
		if match(k, sub.Source()) {
			sub.Close()
			delete(e.subs, k)
			e.unindexLocked(sub)
			e.log.Info("unsubscribed from an engine's KV events", "source", sub.Source().String())
		}
	}
}

// Stats returns each subscription's counters by its source's flag form.
func (e *Engines) Stats() map[string]EngineStats {
	out := map[string]EngineStats{}
	for src, st := range e.sources() {
		out[src.String()] = st
	}
	return out
}

// sources returns each subscription's source and counters.
func (e *Engines) sources() map[EngineSource]EngineStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[EngineSource]EngineStats, len(e.subs))
	for _, sub := range e.subs {
		out[sub.Source()] = sub.Stats()
	}
	return out
}

// Close ends every subscription.
func (e *Engines) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for k, sub := range e.subs {
		sub.Close()
		delete(e.subs, k)
		e.unindexLocked(sub)
	}
}
