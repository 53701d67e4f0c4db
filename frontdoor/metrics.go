package frontdoor

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the front door's series: kvrouterd's, and Dynamo frontend's under its names
// (dynamo_frontend_*), so that a dashboard made for Dynamo reads the front door's.
type metrics struct {
	requests   *prometheus.CounterVec
	upstream   *prometheus.CounterVec
	ended      *prometheus.CounterVec
	disagg     *prometheus.CounterVec
	migrations prometheus.Counter

	// Per model, kvrouterd's names.
	ttft, itlH, duration, isl, osl *prometheus.HistogramVec
	predRatio                      *prometheus.HistogramVec

	// Dynamo frontend's.
	dynRequests     *prometheus.CounterVec // model, endpoint, request_type, status
	dynInflight     *prometheus.GaugeVec   // model
	dynDisconnected prometheus.Counter
	dynCancelled    *prometheus.CounterVec // model
	dynMigrations   *prometheus.CounterVec // model
	dynOutputTokens *prometheus.CounterVec // model
	dynTTFT         *prometheus.HistogramVec
	dynITL          *prometheus.HistogramVec
	dynDuration     *prometheus.HistogramVec
	dynISL          *prometheus.HistogramVec
	dynOSL          *prometheus.HistogramVec

	// models caches each model's series (*modelMetrics): a request's measurements take no
	// label lookups.
	models sync.Map

	// last holds each (worker, rank)'s last measured times, for Dynamo's per-worker gauges and
	// for the router's cost to learn from (Door.Measured).
	last     sync.Map // rankKey → *measured
	observed atomic.Uint64
	r        *router.Router
}

type rankKey struct {
	worker uint64
	rank   uint32
	typ    string // Dynamo's worker_type: decode (a whole request's worker too) or prefill
}

// Measured is what the front door last measured of one (worker, rank): the time to first
// token, the mean inter-token latency and the input length of its last answer, and smoothed
// times over its answers (exponentially weighted, α = 0.2). Read it with Door.Measured.
type Measured struct {
	LastTTFT, LastITL float64 // seconds
	LastISL           int
	MeanTTFT, MeanITL float64 // seconds, smoothed
	Answers           int64
}

// measured is a Measured under its lock.
type measured struct {
	mu sync.Mutex
	Measured
	hasMeanITL, hasMeanT bool
}

func secondsBuckets() []float64 {
	return []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
}

func tokenBuckets() []float64 { return prometheus.ExponentialBuckets(16, 2, 14) } // 16 … 131,072

