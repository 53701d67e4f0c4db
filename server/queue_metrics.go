package server

import (
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus"
)

// queueCollector reads the router queue's counters at scrape time (none without the queue).
type queueCollector struct{ r *router.Router }

var (
	descQPending  = prometheus.NewDesc("kvrouterd_router_queue_pending_requests", "Requests waiting in a model's router queue, by priority class (high: a strict priority or a priority jump).", []string{"model", "priority"}, nil)
	descQRequests = prometheus.NewDesc("kvrouterd_router_queue_requests_total", "Requests through a model's router queue by outcome: queued (waited), admitted (from the queue and routed), failed (admitted, then refused by the route: every worker overloaded, say), full (refused, 429), timed_out (waited past its longest wait, 503), gone (the client left).", []string{"model", "outcome"}, nil)
	descQWait     = prometheus.NewDesc("kvrouterd_router_queue_wait_seconds", "Time admitted requests waited in a model's router queue, by priority class.", []string{"model", "priority"}, nil)
	descAffSess   = prometheus.NewDesc("kvrouterd_session_affinity_sessions", "Sessions bound to a worker (session affinity), this replica's and the others'.", nil, nil)
	descAffReqs   = prometheus.NewDesc("kvrouterd_session_affinity_requests_total", "Requests with a session id by outcome: hit (sent to their session's worker), miss (no live binding), moved (their worker gone or, in soft mode, overloaded); and bindings received from other replicas (remote).", []string{"outcome"}, nil)
	descDynQueue  = prometheus.NewDesc("dynamo_frontend_router_queue_pending_requests", "Requests pending in the router queue (Dynamo's gauge; aggregated workers are its decode workers).", []string{"model", "worker_type", "policy_class"}, nil)
)

var priorityClasses = [2]string{"normal", "high"}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQPending, descQRequests, descQWait, descDynQueue, descAffSess, descAffReqs} {
		ch <- d
	}
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	if a, ok := c.r.AffinityStats(); ok {
		ch <- prometheus.MustNewConstMetric(descAffSess, prometheus.GaugeValue, float64(a.Sessions))
		for _, o := range []struct {
			name string
			n    int64
		}{{"hit", a.Hits}, {"miss", a.Misses}, {"moved", a.Moved}, {"remote", a.Remote}} {
			ch <- prometheus.MustNewConstMetric(descAffReqs, prometheus.CounterValue, float64(o.n), o.name)
		}
	}
	for _, q := range c.r.QueueStats(nil) {
		for i, class := range priorityClasses {
			ch <- prometheus.MustNewConstMetric(descQPending, prometheus.GaugeValue, float64(q.Pending[i]), q.Model, class)
			ch <- prometheus.MustNewConstSummary(descQWait, uint64(q.Waits[i]), q.WaitSeconds[i], nil, q.Model, class)
		}
		for _, o := range []struct {
			name string
			n    int64
		}{{"queued", q.Queued}, {"admitted", q.Admitted}, {"failed", q.Failed}, {"full", q.Full}, {"timed_out", q.TimedOut}, {"gone", q.Gone}} {
			ch <- prometheus.MustNewConstMetric(descQRequests, prometheus.CounterValue, float64(o.n), q.Model, o.name)
		}
		ch <- prometheus.MustNewConstMetric(descDynQueue, prometheus.GaugeValue, float64(q.Pending[0]+q.Pending[1]), q.Model, "decode", "default")
	}
}
