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
	descQClass    = prometheus.NewDesc("kvrouterd_router_queue_policy_class_requests_total", "Requests of a policy class by outcome: queued (waited), limited (refused at a class limit, 529), expired (waited past the class's slo_ms, 529).", []string{"model", "policy_class", "outcome"}, nil)
	descDynExpire = prometheus.NewDesc("dynamo_frontend_router_queue_deadline_expired_total", "Requests refused past their policy class's deadline (Dynamo's counter; kvrouterd sheds at the dispatch stage only).", []string{"policy_class", "stage"}, nil)
	descDynQueue  = prometheus.NewDesc("dynamo_frontend_router_queue_pending_requests", "Requests pending in the router queue (Dynamo's gauge; aggregated workers are its decode workers).", []string{"model", "worker_type", "policy_class"}, nil)
)

var priorityClasses = [2]string{"normal", "high"}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQPending, descQRequests, descQWait, descDynQueue, descAffSess, descAffReqs, descQClass, descDynExpire} {
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
	expired := map[string]int64{} // Dynamo's counter has no model label: summed over models
	var order []string
	defer func() {
		for _, class := range order {
			ch <- prometheus.MustNewConstMetric(descDynExpire, prometheus.CounterValue, float64(expired[class]), class, "dispatch")
		}
	}()
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
		if q.Classes == nil {
			ch <- prometheus.MustNewConstMetric(descDynQueue, prometheus.GaugeValue, float64(q.Pending[0]+q.Pending[1]), q.Model, "decode", "default")
		}
		for _, cl := range q.Classes {
			ch <- prometheus.MustNewConstMetric(descDynQueue, prometheus.GaugeValue, float64(cl.Pending), q.Model, "decode", cl.Name)
			for _, o := range []struct {
				name string
				n    int64
			}{{"queued", cl.Queued}, {"limited", cl.Limited}, {"expired", cl.Expired}} {
				ch <- prometheus.MustNewConstMetric(descQClass, prometheus.CounterValue, float64(o.n), q.Model, cl.Name, o.name)
			}
			if _, ok := expired[cl.Name]; !ok {
				order = append(order, cl.Name)
			}
			expired[cl.Name] += cl.Expired
		}
	}
}
