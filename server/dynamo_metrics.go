package server

// Dynamo's metric names for what kvrouterd measures too, so that a Dynamo dashboard shows data.

import (
	"fmt"
	"strconv"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/prometheus/client_golang/prometheus"
)

// dynamoMetrics are the per-request series under Dynamo's names (lib/llm kv_router metrics.rs
// and prometheus_names.rs): observed for each routed request, beside kvrouterd's own; the
// routing phases for the requests the router samples (router.Config.PhaseSample).
type dynamoMetrics struct {
	// Observed on every routed request, so striped (striped_metrics.go).
	hitRate  *histFamily // the chosen worker's cached blocks over the request's blocks
	isl      *histFamily // the request's prompt tokens
	overhead *histFamily // the time to route, in milliseconds

	// A sampled routed request's phases, in milliseconds (router.RoutePhases).
	blockHashing, seqHashing, findMatches, scheduling prometheus.Histogram

	// The standalone indexer's HTTP series (kv-router standalone indexer metrics.rs), for the
	// indexer's routes kvrouterd serves: latency by route, requests by route and method,
	// error answers by route and status class (4xx, 5xx).
	idxDuration          *prometheus.HistogramVec
	idxRequests, idxErrs *prometheus.CounterVec
}

func newDynamoMetrics(reg *prometheus.Registry, r *router.Router, routerID string) *dynamoMetrics {
	// Dynamo's buckets: doubling from 1 µs for the hashing phases, which compute only, tripling
	// from 10 µs for the others and the total.
	computeBuckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	asyncBuckets := prometheus.ExponentialBuckets(0.01, 3, 17)
	// Dynamo labels the overhead histograms router_id, the router instance's id.
	var idLabel prometheus.Labels
	if routerID != "" {
		idLabel = prometheus.Labels{"router_id": routerID}
	}
	overhead := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: idLabel})
	}
	sampled := fmt.Sprintf(" Sampled: about one routed request in %d is timed phase by phase.", r.PhaseSample())
	m := &dynamoMetrics{
		hitRate: newHistFamily("dynamo_component_router_kv_hit_rate",
			"Dynamo's name: the share of a routed request's blocks cached on the worker chosen.",
			prometheus.LinearBuckets(0, 0.05, 21), nil, nil, nil),
		isl: newHistFamily("dynamo_component_router_input_sequence_tokens",
			"Dynamo's name: a routed request's prompt tokens.",
			prometheus.ExponentialBucketsRange(50, 128000, 12), nil, nil, nil),
		overhead: newHistFamily("dynamo_router_overhead_total_ms",
			"Dynamo's name: the time to route a request, in milliseconds (kvrouterd: the whole HTTP request).", asyncBuckets, nil, idLabel, nil),
		blockHashing: overhead("dynamo_router_overhead_block_hashing_ms",
			"Dynamo's name: the time to hash a routed request's blocks, in milliseconds."+sampled, computeBuckets),
		seqHashing: overhead("dynamo_router_overhead_seq_hashing_ms",
			"Dynamo's name: the time to chain a routed request's block hashes into sequence hashes, in milliseconds."+sampled, computeBuckets),
		findMatches: overhead("dynamo_router_overhead_indexer_find_matches_ms",
			"Dynamo's name: the time to match a routed request's blocks in the index, in milliseconds."+sampled, asyncBuckets),
		scheduling: overhead("dynamo_router_overhead_scheduling_ms",
			"Dynamo's name: the time to score the workers, choose one and book a routed request, in milliseconds."+sampled, asyncBuckets),
	}
	// The standalone indexer's: doubling from 100 µs, 20 buckets.
	m.idxDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dynamo_kvindexer_request_duration_seconds",
		Help:    "Dynamo's name (standalone indexer): the time to answer a request to one of the indexer's routes, by route.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20)}, []string{"endpoint"})
	m.idxRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynamo_kvindexer_requests_total",
		Help: "Dynamo's name (standalone indexer): requests to the indexer's routes, by route and method."}, []string{"endpoint", "method"})
	m.idxErrs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynamo_kvindexer_errors_total",
		Help: "Dynamo's name (standalone indexer): error answers (4xx, 5xx) of the indexer's routes, by route and status class."}, []string{"endpoint", "status_class"})
	reg.MustRegister(m.hitRate, m.isl, m.overhead, m.blockHashing, m.seqHashing, m.findMatches, m.scheduling, dynamoCollector{r},
		m.idxDuration, m.idxRequests, m.idxErrs)
	return m
}

