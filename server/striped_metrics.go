package server

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/internal/striped"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/puzpuzpuz/xsync/v4"
)

// The metrics every request updates are striped, so that cores serving different requests
// write different cache lines: histograms by the request's connection (package
// internal/striped), counters by xsync.Counter's own choice. The collectors below export them
// under the names and buckets they had as Prometheus histograms and counters.

// histFamily is one Prometheus histogram family whose series are striped histograms: series i
// has label values labels[i] for desc's variable labels. Safe for concurrent use; Collect
// allocates, for the scrape.
type histFamily struct {
	desc   *prometheus.Desc
	series []*striped.Histogram
	labels [][]string
}

// newHistFamily returns a family of one series per entry of labels (one series of no labels if
// labels is nil), each over upper.
func newHistFamily(name, help string, upper []float64, variable []string, constant prometheus.Labels, labels [][]string) *histFamily {
	if labels == nil {
		labels = [][]string{nil}
	}
	f := &histFamily{desc: prometheus.NewDesc(name, help, variable, constant), labels: labels}
	for range labels {
		f.series = append(f.series, striped.NewHistogram(upper))
	}
	return f
}

func (f *histFamily) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }

func (f *histFamily) Collect(ch chan<- prometheus.Metric) {
	for i, h := range f.series {
		upper := h.Upper()
		counts := make([]uint64, len(upper)+1)
		n, sum := h.Read(counts)
		buckets := make(map[float64]uint64, len(upper))
		var cum uint64
		for b, u := range upper {
			cum += counts[b]
			buckets[u] = cum
		}
		ch <- prometheus.MustNewConstHistogram(f.desc, n, sum, buckets, f.labels[i]...)
	}
}

// requestCounts is kvrouterd_http_requests_total: the API's requests by endpoint and status
// code. A pair's counter is made on its first request (the only allocation); codes outside
// [minCode, maxCode] and requests refused before an endpoint was known ("any") are counted in a
// map under a lock. Safe for concurrent use.
type requestCounts struct {
	desc   *prometheus.Desc
	byCode [numEndpoints][maxCode - minCode + 1]atomic.Pointer[xsync.Counter]
	mu     sync.Mutex
	other  map[[2]string]uint64 // REQUIRES mu; (endpoint, code) → count
}

func newRequestCounts() *requestCounts {
	return &requestCounts{
		desc: prometheus.NewDesc("kvrouterd_http_requests_total",
			"HTTP API requests answered, by endpoint and status code (endpoint \"any\": refused before one was known, 413 and 431).",
			[]string{"endpoint", "code"}, nil),
		other: map[[2]string]uint64{},
	}
}

// count counts a request to ep answered with code.
func (q *requestCounts) count(ep endpoint, code int) {
	if code < minCode || code > maxCode {
		q.countOther(endpointNames[ep], code)
		return
	}
	slot := &q.byCode[ep][code-minCode]
	c := slot.Load()
	if c == nil {
		slot.CompareAndSwap(nil, xsync.NewCounter())
		c = slot.Load()
	}
	c.Inc()
}

// countOther counts a request off the hot path: to endpoint ep ("any" included), answered with
// code.
func (q *requestCounts) countOther(ep string, code int) {
	q.mu.Lock()
	q.other[[2]string{ep, strconv.Itoa(code)}]++
	q.mu.Unlock()
}

func (q *requestCounts) Describe(ch chan<- *prometheus.Desc) { ch <- q.desc }

func (q *requestCounts) Collect(ch chan<- prometheus.Metric) {
	for ep := range q.byCode {
		for i := range q.byCode[ep] {
			if c := q.byCode[ep][i].Load(); c != nil {
				ch <- prometheus.MustNewConstMetric(q.desc, prometheus.CounterValue, float64(c.Value()), endpointNames[ep], strconv.Itoa(minCode+i))
			}
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, n := range q.other {
		ch <- prometheus.MustNewConstMetric(q.desc, prometheus.CounterValue, float64(n), k[0], k[1])
	}
}
