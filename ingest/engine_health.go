package ingest

// The health of engine subscriptions: each rank's state (connecting, active, stale) and the time
// of its last batch, for listings (Engines.RankState) and the metrics.

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouterd/kvrouterd/router"
)

// DefaultStaleAfter is EngineConfig.StaleAfter's default.
const DefaultStaleAfter = 60 * time.Second

// rankHealth is when a rank's current connection was made and when its last batch was handed
// on, in Unix nanoseconds (0: never). The rank's goroutine writes it; listings and scrapes read
// it.
type rankHealth struct {
	connectedAt atomic.Int64
	lastBatch   atomic.Int64
}

// connecting notes a connection made; called before the rank is marked connected, so that a
// reader who sees it connected sees this connection's time.
func (h *rankHealth) connecting() { h.connectedAt.Store(time.Now().UnixNano()) }

// batch notes a batch handed on.
func (h *rankHealth) batch() { h.lastBatch.Store(time.Now().UnixNano()) }

// state returns the rank's state at now and the time of its last batch (zero before the
// first). A connected rank is active while its last batch, or its connection if later, is at
// most staleAfter old.
func (h *rankHealth) state(connected bool, now time.Time, staleAfter time.Duration) (router.SourceState, time.Time) {
	var last time.Time
	lb := h.lastBatch.Load()
	if lb != 0 {
		last = time.Unix(0, lb).UTC()
	}
	if !connected {
		return router.StateConnecting, last
	}
	if now.UnixNano()-max(lb, h.connectedAt.Load()) > int64(staleAfter) {
		return router.StateStale, last
	}
	return router.StateActive, last
}

// health fills the State and LastBatch of ranks, the RankStats of s's ranks.
func (s *engineStream) health(ranks []RankStats) {
	now := time.Now()
	for i, rl := range s.ranks {
		if i < len(ranks) && ranks[i].Rank == rl.rank {
			ranks[i].State, ranks[i].LastBatch = rl.health.state(rl.connected.Load(), now, s.cfg.StaleAfter)
		}
	}
}

// rankKey names one data-parallel rank of a worker.
type rankKey struct {
	worker uint64
	rank   uint32
}

// indexLocked makes sub's ranks found by RankState. A rank two subscriptions read at once (a
// misconfiguration: its events arrive twice) is found by the one added last. REQUIRES
// Engines.mu.
func (e *Engines) indexLocked(sub *Subscriber) {
	for _, rl := range sub.s.ranks {
		e.ranks.Store(rankKey{sub.s.src.Worker, rl.rank}, rl)
	}
}

// unindexLocked forgets the ranks of sub, removed. REQUIRES Engines.mu.
func (e *Engines) unindexLocked(sub *Subscriber) {
	for _, rl := range sub.s.ranks {
		e.ranks.CompareAndDelete(rankKey{sub.s.src.Worker, rl.rank}, rl)
	}
}

// RankState returns the state of the rank a subscription reads for worker and when its last
// batch was handed on (zero before the first); ok is false when no subscription reads it.
// Safe for concurrent use; it waits for no lock Engines' other methods hold.
func (e *Engines) RankState(worker uint64, rank uint32) (state router.SourceState, last time.Time, ok bool) {
	v, found := e.ranks.Load(rankKey{worker, rank})
	if !found {
		return "", time.Time{}, false
	}
	rl := v.(*rankLoop)
	state, last = rl.health.state(rl.connected.Load(), time.Now(), rl.s.cfg.StaleAfter)
	return state, last, true
}

var (
	descZMQEvents   = prometheus.NewDesc("kvrouterd_zmq_events_total", "Engine events handed to the index, replayed ones included.", zmqLabels, nil)
	descZMQReplayed = prometheus.NewDesc("kvrouterd_zmq_replayed_batches_total", "Engine batches recovered from the rank's replay socket.", zmqLabels, nil)
	descZMQReplayRq = prometheus.NewDesc("kvrouterd_zmq_replay_requests_total", "Requests sent to the rank's replay socket to fill a gap.", zmqLabels, nil)
	descZMQClears   = prometheus.NewDesc("kvrouterd_zmq_clears_total",
		"Times the rank's blocks were cleared because its batches were lost for good or its engine restarted.", zmqLabels, nil)
	descZMQLastTime = prometheus.NewDesc("kvrouterd_zmq_last_batch_timestamp_seconds",
		"Unix time of the rank's last batch handed on; absent before the first.", zmqLabels, nil)
	descZMQLastAge = prometheus.NewDesc("kvrouterd_zmq_last_batch_age_seconds",
		"Seconds since the rank's last batch was handed on (its lag); absent before the first.", zmqLabels, nil)
	descZMQState = prometheus.NewDesc("kvrouterd_zmq_state",
		"1 for the rank's state, 0 for the others: connecting (not connected, dialling), active (connected, a batch or the connection within --zmq-stale-after), stale (connected, silent longer).",
		append(zmqLabels, "state"), nil)
	zmqStates = [...]router.SourceState{router.StateConnecting, router.StateActive, router.StateStale}
)

func describeHealth(ch chan<- *prometheus.Desc) {
	for _, d := range [...]*prometheus.Desc{descZMQEvents, descZMQReplayed, descZMQReplayRq, descZMQClears, descZMQLastTime, descZMQLastAge, descZMQState} {
		ch <- d
	}
}

// collectHealth sends rank r's health series, labelled l.
func collectHealth(ch chan<- prometheus.Metric, l []string, r *RankStats, now time.Time) {
	c := &r.Counters
	for _, m := range [...]struct {
		d *prometheus.Desc
		v int64
	}{{descZMQEvents, c.Events}, {descZMQReplayed, c.Replayed}, {descZMQReplayRq, c.ReplayRequests}, {descZMQClears, c.Clears}} {
		ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, float64(m.v), l...)
	}
	if !r.LastBatch.IsZero() {
		ch <- prometheus.MustNewConstMetric(descZMQLastTime, prometheus.GaugeValue, float64(r.LastBatch.UnixNano())/1e9, l...)
		ch <- prometheus.MustNewConstMetric(descZMQLastAge, prometheus.GaugeValue, max(now.Sub(r.LastBatch).Seconds(), 0), l...)
	}
	for _, st := range zmqStates {
		v := 0.0
		if r.State == st {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descZMQState, prometheus.GaugeValue, v, append(l, string(st))...)
	}
}