// dynIndexerRoute returns path if it is one of the standalone indexer's routes, which
// dynamo_kvindexer_requests_total and its siblings count; kvrouterd's own routes are not.
func dynIndexerRoute(path []byte) (string, bool) {
	switch string(path) {
	case "/health":
		return "/health", true
	case "/metrics":
		return "/metrics", true
	case "/register":
		return "/register", true
	case "/unregister":
		return "/unregister", true
	case "/workers":
		return "/workers", true
	case "/query":
		return "/query", true
	case "/query_by_hash":
		return "/query_by_hash", true
	case "/dump":
		return "/dump", true
	case "/register_peer":
		return "/register_peer", true
	case "/deregister_peer":
		return "/deregister_peer", true
	case "/peers":
		return "/peers", true
	case "/test/pause_listener":
		return "/test/pause_listener", true
	case "/test/resume_listener":
		return "/test/resume_listener", true
	}
	return "", false
}

// indexerRequest observes an answered request to one of the standalone indexer's routes
// (path, as Dynamo's route pattern names it), as Dynamo's indexer middleware does.
func (m *dynamoMetrics) indexerRequest(path string, method []byte, status int, seconds float64) {
	m.idxRequests.WithLabelValues(path, string(method)).Inc()
	m.idxDuration.WithLabelValues(path).Observe(seconds)
	switch {
	case status >= 500:
		m.idxErrs.WithLabelValues(path, "5xx").Inc()
	case status >= 400:
		m.idxErrs.WithLabelValues(path, "4xx").Inc()
	}
}

// routed observes a routed request's answer, in the stripe of hint (its connection's id); the
// time it took is observed with its latency, by metrics.observe.
func (m *dynamoMetrics) routed(hint uint64, blocks, cached, isl uint32) {
	if blocks > 0 {
		m.hitRate.series[0].Observe(hint, float64(cached)/float64(blocks))
	}
	m.isl.series[0].Observe(hint, float64(isl))
}

// ObserveRoutePhases observes a sampled routed request's phases (router.PhaseObserver).
func (m *dynamoMetrics) ObserveRoutePhases(p router.RoutePhases) {
	m.blockHashing.Observe(ms(p.BlockHashing))
	m.seqHashing.Observe(ms(p.SeqHashing))
	m.findMatches.Observe(ms(p.FindMatches))
	m.scheduling.Observe(ms(p.Scheduling))
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// dynamoCollector reads the router's state under Dynamo's names at scrape time. A worker of role
// prefill is worker_type "prefill"; the others serve decode stages and whole requests, which
// Dynamo labels worker_type "decode".
type dynamoCollector struct{ r *router.Router }

var (
	descDynDecode = prometheus.NewDesc("dynamo_frontend_worker_active_decode_blocks",
		"Dynamo's name: a worker rank's active decode blocks.", []string{"worker_id", "dp_rank", "worker_type"}, nil)
	descDynPrefill = prometheus.NewDesc("dynamo_frontend_worker_active_prefill_tokens",
		"Dynamo's name: a worker rank's active prefill tokens.", []string{"worker_id", "dp_rank", "worker_type"}, nil)
	descDynRegistered = prometheus.NewDesc("dynamo_component_router_worker_registered",
		"Dynamo's name: 1 for each registered worker rank.", []string{"router_worker_id", "dp_rank", "worker_type"}, nil)
	descDynRequests = prometheus.NewDesc("dynamo_component_router_requests_total",
		"Dynamo's name: requests routed.", nil, nil)
	// The standalone indexer's name and the frontend router's for the same count.
	descDynIndexerEvents = prometheus.NewDesc("dynamo_kvrouter_kv_cache_events_applied",
		"Dynamo's name (standalone indexer): KV events applied, by event type and status.", []string{"event_type", "status"}, nil)
	descDynRouterEvents = prometheus.NewDesc("dynamo_component_kv_cache_events_applied",
		"Dynamo's name (router): KV events applied, by event type and status.", []string{"event_type", "status"}, nil)
	// The standalone indexer's state gauges, from the registered workers.
	descDynIdxModels = prometheus.NewDesc("dynamo_kvindexer_models",
		"Dynamo's name (standalone indexer): (model, routing group) partitions that have registered workers.", nil, nil)
	descDynIdxWorkers = prometheus.NewDesc("dynamo_kvindexer_workers",
		"Dynamo's name (standalone indexer): registered worker instances.", nil, nil)
	descDynIdxListeners = prometheus.NewDesc("dynamo_kvindexer_listeners",
		"Dynamo's name (standalone indexer): KV-event subscriptions of registered ranks, by status as /workers reports it (pending, active, paused, failed).", []string{"status"}, nil)
)

// dynListenerStatuses are the statuses of dynamo_kvindexer_listeners, each exported even at 0.
var dynListenerStatuses = [...]string{dynPending, dynActive, dynPaused, dynFailed}

// dynamoStatus names an event's outcome as Dynamo's status label does where Dynamo has the
// same outcome (kv-router indexer metrics), kvrouterd's own name where it has none.
func dynamoStatus(s shard.Status) string {
	switch s {
	case shard.UnknownParent:
		return "parent_block_not_found"
	case shard.UnknownBlocks:
		return "block_not_found"
	case shard.BadTokens, shard.BadBlockSize, shard.BadKind:
		return "invalid_block"
	case shard.OverBudget:
		return "capacity_exhausted"
	}
	return s.String()
}

func (c dynamoCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDynDecode, descDynPrefill, descDynRegistered, descDynRequests, descDynIndexerEvents, descDynRouterEvents,
		descDynIdxModels, descDynIdxWorkers, descDynIdxListeners} {
		ch <- d
	}
}

