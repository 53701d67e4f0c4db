package ingest

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	zmqLabels      = []string{"model", "worker", "dp_rank"}
	descZMQConn    = prometheus.NewDesc("kvrouterd_zmq_connected", "1 while the rank's engine KV-event socket is connected.", zmqLabels, nil)
	descZMQMsgs    = prometheus.NewDesc("kvrouterd_zmq_messages_total", "Live messages received from the rank's engine socket.", zmqLabels, nil)
	descZMQBatches = prometheus.NewDesc("kvrouterd_zmq_batches_total", "Engine batches handed to the index, replayed ones included.", zmqLabels, nil)
	descZMQDropped = prometheus.NewDesc("kvrouterd_zmq_dropped_total",
		"Engine messages dropped, by reason: decode (malformed), undelivered (refused by the index), duplicate.",
		append(zmqLabels, "reason"), nil)
	descZMQRefused = prometheus.NewDesc("kvrouterd_zmq_refused_connections_total",
		"Engine connections kvrouterd dropped, by reason: oversized (a message over --zmq-max-message-bytes), stalled (silent mid-message or mid-handshake past --zmq-stall-timeout), protocol (broken ZMTP framing), panic (recovered).",
		append(zmqLabels, "reason"), nil)
	descZMQDisc = prometheus.NewDesc("kvrouterd_zmq_disconnects_total", "Engine connections lost for any reason, each followed by a redial.", zmqLabels, nil)
	descZMQGaps = prometheus.NewDesc("kvrouterd_zmq_gaps_total",
		"Missed engine batches, by outcome: recovered from the replay socket, or lost for good and the rank's blocks cleared, or kept (--clear-on-gap=false).",
		append(zmqLabels, "outcome"), nil)
	descZMQRestarts = prometheus.NewDesc("kvrouterd_zmq_restarts_total", "Engine restarts seen (the batch sequence went back).", zmqLabels, nil)
	descZMQLastSeq  = prometheus.NewDesc("kvrouterd_zmq_last_sequence", "Sequence of the last engine batch handed on.", zmqLabels, nil)
	descEngMedium   = prometheus.NewDesc("kvrouterd_engine_unknown_medium_total",
		"Engine events whose storage medium kvrouterd does not know, applied as the device tier.", zmqLabels, nil)
	// Dynamo's standalone indexer's name for the engine batches its ZMQ listeners could not
	// decode, over every subscription; its only reason, decode_error, is always exported.
	descDynDropped = prometheus.NewDesc("dynamo_kvindexer_dropped_batches_total",
		"Dynamo's name (standalone indexer): engine batches dropped before indexing, by reason (decode_error: malformed).", []string{"reason"}, nil)
)

// Collector returns the subscriptions' metrics per worker and data-parallel rank, read at
// scrape time.
func (e *Engines) Collector() prometheus.Collector { return enginesCollector{e} }

type enginesCollector struct{ e *Engines }

func (enginesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range [...]*prometheus.Desc{descZMQConn, descZMQMsgs, descZMQBatches, descZMQDropped, descZMQRefused,
		descZMQDisc, descZMQGaps, descZMQRestarts, descZMQLastSeq, descEngMedium, descDynDropped} {
		ch <- d
	}
	describeHealth(ch)
}

func (ec enginesCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	var undecoded int64
	for src, st := range ec.e.sources() {
		worker := strconv.FormatUint(src.Worker, 10)
		for _, r := range st.Ranks {
			l := []string{src.Model, worker, strconv.FormatUint(uint64(r.Rank), 10)}
			c := &r.Counters
			counter := func(d *prometheus.Desc, v int64, extra ...string) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append(l, extra...)...)
			}
			connected := 0.0
			if r.Connected {
				connected = 1
			}
			ch <- prometheus.MustNewConstMetric(descZMQConn, prometheus.GaugeValue, connected, l...)
			ch <- prometheus.MustNewConstMetric(descZMQLastSeq, prometheus.GaugeValue, float64(r.LastSeq), l...)
			collectHealth(ch, l, &r, now)
			counter(descZMQMsgs, c.Messages)
			counter(descZMQBatches, c.Batches)
			counter(descZMQDropped, c.DecodeErrors, "decode")
			undecoded += c.DecodeErrors
			counter(descZMQDropped, c.Undelivered, "undelivered")
			counter(descZMQDropped, c.Duplicates, "duplicate")
			counter(descZMQRefused, c.Oversized, "oversized")
			counter(descZMQRefused, c.Stalled, "stalled")
			counter(descZMQRefused, c.ProtocolErrors, "protocol")
			counter(descZMQRefused, c.Panics, "panic")
			counter(descZMQDisc, c.Disconnects)
			counter(descZMQGaps, c.GapsRecovered, "recovered")
			counter(descZMQGaps, c.GapsUnrecovered-c.GapsKept, "cleared")
			counter(descZMQGaps, c.GapsKept, "kept")
			counter(descZMQRestarts, c.Restarts)
			counter(descEngMedium, c.UnknownMedium)
		}
	}
	ch <- prometheus.MustNewConstMetric(descDynDropped, prometheus.CounterValue, float64(undecoded), "decode_error")
}
