package router

import "time"

// SourceState says where a worker's rank gets its KV events from and whether they flow, as
// listings report it (WorkerInfo.State).
type SourceState string

// The states of a rank.
const (
	// StateConnecting: the daemon subscribes to the rank's own socket and is not connected to
	// it, not yet or not any more (it dials again).
	StateConnecting SourceState = "connecting"
	// StateActive: connected, and a batch arrived (or the connection was made) within the
	// staleness window.
	StateActive SourceState = "active"
	// StateStale: connected, and nothing arrived for longer than the staleness window. An idle
	// engine publishes nothing, so this is a hint to look, not a failure.
	StateStale SourceState = "stale"
	// StateGone: registered with an endpoint that no subscription reads (it was removed, or
	// refused).
	StateGone SourceState = "gone"
	// StateStream: no subscription of its own; its events come through the event stream or
	// HTTP.
	StateStream SourceState = "stream"
)

// SourceStates knows the ranks whose events the daemon reads from their own sockets (engine
// subscriptions). Its methods are safe for concurrent use, and return without waiting on
// anything the Router holds.
type SourceStates interface {
	// RankState returns the state of worker's rank and when its last batch arrived (zero
	// before the first); ok is false when no subscription reads that rank.
	RankState(worker uint64, rank uint32) (state SourceState, last time.Time, ok bool)
}

// sourceState fills x's State and LastEventAt: from Config.Sources for a rank a subscription
// reads, else from what the Router saw of the worker's events. Approximate mode reads no
// events: it leaves them empty.
func (r *Router) sourceState(x *WorkerInfo, reg *registration) {
	if r.approx != nil {
		return
	}
	if r.cfg.Sources != nil {
		if st, last, ok := r.cfg.Sources.RankState(x.ID, x.Rank); ok {
			x.State, x.LastEventAt = st, last
			return
		}
	}
	if x.Endpoint != "" {
		x.State = StateGone
	} else {
		x.State = StateStream
	}
	if ns := reg.lastEvent.Load(); ns != 0 {
		x.LastEventAt = time.Unix(0, ns).UTC()
	}
}
