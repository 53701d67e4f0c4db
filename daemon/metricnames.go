package daemon

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// named is a counter or gauge without labels and its name after the namespace.
type named struct {
	m    prometheus.Metric
	name string
}

// formerNames re-exports metrics under the names they had before every metric took the
// kvrouterd_ prefix (kvr_ + name), marked deprecated in their help: they stay for one release so
// that dashboards can move. Safe for concurrent use.
func formerNames(ms ...named) prometheus.Collector {
	f := &formerMetrics{ms: ms}
	for _, m := range ms {
		f.descs = append(f.descs, prometheus.NewDesc("kvr_"+m.name, "Deprecated: the same as kvrouterd_"+m.name+", which replaces it.", nil, nil))
	}
	return f
}

type formerMetrics struct {
	ms    []named
	descs []*prometheus.Desc
}

func (f *formerMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range f.descs {
		ch <- d
	}
}

func (f *formerMetrics) Collect(ch chan<- prometheus.Metric) {
	for i, m := range f.ms {
		var v dto.Metric
		if m.m.Write(&v) != nil {
			continue
		}
		if c := v.GetCounter(); c != nil {
			ch <- prometheus.MustNewConstMetric(f.descs[i], prometheus.CounterValue, c.GetValue())
		} else if g := v.GetGauge(); g != nil {
			ch <- prometheus.MustNewConstMetric(f.descs[i], prometheus.GaugeValue, g.GetValue())
		}
	}
}
