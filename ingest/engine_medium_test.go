package ingest

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestEngineUnknownMedium: an engine event of a medium kvrouterd does not know reaches the sink
// as the device tier with the rest of its batch; it is counted per worker and rank, exported,
// and logged with the medium and the worker.
func TestEngineUnknownMedium(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{})
	sink := &recSink{}
	var logs syncbuf.Buffer
	es := NewEngines(context.Background(), sink, EngineConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	t.Cleanup(es.Close)
	if err := es.Add(source(t, eng, 5, "m")); err != nil {
		t.Fatal(err)
	}
	r := eng.Rank(0)
	r.Probe(func() bool {
		for _, st := range es.Stats() {
			return st.Messages > 0
		}
		return false
	})

	b := engineBatch(-1, stored(0, 11), removed(11), kvevent.Event{Kind: kvevent.Removed, Tier: kvevent.Host, Hashes: []uint64{12}})
	payload := enginetest.WithMedium(b, wire.EngineForm{}, "TPU")
	seq := r.Record(payload)
	r.Send(nil, enginetest.SeqFrame(seq), payload)
	waitEvents(t, sink, lines(0, b))

	for _, st := range es.Stats() {
		if st.UnknownMedium != 2 || st.Ranks[0].Counters.UnknownMedium != 2 || st.DecodeErrors != 0 {
			t.Errorf("unknown media %d (rank 0: %d), decode errors %d; want 2, 2, 0", st.UnknownMedium, st.Ranks[0].Counters.UnknownMedium, st.DecodeErrors)
		}
	}
	want := `
# HELP kvrouterd_engine_unknown_medium_total Engine events whose storage medium kvrouterd does not know, applied as the device tier.
# TYPE kvrouterd_engine_unknown_medium_total counter
kvrouterd_engine_unknown_medium_total{dp_rank="0",model="m",worker="5"} 2
`
	if err := testutil.CollectAndCompare(es.Collector(), strings.NewReader(want), "kvrouterd_engine_unknown_medium_total"); err != nil {
		t.Error(err)
	}
	if l := logs.String(); !strings.Contains(l, "unknown storage medium") || !strings.Contains(l, "medium=TPU") || !strings.Contains(l, "worker=5") {
		t.Errorf("log %q: want a warning naming the medium and the worker", l)
	}
}

// TestConsumerUnknownMedium: the same through the event stream, where a bridge puts engine
// batches as they are: applied as the device tier, counted, exported, logged.
func TestConsumerUnknownMedium(t *testing.T) {
	r := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer r.Close()
	s := embedded(t)
	var logs syncbuf.Buffer
	cons, err := NewConsumer(context.Background(), connect(t, s.ClientURL()), r,
		ConsumerConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cons.Close)
	pub, err := NewPublisher(connect(t, s.ClientURL()), "")
	if err != nil {
		t.Fatal(err)
	}

	eb := wire.EngineBatch{TS: 1.5, Events: []kvevent.Event{
		{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{1, 2}, Tokens: toks(0, 8)},
	}}
	seq, err := pub.Engine(context.Background(), "m", 2, 1, 17, enginetest.WithMedium(&eb, wire.EngineForm{}, "HBM"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the batch", func() bool { return cons.LastSeq() == seq })
	if got := cached(t, r, "m", toks(0, 8)); got[2<<8|1] != 2 {
		t.Fatalf("cached blocks by worker<<8|rank: %v; want worker 2 rank 1: 2, on the device", got)
	}
	if st := cons.Stats(); st.UnknownMedium != 1 || st.Rejected[RejectDecode] != 0 {
		t.Errorf("unknown media %d, decode rejections %d; want 1, 0", st.UnknownMedium, st.Rejected[RejectDecode])
	}
	want := `
# HELP kvrouterd_stream_unknown_medium_total Engine events from the stream whose storage medium kvrouterd does not know, applied as the device tier.
# TYPE kvrouterd_stream_unknown_medium_total counter
kvrouterd_stream_unknown_medium_total 1
`
	if err := testutil.CollectAndCompare(cons.Collector(), strings.NewReader(want), "kvrouterd_stream_unknown_medium_total"); err != nil {
		t.Error(err)
	}
	if l := logs.String(); !strings.Contains(l, "medium=HBM") || !strings.Contains(l, "worker=2") {
		t.Errorf("log %q: want a warning naming the medium and the worker", l)
	}
}

// TestEngineDroppedBatches: engine batches that cannot be decoded are counted under Dynamo's
// standalone indexer's name too, summed over the subscriptions, with a zero before the first.
func TestEngineDroppedBatches(t *testing.T) {
	want := func(n int) *strings.Reader {
		return strings.NewReader(`
# HELP dynamo_kvindexer_dropped_batches_total Dynamo's name (standalone indexer): engine batches dropped before indexing, by reason (decode_error: malformed).
# TYPE dynamo_kvindexer_dropped_batches_total counter
dynamo_kvindexer_dropped_batches_total{reason="decode_error"} ` + strconv.Itoa(n) + "\n")
	}
	es := NewEngines(context.Background(), &recSink{}, EngineConfig{Logger: zmqTestLog()})
	t.Cleanup(es.Close)
	if err := testutil.CollectAndCompare(es.Collector(), want(0), "dynamo_kvindexer_dropped_batches_total"); err != nil {
		t.Error(err)
	}
	var ranks []*enginetest.Rank
	for w := range 2 {
		eng := enginetest.Start(t, enginetest.Options{})
		if err := es.Add(source(t, eng, uint64(5+w), "m")); err != nil {
			t.Fatal(err)
		}
		r := eng.Rank(0)
		r.Probe(func() bool { return es.Stats()[source(t, eng, uint64(5+w), "m").String()].Messages > 0 })
		ranks = append(ranks, r)
	}
	for i, r := range ranks {
		for range i + 1 {
			seq := r.Record([]byte{0x93, 0xc1})
			r.Send(nil, enginetest.SeqFrame(seq), []byte{0x93, 0xc1})
		}
	}
	eventually(t, "three malformed batches counted", func() bool {
		n := int64(0)
		for _, st := range es.Stats() {
			n += st.DecodeErrors
		}
		return n == 3
	})
	if err := testutil.CollectAndCompare(es.Collector(), want(3), "dynamo_kvindexer_dropped_batches_total"); err != nil {
		t.Error(err)
	}
}