func newMetrics(reg *prometheus.Registry, r *router.Router) *metrics {
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_requests_total",
			Help: "Front-door requests answered, by path and status (the worker's, once forwarded)."}, []string{"path", "code"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_upstream_errors_total",
			Help: "Workers that failed a front-door call before answering: tokenize, prefill (a disaggregated request's prefill stage), or forward (then given up for the request)."}, []string{"call"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_streams_total",
			Help: "Forwarded answers, by how they ended: done, client_gone, upstream_error (the worker's answer broke off or was cut short; the client was told), timeout (--frontend-timeout)."}, []string{"end"}),
		migrations: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_migrations_total",
			Help: "Requests sent to another worker after one failed before answering."}),
		disagg: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_disaggregated_total",
			Help: "Requests the router split into a prefill and a decode stage, by outcome: split (both ran), fallback (the prefill stage failed; the decode worker served it whole), client_gone (during the prefill stage)."}, []string{"outcome"}),
		ttft: hist("kvrouterd_frontdoor_time_to_first_token_seconds", "Time from a front-door request's arrival to its answer's first token, per model.",
			secondsBuckets(), "model"),
		itlH: hist("kvrouterd_frontdoor_inter_token_latency_seconds", "Time between an answer's consecutive token chunks, per model.",
			secondsBuckets(), "model"),
		duration: hist("kvrouterd_frontdoor_request_duration_seconds", "Time from a front-door request's arrival to its answer's end, per model.",
			secondsBuckets(), "model"),
		predRatio: hist("kvrouterd_frontdoor_ttft_prediction_ratio", "The router's predicted time to first token of a front-door request on the worker it chose, over the time measured from the routing decision to the first token, per model: 1 is exact, the median's distance from 1 the prediction's error.",
			[]float64{0.25, 0.5, 0.67, 0.8, 0.9, 1, 1.11, 1.25, 1.5, 2, 4}, "model"),
		isl: hist("kvrouterd_frontdoor_input_tokens", "Prompt tokens of the front door's answered requests, per model.", tokenBuckets(), "model"),
		osl: hist("kvrouterd_frontdoor_output_tokens", "Output tokens of the front door's answered requests, per model.", tokenBuckets(), "model"),

		dynRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynamo_frontend_requests_total",
			Help: "Requests of the front door (Dynamo frontend's counter): endpoint chat_completions or completions, request_type stream or unary, status success or error."},
			[]string{"model", "endpoint", "request_type", "status"}),
		dynInflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dynamo_frontend_inflight_requests",
			Help: "Front-door requests in flight (Dynamo frontend's gauge)."}, []string{"model"}),
		dynDisconnected: prometheus.NewCounter(prometheus.CounterOpts{Name: "dynamo_frontend_disconnected_clients",
			Help: "Clients that went away before their answer ended (Dynamo frontend's)."}),
		dynCancelled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynamo_frontend_model_cancellation_total",
			Help: "Requests cancelled as their client went away (Dynamo frontend's)."}, []string{"model"}),
		dynMigrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynamo_frontend_model_migration_total",
			Help: "Requests moved to another worker after one failed (Dynamo frontend's)."}, []string{"model"}),
		dynOutputTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynamo_frontend_output_tokens_total",
			Help: "Output tokens the front door relayed (Dynamo frontend's)."}, []string{"model"}),
		dynTTFT: hist("dynamo_frontend_time_to_first_token_seconds", "Time to first token (Dynamo frontend's histogram).", secondsBuckets(), "model"),
		dynITL:  hist("dynamo_frontend_inter_token_latency_seconds", "Inter-token latency (Dynamo frontend's histogram).", secondsBuckets(), "model"),
		dynDuration: hist("dynamo_frontend_request_duration_seconds", "Request duration (Dynamo frontend's histogram).",
			secondsBuckets(), "model"),
		dynISL: hist("dynamo_frontend_input_sequence_tokens", "Input sequence length (Dynamo frontend's histogram).", tokenBuckets(), "model"),
		dynOSL: hist("dynamo_frontend_output_sequence_tokens", "Output sequence length (Dynamo frontend's histogram).", tokenBuckets(), "model"),
	}
	m.r = r
	reg.MustRegister(m.requests, m.upstream, m.ended, m.migrations, m.disagg, m.ttft, m.itlH, m.duration, m.isl, m.osl, m.predRatio,
		m.dynRequests, m.dynInflight, m.dynDisconnected, m.dynCancelled, m.dynMigrations, m.dynOutputTokens,
		m.dynTTFT, m.dynITL, m.dynDuration, m.dynISL, m.dynOSL, workerGauges{m, r})
	return m
}

// modelMetrics are one model's series.
type modelMetrics struct {
	ttft, itl, duration, isl, osl                prometheus.Observer
	predRatio                                    prometheus.Observer
	dynTTFT, dynITL, dynDuration, dynISL, dynOSL prometheus.Observer
	inflight                                     prometheus.Gauge
	outputTokens, cancelled, migrations          prometheus.Counter
}

// model returns model's series.
func (m *metrics) model(name string) *modelMetrics {
	if v, ok := m.models.Load(name); ok {
		return v.(*modelMetrics)
	}
	mm := &modelMetrics{
		ttft: m.ttft.WithLabelValues(name), itl: m.itlH.WithLabelValues(name), duration: m.duration.WithLabelValues(name),
		isl: m.isl.WithLabelValues(name), osl: m.osl.WithLabelValues(name), predRatio: m.predRatio.WithLabelValues(name),
		dynTTFT: m.dynTTFT.WithLabelValues(name), dynITL: m.dynITL.WithLabelValues(name), dynDuration: m.dynDuration.WithLabelValues(name),
		dynISL: m.dynISL.WithLabelValues(name), dynOSL: m.dynOSL.WithLabelValues(name),
		inflight: m.dynInflight.WithLabelValues(name), outputTokens: m.dynOutputTokens.WithLabelValues(name),
		cancelled: m.dynCancelled.WithLabelValues(name), migrations: m.dynMigrations.WithLabelValues(name),
	}
	v, _ := m.models.LoadOrStore(name, mm)
	return v.(*modelMetrics)
}

