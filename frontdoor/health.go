package frontdoor

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus"
)

// The workers' health, the front door's part of the router's outlier ejection (router/eject.go):
// the Door reports each worker's failures and answers to the Router (UpstreamFailed,
// UpstreamOK), which takes a (worker, rank) that keeps failing out of routing for a backoff;
// the prober here brings it back. One goroutine, every probeInterval, asks the Router for the
// ejected ranks whose backoff is over (DueProbes) and GETs each one's worker's
// <http_endpoint>/health (vLLM and SGLang answer 200 when the engine is up), one request per
// worker whatever its ranks, with a timeout of probeTimeout: 200 puts the ranks back in routing
// (ProbeOK; they lose ties until they answer a request), anything else ejects them again for
// longer (ProbeFailed). While the prober runs, an ejected rank waits for its probe's verdict,
// or probeGrace past its backoff at the most (Router.SetProber).

const (
	probeInterval = 500 * time.Millisecond
	probeTimeout  = 2 * time.Second
	// probeGrace: a tick to notice a rank is due, the probe's timeout, and a margin.
	probeGrace = probeInterval + probeTimeout + time.Second
)

// prober is a Door's health prober: started by New, stopped by Close. Its fields are set
// before its goroutine starts and not written after, but for the metrics, which are atomic.
type prober struct {
	client *http.Client
	ctx    context.Context // cancelled by Close: a probe in flight ends at once
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	probes *prometheus.CounterVec // by result: ok, failed
}

// startHealth starts the prober and registers the health metrics; Close stops it.
func (d *Door) startHealth() {
	p := &d.probe
	p.client = &http.Client{
		// A fresh connection for each probe: a probe proves the worker takes connections, and
		// probes are rare (ejected ranks only).
		Transport: &http.Transport{DisableKeepAlives: true, ResponseHeaderTimeout: probeTimeout},
		Timeout:   probeTimeout,
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.done = make(chan struct{})
	p.probes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_health_probes_total",
		Help: "Health probes (GET <http_endpoint>/health) of workers with ejected ranks whose backoff was over, by result: ok (back in routing) or failed (ejected again, for longer)."},
		[]string{"result"})
	d.cfg.Registry.MustRegister(p.probes, &healthMetrics{r: d.r})
	d.r.SetProber(probeGrace)
	go d.probeLoop()
}

// Close stops the Door's background work and closes its idle connections to the workers.
// The Door must not serve after it. Safe to call more than once.
func (d *Door) Close() {
	p := &d.probe
	p.once.Do(func() {
		p.cancel()
		<-p.done
		d.r.SetProber(0)
		d.eng.closeIdle()
	})
}

// probeLoop probes the due ranks every probeInterval until Close.
func (d *Door) probeLoop() {
	p := &d.probe
	defer close(p.done)
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	var due []router.EjectedRank
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		due = d.r.DueProbes(due[:0])
		if len(due) > 0 {
			d.probeDue(due)
		}
	}
}

// probeDue probes the workers of due (sorted by worker), each once, at the same time, and
// reports each rank's verdict.
func (d *Door) probeDue(due []router.EjectedRank) {
	var wg sync.WaitGroup
	for len(due) > 0 {
		n := 1
		for n < len(due) && due[n].Worker == due[0].Worker {
			n++
		}
		ranks := due[:n]
		due = due[n:]
		wg.Go(func() {
			err := d.checkHealth(ranks[0].Endpoint)
			if d.probe.ctx.Err() != nil {
				return // closing: no verdict
			}
			if err != nil {
				d.probe.probes.WithLabelValues("failed").Inc()
				d.log.Info("front door: health probe failed; the worker stays out of routing",
					"worker", ranks[0].Worker, "model", ranks[0].Model, "endpoint", ranks[0].Endpoint, "err", err)
			} else {
				d.probe.probes.WithLabelValues("ok").Inc()
			}
			for _, k := range ranks {
				if err != nil {
					d.r.ProbeFailed(k.Worker, k.Rank)
				} else {
					d.r.ProbeOK(k.Worker, k.Rank)
				}
			}
		})
	}
	wg.Wait()
}

// errProbeStatus is a health probe's answer other than 200.
type errProbeStatus int

func (e errProbeStatus) Error() string { return "/health answered " + strconv.Itoa(int(e)) }

// checkHealth GETs endpoint's /health: nil when it answers 200.
func (d *Door) checkHealth(endpoint string) error {
	req, err := http.NewRequestWithContext(d.probe.ctx, http.MethodGet, strings.TrimRight(endpoint, "/")+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := d.probe.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errProbeStatus(resp.StatusCode)
	}
	return nil
}

// healthMetrics exports the router's outlier ejection state at each scrape. Safe for
// concurrent use.
type healthMetrics struct{ r *router.Router }

var (
	descEjectedRank = prometheus.NewDesc("kvrouterd_worker_ejected",
		"1 for each worker rank out of routing now after failing the front door's requests (outlier ejection); ranks in routing have no series.",
		[]string{"model", "worker", "dp_rank"}, nil)
	descEjectedNow = prometheus.NewDesc("kvrouterd_workers_ejected",
		"Worker ranks out of routing now after failing the front door's requests (outlier ejection).", nil, nil)
	descEjections = prometheus.NewDesc("kvrouterd_worker_ejections_total",
		"Worker ranks taken out of routing, by the reason of the failure that did it: connect, reset, 5xx, tokenize, timeout, probe (a failed health probe, ejected again), other.",
		[]string{"reason"}, nil)
	descFailures = prometheus.NewDesc("kvrouterd_worker_failures_total",
		"Failures of worker ranks reported to the outlier ejection, by reason (as kvrouterd_worker_ejections_total).",
		[]string{"reason"}, nil)
	descRefused = prometheus.NewDesc("kvrouterd_worker_ejections_refused_total",
		"Ejections not made because the model had its most ranks out already (max ejection percent).", nil, nil)
	descPanics = prometheus.NewDesc("kvrouterd_route_panic_total",
		"Requests routed among ejected worker ranks because every candidate was ejected (panic mode).", nil, nil)
)

func (h *healthMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEjectedRank, descEjectedNow, descEjections, descFailures, descRefused, descPanics} {
		ch <- d
	}
}

func (h *healthMetrics) Collect(ch chan<- prometheus.Metric) {
	st := h.r.HealthStats()
	for i, reason := range router.FailureReasons {
		ch <- prometheus.MustNewConstMetric(descEjections, prometheus.CounterValue, float64(st.Ejections[i]), reason)
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(st.Failures[i]), reason)
	}
	ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(st.Refused))
	ch <- prometheus.MustNewConstMetric(descPanics, prometheus.CounterValue, float64(st.Panics))
	out := h.r.OutRanks(nil)
	ch <- prometheus.MustNewConstMetric(descEjectedNow, prometheus.GaugeValue, float64(len(out)))
	for _, k := range out {
		ch <- prometheus.MustNewConstMetric(descEjectedRank, prometheus.GaugeValue, 1,
			k.Model, strconv.FormatUint(k.Worker, 10), strconv.FormatUint(uint64(k.Rank), 10))
	}
}
