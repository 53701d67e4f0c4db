package server

import (
	"strconv"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/valyala/fasthttp"
)

// endpoint numbers the API's endpoints for per-endpoint metrics without a label lookup per
// request.
type endpoint int

const (
	epRoute endpoint = iota
	epMatch
	epPrefillDone
	epComplete
	epOutput
	epEvents
	epWorkers
	epDynamo
	epHealth
	epMetrics
	epSnapshot
	epSelection
	epBusy
	epUI
	epOther
	numEndpoints
)

var endpointNames = [numEndpoints]string{"route", "match", "prefill_done", "complete", "output", "events", "workers", "dynamo", "health", "metrics", "snapshot", "selection", "busy_threshold", "ui", "other"}

type metrics struct {
	reg *prometheus.Registry
	// latency is kvrouterd_http_request_duration_seconds, a series per endpoint (index).
	latency  *histFamily
	rejected *prometheus.CounterVec
	// requests counts the API's requests by endpoint and status code.
	requests *requestCounts
	// unknownFields counts the fields of Dynamo's bodies that kvrouterd ignores, by path.
	unknownFields *prometheus.CounterVec
	dyn           *dynamoMetrics
	// selRequests counts the selection service's requests (HandleSelection).
	selRequests *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry, r *router.Router, routerID string) *metrics {
	m := &metrics{reg: reg}
	eps := make([][]string, numEndpoints)
	for i := range eps {
		eps[i] = []string{endpointNames[i]}
	}
	m.latency = newHistFamily("kvrouterd_http_request_duration_seconds", "Time to serve an HTTP request, by endpoint.",
		[]float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3, 50e-3, 0.25, 1}, []string{"endpoint"}, nil, eps)
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouterd_http_rejected_total",
		Help: "Requests refused as malformed or inconsistent, by endpoint and reason.",
	}, []string{"endpoint", "reason"})
	m.requests = newRequestCounts()
	m.unknownFields = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouterd_dynamo_unknown_fields_total",
		Help: "Fields of requests to Dynamo's endpoints that kvrouterd does not know and ignores, by path.",
	}, []string{"path"})
	m.dyn = newDynamoMetrics(reg, r, routerID)
	m.selRequests = newSelMetrics(reg)
	reg.MustRegister(m.latency, m.rejected, m.requests, m.unknownFields, &routerCollector{r: r}, &queueCollector{r: r}, overloadCollector{r}, disaggCollector{r},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// The status codes requestCounts counts without a lock; others (none the API answers) are
// counted under it.
const minCode, maxCode = 100, 599

// observe counts a request to ep, answered with code in seconds, its latency in the stripe of
// hint (its connection's id). A route answered is also Dynamo's total overhead, which for
// kvrouterd is the whole HTTP request.
func (m *metrics) observe(hint uint64, ep endpoint, code int, seconds float64) {
	m.latency.series[ep].Observe(hint, seconds)
	m.requests.count(ep, code)
	if ep == epRoute && code == fasthttp.StatusOK {
		m.dyn.overhead.series[0].Observe(hint, seconds*1e3)
	}
}

// routerCollector reads the router's state at scrape time, so that serving requests pays
// nothing for these metrics.
type routerCollector struct{ r *router.Router }

var (
	descEvents    = prometheus.NewDesc("kvrouterd_events_total", "KV events applied, by outcome status.", []string{"status"}, nil)
	descEventsBy  = prometheus.NewDesc("kvrouterd_events_by_type_total", "KV events applied, by event type (stored, removed, cleared) and outcome status.", []string{"type", "status"}, nil)
	descBlocks    = prometheus.NewDesc("kvrouterd_event_blocks_total", "Blocks stored, removed, or skipped by events.", []string{"op"}, nil)
	descGaps      = prometheus.NewDesc("kvrouterd_event_gaps_total", "Gaps in event ids, the event ids missed, and the ranks cleared to repair them.", []string{"kind"}, nil)
	descQueue     = prometheus.NewDesc("kvrouterd_shard_queue_depth", "Batches waiting in the shard queues.", nil, nil)
	descWaits     = prometheus.NewDesc("kvrouterd_shard_enqueue_waits_total", "Times a producer waited for a full shard queue.", nil, nil)
	descRequests  = prometheus.NewDesc("kvrouterd_requests_total", "Route and match requests served, and requests expired.", []string{"kind"}, nil)
	descActive    = prometheus.NewDesc("kvrouterd_active_requests", "Routed requests not completed yet.", nil, nil)
	descPredicted = prometheus.NewDesc("kvrouterd_predicted_residencies", "Predict-on-route: (block, worker) pairs routing decisions placed in the side index, not yet expired (--router-predicted-ttl).", nil, nil)
	descRaised    = prometheus.NewDesc("kvrouterd_predict_raised_total", "Predict-on-route: matches in which a prediction raised some worker's cached depth over what its KV events had told.", nil, nil)
	descEntries   = prometheus.NewDesc("kvrouterd_index_blocks", "Distinct blocks in a model's index.", []string{"model"}, nil)
	descResidency = prometheus.NewDesc("kvrouterd_index_residencies", "(block, worker) pairs in a model's index.", []string{"model"}, nil)
	descEvicted   = prometheus.NewDesc("kvrouterd_index_evicted_blocks_total", "Residencies evicted to keep the index within --max-index-bytes, the least recently matched blocks of the worker holding the most.", nil, nil)
	descMaxBytes  = prometheus.NewDesc("kvrouterd_index_max_bytes", "The index's memory bound (--max-index-bytes), 0 for none.", nil, nil)
	descTierRes   = prometheus.NewDesc("kvrouterd_index_tier_residencies", "(block, worker) pairs in a model's index of each storage tier (device, host, disk, external); kvrouterd_index_residencies is the device's.", []string{"model", "tier"}, nil)
	descMembers   = prometheus.NewDesc("kvrouterd_workers_changes_total", "Workers registered from their own events or reports (discovered), removed after falling silent (timed_out), and left out of a snapshot whose format cannot hold them (snapshot_skipped).", []string{"kind"}, nil)
	descWorker    = prometheus.NewDesc("kvrouterd_worker_load", "Deprecated, mixes units: the same as kvrouterd_worker_cached_blocks, kvrouterd_worker_active_blocks, kvrouterd_worker_active_prefill_tokens and kvrouterd_worker_active_requests, by kind.", []string{"model", "worker", "dp_rank", "kind"}, nil)
	descMisconfig = prometheus.NewDesc("kvrouterd_worker_misconfigured", "1 while a worker's configuration is known to disagree with the router's for its model (reason block_size: its engine publishes blocks of another size; zero_hits: requests find other workers' cached blocks but never its own), so nothing it holds is matched.", []string{"model", "worker", "reason"}, nil)
	descUnmatched = prometheus.NewDesc("kvrouterd_worker_unmatched_requests", "Sampled requests that found other workers' cached blocks of the model and none of this worker's since its last hit, while it held many blocks.", []string{"model", "worker"}, nil)
	descRefused   = prometheus.NewDesc("kvrouterd_worker_events_refused_total", "A worker's events refused because its configuration disagrees with its model's (reason block_size).", []string{"model", "worker", "reason"}, nil)
)

// One unit per series: a worker rank's load, and the tokens routed (kvrouterd_worker_load, which
// mixes blocks, tokens and requests under a label, stays for dashboards until they move).
var (
	descWorkerCached  = prometheus.NewDesc("kvrouterd_worker_cached_blocks", "Blocks a worker rank holds in the index, on its device (the storage tiers below: kvrouterd_index_tier_residencies per model).", []string{"model", "worker", "dp_rank"}, nil)
	descWorkerBlocks  = prometheus.NewDesc("kvrouterd_worker_active_blocks", "Blocks of a worker rank's active requests, booked by routing decisions (decode load).", []string{"model", "worker", "dp_rank"}, nil)
	descWorkerPrefill = prometheus.NewDesc("kvrouterd_worker_active_prefill_tokens", "Prompt tokens a worker rank has to prefill for its active requests, not yet prefilled (prefill load).", []string{"model", "worker", "dp_rank"}, nil)
	descWorkerReqs    = prometheus.NewDesc("kvrouterd_worker_active_requests", "Requests routed to a worker rank and not completed yet.", []string{"model", "worker", "dp_rank"}, nil)
	descPromptTokens  = prometheus.NewDesc("kvrouterd_routed_prompt_tokens_total", "Prompt tokens of the requests routed (the HTTP API and the front door).", nil, nil)
	descModelPrompt   = prometheus.NewDesc("kvrouterd_model_prompt_tokens_total", "Prompt tokens of a model's routed requests.", []string{"model"}, nil)
	descAvailableHit  = prometheus.NewDesc("kvrouterd_model_available_hit_tokens_total", "Of a model's routed prompt tokens, those of the longest prefix of each request cached on any of the model's workers: the hit the best placement would have had.", []string{"model"}, nil)
	descAchievedHit   = prometheus.NewDesc("kvrouterd_model_achieved_hit_tokens_total", "Of a model's routed prompt tokens, those cached on the worker chosen (the prefill worker, for a disaggregated request): against kvrouterd_model_available_hit_tokens_total, what routing gave up for load.", []string{"model"}, nil)
	descCachedTokens  = prometheus.NewDesc("kvrouterd_routed_cached_tokens_total", "Prompt tokens of the requests routed that were cached on the device of the worker chosen (the prefill worker, for a disaggregated request): rate of this over rate of kvrouterd_routed_prompt_tokens_total is the hit rate.", nil, nil)
)

func (c *routerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEvents, descEventsBy, descBlocks, descGaps, descQueue, descWaits, descRequests, descActive, descPredicted, descRaised, descEntries, descResidency, descEvicted, descMaxBytes, descTierRes, descMembers, descWorker, descMisconfig, descRefused, descUnmatched,
		descWorkerCached, descWorkerBlocks, descWorkerPrefill, descWorkerReqs, descPromptTokens, descCachedTokens,
		descModelPrompt, descAvailableHit, descAchievedHit} {
		ch <- d
	}
}