// observe records a (worker, rank)'s answer: ttft and itl in seconds (itl < 0: none measured).
// Every 4,096th forgets the ranks no longer registered, as a scrape does, so that a fleet's
// churn leaves nothing behind where nobody scrapes.
func (m *metrics) observe(k rankKey, ttft, itl float64, isl int) {
	if m.observed.Add(1)%4096 == 0 {
		m.forget()
	}
	v, _ := m.last.Load(k)
	if v == nil {
		v, _ = m.last.LoadOrStore(k, &measured{})
	}
	x := v.(*measured)
	const alpha = 0.2
	x.mu.Lock()
	defer x.mu.Unlock()
	x.Answers++
	x.LastISL = isl
	if ttft >= 0 {
		x.LastTTFT = ttft
		if x.hasMeanT {
			x.MeanTTFT += alpha * (ttft - x.MeanTTFT)
		} else {
			x.MeanTTFT, x.hasMeanT = ttft, true
		}
	}
	if itl >= 0 {
		x.LastITL = itl
		if x.hasMeanITL {
			x.MeanITL += alpha * (itl - x.MeanITL)
		} else {
			x.MeanITL, x.hasMeanITL = itl, true
		}
	}
}

// Measured returns a copy of what the front door measured of worker's rank as a decode (or
// whole-request) worker; ok is false before its first answer. Safe for concurrent use.
func (d *Door) Measured(worker uint64, rank uint32) (m Measured, ok bool) {
	v, ok := d.m.last.Load(rankKey{worker, rank, "decode"})
	if !ok {
		return Measured{}, false
	}
	x := v.(*measured)
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.Measured, true
}

var (
	descLastTTFT = prometheus.NewDesc("dynamo_frontend_worker_last_time_to_first_token_seconds",
		"The last time to first token the front door measured of each worker's rank (Dynamo frontend's gauge).", []string{"worker_id", "dp_rank", "worker_type"}, nil)
	descLastITL = prometheus.NewDesc("dynamo_frontend_worker_last_inter_token_latency_seconds",
		"The last answer's mean inter-token latency of each worker's rank (Dynamo frontend's gauge).", []string{"worker_id", "dp_rank", "worker_type"}, nil)
	descLastISL = prometheus.NewDesc("dynamo_frontend_worker_last_input_sequence_tokens",
		"The last answered request's input tokens of each worker's rank (Dynamo frontend's gauge).", []string{"worker_id", "dp_rank", "worker_type"}, nil)
	descMeanTTFT = prometheus.NewDesc("kvrouterd_frontdoor_worker_time_to_first_token_seconds",
		"Each worker's rank's time to first token, smoothed over its answers (exponentially weighted, 0.2).", []string{"worker", "rank", "worker_type"}, nil)
	descMeanITL = prometheus.NewDesc("kvrouterd_frontdoor_worker_inter_token_latency_seconds",
		"Each worker's rank's inter-token latency, smoothed over its answers (exponentially weighted, 0.2).", []string{"worker", "rank", "worker_type"}, nil)
)

// workerGauges exports the per-(worker, rank) measurements, and forgets those of ranks no
// longer registered, so that a fleet's churn leaves no series behind.
type workerGauges struct {
	m *metrics
	r *router.Router
}

func (g workerGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLastTTFT
	ch <- descLastITL
	ch <- descLastISL
	ch <- descMeanTTFT
	ch <- descMeanITL
}

// forget drops the measurements of ranks no longer registered.
func (m *metrics) forget() {
	m.last.Range(func(k, _ any) bool {
		if key := k.(rankKey); !m.r.HasRank(key.worker, key.rank) {
			m.last.Delete(k)
		}
		return true
	})
}

func (g workerGauges) Collect(ch chan<- prometheus.Metric) {
	g.m.forget()
	g.m.last.Range(func(k, v any) bool {
		key := k.(rankKey)
		x := v.(*measured)
		x.mu.Lock()
		defer x.mu.Unlock()
		w, r := strconv.FormatUint(key.worker, 10), strconv.FormatUint(uint64(key.rank), 10)
		ch <- prometheus.MustNewConstMetric(descLastTTFT, prometheus.GaugeValue, x.LastTTFT, w, r, key.typ)
		ch <- prometheus.MustNewConstMetric(descLastISL, prometheus.GaugeValue, float64(x.LastISL), w, r, key.typ)
		ch <- prometheus.MustNewConstMetric(descMeanTTFT, prometheus.GaugeValue, x.MeanTTFT, w, r, key.typ)
		if x.hasMeanITL {
			ch <- prometheus.MustNewConstMetric(descLastITL, prometheus.GaugeValue, x.LastITL, w, r, key.typ)
			ch <- prometheus.MustNewConstMetric(descMeanITL, prometheus.GaugeValue, x.MeanITL, w, r, key.typ)
		}
		return true
	})
}
