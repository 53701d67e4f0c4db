package ingest

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func toks(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

// embedded starts a NATS server with JetStream in a temporary directory, without
// authentication: the tests that use it are about what flows, auth_test.go about who may.
func embedded(t testing.TB) *server.Server {
	t.Helper()
	s, err := StartEmbedded(EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0", NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, ConnectOptions(quietLog())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// waitFor polls cond; it bounds how long a broken build hangs, it asserts no timing.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func cached(t testing.TB, r *router.Router, model string, tokens []uint32) map[uint64]uint32 {
	t.Helper()
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	if err := r.Match(&wire.RouteRequest{Model: model, Tokens: tokens}, &resp); err != nil {
		t.Fatal(err)
	}
	out := map[uint64]uint32{}
	for _, c := range resp.Candidates {
		out[c.Worker<<8|uint64(c.Rank)] += c.CachedBlocks
	}
	return out
}

// TestEmbeddedStream publishes from a separate client connection, over TCP, both payload
// formats and a load report, and checks that they reach the index; then bad messages, which are
// counted and change nothing.
func TestEmbeddedStream(t *testing.T) {
	r := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer r.Close()
	ctx := context.Background()
	cons, pub := consumerAndPublisher(t, r)
	const model = "meta-llama/Llama-3.1-8B"

	// Worker 1: kvrouterd's binary batch, numbered events, block size 4.
	b := &wire.EventBatch{Worker: 1, Model: model, Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, BlockSize: 4, Hashes: []uint64{101, 102}, Tokens: toks(0, 8)},
	}}
	if _, err := pub.Batch(ctx, b); err != nil {
		t.Fatal(err)
	}
	// Worker 2: an engine's msgpack batch, rank from the header, hashes as negative int64.
	eb := wire.EngineBatch{TS: 1.5, Events: []kvevent.Event{
		{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{1 << 63, 1<<63 + 1, 1<<63 + 2}, Tokens: toks(0, 12)},
	}}
	payload := wire.AppendEngineBatch(nil, &eb, wire.EngineForm{Hashes: wire.HashInt64})
	seq, err := pub.Engine(ctx, model, 2, 1, 17, payload)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both batches", func() bool { return cons.LastSeq() == seq })
	got := cached(t, r, model, toks(0, 12))
	if len(got) != 2 || got[1<<8] != 2 || got[2<<8|1] != 3 {
		t.Fatalf("cached blocks by worker<<8|rank: %v; want worker 1 rank 0: 2, worker 2 rank 1: 3", got)
	}

	// A load report reaches the worker's listing.
	if err := pub.Report(&router.LoadReport{Worker: 2, Rank: 1, Model: model, ActiveBlocks: 40, KVUsage: 0.25}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the load report", func() bool { return cons.Stats().Reports == 1 })
	for _, w := range r.Workers() {
		if w.ID == 2 && (w.Report == nil || w.Report.ActiveBlocks != 40) {
			t.Fatalf("worker 2's listing: %+v", w)
		}
	}

	// Bad input: garbage, a batch whose worker is not its subject's, a batch the router refuses
	// (token count). Each is counted; the index is unchanged; later good batches still apply.
	js := pub.js
	if _, err := js.Publish(ctx, EventSubject("kvr", model, 1), []byte("KVRW garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, EventSubject("kvr", model, 3), wire.AppendEventBatch(nil, b)); err != nil {
		t.Fatal(err)
	}
	short := &wire.EventBatch{Worker: 1, Model: model, Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 2, Parent: 102, HasParent: true, Hashes: []uint64{103}, Tokens: toks(8, 3)},
	}}
	if _, err := pub.Batch(ctx, short); err != nil {
		t.Fatal(err)
	}
	good := &wire.EventBatch{Worker: 1, Model: model, Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 2, Parent: 102, HasParent: true, Hashes: []uint64{103}, Tokens: toks(8, 4)},
	}}
	if seq, err = pub.Batch(ctx, good); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bad batches and the good one", func() bool { return cons.LastSeq() == seq })
	st := cons.Stats()
	if st.Rejected[RejectDecode] != 1 || st.Rejected[RejectSubject] != 1 || st.Rejected[RejectInvalid] != 1 {
		t.Fatalf("rejections %v, want one each of decode, subject, invalid", st.Rejected)
	}
	got = cached(t, r, model, toks(0, 12))
	if got[1<<8] != 3 || got[2<<8|1] != 3 {
		t.Fatalf("cached blocks %v; want 3 on each worker", got)
	}
}