func (c *routerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Stats()
	for s := shard.Status(0); int(s) < len(st.Events.ByStatus); s++ {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(st.Events.ByStatus[s]), s.String())
	}
	eachKindStatus(&st.Events, func(kind kvevent.Kind, s shard.Status, n int64) {
		ch <- prometheus.MustNewConstMetric(descEventsBy, prometheus.CounterValue, float64(n), kind.String(), s.String())
	})
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.CounterValue, float64(st.Events.StoredBlocks), "stored")
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.CounterValue, float64(st.Events.RemovedBlocks), "removed")
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.CounterValue, float64(st.Events.SkippedBlocks), "skipped")
	ch <- prometheus.MustNewConstMetric(descEvicted, prometheus.CounterValue, float64(st.Events.Evicted))
	ch <- prometheus.MustNewConstMetric(descMaxBytes, prometheus.GaugeValue, float64(c.r.MaxIndexBytes()))
	ch <- prometheus.MustNewConstMetric(descGaps, prometheus.CounterValue, float64(st.Events.Gaps), "gaps")
	ch <- prometheus.MustNewConstMetric(descGaps, prometheus.CounterValue, float64(st.Events.MissedIDs), "missed_ids")
	ch <- prometheus.MustNewConstMetric(descGaps, prometheus.CounterValue, float64(st.Events.GapClears), "ranks_cleared")
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(st.Events.QueueDepth))
	ch <- prometheus.MustNewConstMetric(descWaits, prometheus.CounterValue, float64(st.Events.EnqueueWaits))
	ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(st.Routed), "routed")
	ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(st.Matched), "matched")
	ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(st.Expired), "expired")
	ch <- prometheus.MustNewConstMetric(descPromptTokens, prometheus.CounterValue, float64(st.PromptTokens))
	ch <- prometheus.MustNewConstMetric(descCachedTokens, prometheus.CounterValue, float64(st.CachedTokens))
	for _, h := range c.r.ModelHits(nil) {
		ch <- prometheus.MustNewConstMetric(descModelPrompt, prometheus.CounterValue, float64(h.Prompt), h.Model)
		ch <- prometheus.MustNewConstMetric(descAvailableHit, prometheus.CounterValue, float64(h.Available), h.Model)
		ch <- prometheus.MustNewConstMetric(descAchievedHit, prometheus.CounterValue, float64(h.Achieved), h.Model)
	}
	ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(st.ActiveRequests))
	ch <- prometheus.MustNewConstMetric(descPredicted, prometheus.GaugeValue, float64(st.Predictions))
	ch <- prometheus.MustNewConstMetric(descRaised, prometheus.CounterValue, float64(st.PredictRaised))
	ch <- prometheus.MustNewConstMetric(descMembers, prometheus.CounterValue, float64(st.Discovered), "discovered")
	ch <- prometheus.MustNewConstMetric(descMembers, prometheus.CounterValue, float64(st.TimedOut), "timed_out")
	ch <- prometheus.MustNewConstMetric(descMembers, prometheus.CounterValue, float64(st.SnapshotSkipped), "snapshot_skipped")
	for _, m := range c.r.Models() {
		ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(m.Blocks), m.Name)
		ch <- prometheus.MustNewConstMetric(descResidency, prometheus.GaugeValue, float64(m.Residencies), m.Name)
		for t, n := range m.TierResidencies() {
			ch <- prometheus.MustNewConstMetric(descTierRes, prometheus.GaugeValue, float64(n), m.Name, kvevent.Tier(t).String())
		}
	}
	misconfigSent := map[uint64]bool{}
	for _, w := range c.r.Workers() {
		id, rank := strconv.FormatUint(w.ID, 10), strconv.FormatUint(uint64(w.Rank), 10)
		ch <- prometheus.MustNewConstMetric(descWorker, prometheus.GaugeValue, float64(w.CachedBlocks), w.Model, id, rank, "cached_blocks")
		ch <- prometheus.MustNewConstMetric(descWorker, prometheus.GaugeValue, float64(w.ActiveBlocks), w.Model, id, rank, "active_blocks")
		ch <- prometheus.MustNewConstMetric(descWorker, prometheus.GaugeValue, float64(w.ActivePrefill), w.Model, id, rank, "active_prefill_tokens")
		ch <- prometheus.MustNewConstMetric(descWorker, prometheus.GaugeValue, float64(w.ActiveRequests), w.Model, id, rank, "active_requests")
		ch <- prometheus.MustNewConstMetric(descWorkerCached, prometheus.GaugeValue, float64(w.CachedBlocks), w.Model, id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerBlocks, prometheus.GaugeValue, float64(w.ActiveBlocks), w.Model, id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerPrefill, prometheus.GaugeValue, float64(w.ActivePrefill), w.Model, id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerReqs, prometheus.GaugeValue, float64(w.ActiveRequests), w.Model, id, rank)
		if !misconfigSent[w.ID] { // once per worker: the block size is its model's, every rank's
			misconfigSent[w.ID] = true
			bad := 0.0
			if w.BlockSizeRefused > 0 {
				bad = 1
			}
			ch <- prometheus.MustNewConstMetric(descMisconfig, prometheus.GaugeValue, bad, w.Model, id, "block_size")
			ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(w.BlockSizeRefused), w.Model, id, "block_size")
			zero := 0.0
			if w.ZeroHits {
				zero = 1
			}
			ch <- prometheus.MustNewConstMetric(descMisconfig, prometheus.GaugeValue, zero, w.Model, id, "zero_hits")
			ch <- prometheus.MustNewConstMetric(descUnmatched, prometheus.GaugeValue, float64(w.Unmatched), w.Model, id)
		}
	}
}

// eachKindStatus calls f for each event type and outcome status: every status of the three
// kinds, so that a dashboard's series exist before the first event.
func eachKindStatus(st *shard.Stats, f func(kvevent.Kind, shard.Status, int64)) {
	for _, k := range [...]kvevent.Kind{kvevent.Stored, kvevent.Removed, kvevent.Cleared} {
		for s := range shard.NumStatus {
			f(k, shard.Status(s), st.ByKind[k][s])
		}
	}
}