func (c dynamoCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Stats()
	ch <- prometheus.MustNewConstMetric(descDynRequests, prometheus.CounterValue, float64(st.Routed))
	// Several of kvrouterd's statuses are one of Dynamo's: summed under it.
	type key struct{ kind, status string }
	var order []key
	sums := map[key]int64{}
	eachKindStatus(&st.Events, func(kind kvevent.Kind, s shard.Status, n int64) {
		k := key{kind.String(), dynamoStatus(s)}
		if _, ok := sums[k]; !ok {
			order = append(order, k)
		}
		sums[k] += n
	})
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(descDynIndexerEvents, prometheus.CounterValue, float64(sums[k]), k.kind, k.status)
		ch <- prometheus.MustNewConstMetric(descDynRouterEvents, prometheus.CounterValue, float64(sums[k]), k.kind, k.status)
	}
	workers := c.r.Workers()
	models, instances := map[string]bool{}, map[uint64]bool{}
	listeners := map[string]int{}
	for i := range workers {
		w := &workers[i]
		models[w.Model], instances[w.ID] = true, true
		if w.Endpoint != "" { // a rank registered with its KV-event socket: a listener
			listeners[newDynListener(w).Status]++
		}
	}
	ch <- prometheus.MustNewConstMetric(descDynIdxModels, prometheus.GaugeValue, float64(len(models)))
	ch <- prometheus.MustNewConstMetric(descDynIdxWorkers, prometheus.GaugeValue, float64(len(instances)))
	for _, st := range dynListenerStatuses {
		ch <- prometheus.MustNewConstMetric(descDynIdxListeners, prometheus.GaugeValue, float64(listeners[st]), st)
	}
	for _, w := range workers {
		id, rank := strconv.FormatUint(w.ID, 10), strconv.FormatUint(uint64(w.Rank), 10)
		typ := "decode"
		if w.Role == router.RolePrefill.String() {
			typ = "prefill"
		}
		ch <- prometheus.MustNewConstMetric(descDynDecode, prometheus.GaugeValue, float64(w.ActiveBlocks), id, rank, typ)
		ch <- prometheus.MustNewConstMetric(descDynPrefill, prometheus.GaugeValue, float64(w.ActivePrefill), id, rank, typ)
		ch <- prometheus.MustNewConstMetric(descDynRegistered, prometheus.GaugeValue, 1, id, rank, typ)
	}
}

// HitRate returns what dynamo_component_router_kv_hit_rate has observed since the start: the
// sum of routed requests' hit rates (the share of a request's blocks cached on the worker
// chosen) and how many requests it sums (those of at least one block). It reads the histogram's
// counters, so that the route path pays nothing more for it; for the status page.
func (s *Server) HitRate() (sum float64, requests uint64) {
	h := s.m.dyn.hitRate.series[0]
	requests, sum = h.Read(make([]uint64, len(h.Upper())+1))
	return sum, requests
}