// TestConsumerStartSeq checks that a consumer started at a sequence applies exactly the events
// from there on, as a restarted replica resuming from its snapshot does.
func TestConsumerStartSeq(t *testing.T) {
	s := embedded(t)
	ctx := context.Background()
	pub, err := NewPublisher(connect(t, s.ClientURL()), "")
	if err != nil {
		t.Fatal(err)
	}
	// The stream must exist before publishing: a first consumer creates it.
	r0 := router.New(router.Config{Shards: 1, Logger: quietLog()})
	defer r0.Close()
	c0, err := NewConsumer(ctx, connect(t, s.ClientURL()), r0, ConsumerConfig{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	c0.Close()
	var seqs []uint64
	for i := range 4 {
		b := &wire.EventBatch{Worker: uint64(i + 1), Model: "m", Events: []kvevent.Event{
			{Kind: kvevent.Stored, ID: 1, BlockSize: 2, Hashes: []uint64{1}, Tokens: toks(0, 2)},
		}}
		seq, err := pub.Batch(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	r := router.New(router.Config{Shards: 1, Logger: quietLog()})
	defer r.Close()
	c, err := NewConsumer(ctx, connect(t, s.ClientURL()), r, ConsumerConfig{Logger: quietLog(), StartSeq: seqs[2]})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, "the last batch", func() bool { return c.LastSeq() == seqs[3] })
	got := cached(t, r, "m", toks(0, 2))
	if len(got) != 2 || got[3<<8] != 1 || got[4<<8] != 1 {
		t.Fatalf("cached %v, want workers 3 and 4 only", got)
	}
	if st := c.Stats(); st.Messages != 2 || st.Gaps != 0 {
		t.Fatalf("stats %+v, want 2 messages and no gap", st)
	}

	// A start past the stream's end (state saved from a stream that has since been recreated)
	// is a gap reported to OnGap, and the consumer reads the stream from its first message
	// instead of waiting for sequences it would reach only much later.
	r2 := router.New(router.Config{Shards: 1, Logger: quietLog()})
	defer r2.Close()
	var from, to uint64
	c2, err := NewConsumer(ctx, connect(t, s.ClientURL()), r2, ConsumerConfig{Logger: quietLog(), StartSeq: seqs[3] + 10,
		OnGap: func(f, l uint64) { from, to = f, l }})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if from != seqs[3]+1 || to != seqs[3]+9 {
		t.Fatalf("OnGap(%d, %d), want (%d, %d)", from, to, seqs[3]+1, seqs[3]+9)
	}
	waitFor(t, "the whole stream", func() bool { return c2.LastSeq() == seqs[3] })
	if got := cached(t, r2, "m", toks(0, 2)); len(got) != 4 {
		t.Fatalf("cached %v, want all 4 workers", got)
	}
}

// TestConsumerSinkPanic: a panic while applying a stream message or a load report is recovered
// on NATS's goroutine and counted as rejected for "panic"; the messages after it are applied.
func TestConsumerSinkPanic(t *testing.T) {
	sink := &panicStreamSink{}
	ctx := context.Background()
	cons, pub := consumerAndPublisher(t, sink)
	var (
		seq uint64
		err error
	)
	for w := uint64(1); w <= 2; w++ { // worker 1's batch panics
		b := &wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Cleared, ID: 1}}}
		if seq, err = pub.Batch(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	for w := uint64(1); w <= 2; w++ { // so does worker 1's report
		if err := pub.Report(&router.LoadReport{Worker: w, Model: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both batches", func() bool { return cons.LastSeq() == seq })
	waitFor(t, "both reports", func() bool { return cons.Stats().Rejected[RejectPanic] == 2 && sink.reports.Load() == 1 })
	if st := cons.Stats(); st.Events != 1 {
		t.Fatalf("%+v: want worker 2's one event applied", st)
	}
}

type panicStreamSink struct{ reports atomic.Int64 }

func (*panicStreamSink) Ingest(worker uint64, _ string, _ []kvevent.Event) error {
	if worker == 1 {
		panic("sink failure")
	}
	return nil
}

func (s *panicStreamSink) Report(r *router.LoadReport) error {
	if r.Worker == 1 {
		panic("sink failure")
	}
	s.reports.Add(1)
	return nil
}

// consumerAndPublisher starts an embedded server, a consumer of its stream feeding sink, and a
// publisher on another connection; all closed when the test ends.
func consumerAndPublisher(t *testing.T, sink Sink) (*Consumer, *Publisher) {
	t.Helper()
	s := embedded(t)
	cons, err := NewConsumer(context.Background(), connect(t, s.ClientURL()), sink, ConsumerConfig{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cons.Close)
	pub, err := NewPublisher(connect(t, s.ClientURL()), "")
	if err != nil {
		t.Fatal(err)
	}
	return cons, pub
}
