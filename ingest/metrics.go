package ingest

import "github.com/prometheus/client_golang/prometheus"

var (
	descMessages = prometheus.NewDesc("kvrouterd_stream_messages_total", "Event stream messages handled.", nil, nil)
	descEvents   = prometheus.NewDesc("kvrouterd_stream_events_total", "Events from the stream handed to the index.", nil, nil)
	descRejected = prometheus.NewDesc("kvrouterd_stream_rejected_total", "Stream messages and load reports refused, by reason.", []string{"reason"}, nil)
	descLastSeq  = prometheus.NewDesc("kvrouterd_stream_last_sequence", "The last stream sequence handed to the index.", nil, nil)
	descGaps     = prometheus.NewDesc("kvrouterd_stream_gap_sequences_total", "Stream sequences lost to retention before they were read.", nil, nil)
	descConn     = prometheus.NewDesc("kvrouterd_stream_connected", "1 while connected to NATS with the stream there as configured (the stream readiness check passes).", nil, nil)
	descRecreate = prometheus.NewDesc("kvrouterd_stream_recreated_total", "Times the event stream was found deleted and created again.", nil, nil)
	descRestored = prometheus.NewDesc("kvrouterd_stream_config_restored_total", "Times the event stream's subjects, retention, storage or seal were found changed and set back.", nil, nil)
	descRestarts = prometheus.NewDesc("kvrouterd_stream_consumer_restarts_total",
		"Times the event stream's consumer read nothing while the stream held later events, and a new one was started after the last sequence read.", nil, nil)
	descReports = prometheus.NewDesc("kvrouterd_load_reports_total", "Worker load reports recorded.", nil, nil)
	descChanges = prometheus.NewDesc("kvrouterd_stream_changes_total",
		"Changes asked for over HTTP (registrations, their removal, event batches) applied from the event stream, from any replica.", nil, nil)
	descMedium = prometheus.NewDesc("kvrouterd_stream_unknown_medium_total",
		"Engine events from the stream whose storage medium kvrouterd does not know, applied as the device tier.", nil, nil)
)

// Collector returns the consumer's metrics, read at scrape time.
func (c *Consumer) Collector() prometheus.Collector { return consumerCollector{c} }

type consumerCollector struct{ c *Consumer }

func (cc consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(cc, ch)
}

func (cc consumerCollector) Collect(ch chan<- prometheus.Metric) {
	st := cc.c.Stats()
	ch <- prometheus.MustNewConstMetric(descMessages, prometheus.CounterValue, float64(st.Messages))
	ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(st.Events))
	for _, r := range rejectReasons {
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(st.Rejected[r]), r)
	}
	ch <- prometheus.MustNewConstMetric(descLastSeq, prometheus.GaugeValue, float64(st.LastSeq))
	ch <- prometheus.MustNewConstMetric(descGaps, prometheus.CounterValue, float64(st.Gaps))
	conn := 0.0
	if st.Connected {
		conn = 1
	}
	ch <- prometheus.MustNewConstMetric(descConn, prometheus.GaugeValue, conn)
	ch <- prometheus.MustNewConstMetric(descRecreate, prometheus.CounterValue, float64(st.Recreated))
	ch <- prometheus.MustNewConstMetric(descRestored, prometheus.CounterValue, float64(st.Restored))
	ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(st.Restarts))
	ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(st.Reports))
	ch <- prometheus.MustNewConstMetric(descMedium, prometheus.CounterValue, float64(st.UnknownMedium))
	ch <- prometheus.MustNewConstMetric(descChanges, prometheus.CounterValue, float64(st.Changes))
}
