package ingest

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// startJetStream runs an in-process NATS server with JetStream in a temporary directory and
// returns a connection to it, with the event stream created.
func startJetStream(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: DefaultStream, Subjects: []string{DefaultPrefix + ".events.>"}}); err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// TestBridge runs a fake two-rank engine through a Bridge into JetStream and reads the stream
// back: payloads unchanged and in order, the rank and sequence headers, a gap filled from the
// replay socket, and the clearing batch before the first payload after a restart.
func TestBridge(t *testing.T) {
	nc, js := startJetStream(t)
	pub, err := NewPublisher(nc, DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	const model, worker = "meta-llama/Llama-3.1-8B", 12
	eng := enginetest.Start(t, enginetest.Options{Ranks: 2, Replay: true, Topic: "kv"})
	br, err := NewBridge(source(t, eng, worker, model), pub, EngineConfig{Logger: zmqTestLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- br.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Error(err)
		}
	}()
	r0, r1 := eng.Rank(0), eng.Rank(1)
	waitCaughtUp(t, br.s)
	r0.Probe(func() bool { return br.Stats().Ranks[0].Counters.Messages > 0 })
	r1.Probe(func() bool { return br.Stats().Ranks[1].Counters.Messages > 0 })
	eventually(t, "the probes stored", func() bool { return br.Stats().Batches >= 2 })

	// What the stream should hold after the probes, in order: a payload with its rank and
	// engine sequence, or a clear (nil payload) of a rank.
	type entry struct {
		payload []byte
		rank    int
		seq     uint64
	}
	var want []entry
	handed := int64(2) // the probes
	wait := func() {
		t.Helper()
		eventually(t, "batches stored", func() bool { return br.Stats().Batches >= handed })
	}
	payloadOf := func(r *enginetest.Rank, seq uint64) []byte {
		p, ok := r.Payload(seq)
		if !ok {
			t.Fatalf("rank %d has no batch %d", r.DPRank(), seq)
		}
		return p
	}
	step := func(r *enginetest.Rank, b *wire.EngineBatch) {
		t.Helper()
		seq := r.Publish(b, wire.EngineForm{})
		want = append(want, entry{payloadOf(r, seq), r.DPRank(), seq})
		handed++
		wait()
	}
	step(r0, engineBatch(-1, stored(0, 1, 2)))
	step(r1, engineBatch(1, stored(0, 3)))

	// Rank 0 loses batch 2; batch 3 brings it back from replay port + 0.
	lost := r0.Drop(engineBatch(-1, stored(2, 4)), wire.EngineForm{})
	want = append(want, entry{payloadOf(r0, lost), 0, lost})
	handed++
	step(r0, engineBatch(-1, removed(4)))

	// Rank 1 restarts: a clear of the worker, then its new batches.
	r1.ResetSeq()
	want = append(want, entry{nil, 1, 0})
	step(r1, engineBatch(-1, stored(0, 5)))
	step(r1, engineBatch(-1, stored(5, 6)))

	st := br.Stats()
	checkStats(t, st, map[string]int64{"gaps": 1, "recovered": 1, "replayed": 1, "restarts": 1, "clears": 1, "undelivered": 0, "events": 0})

	cons, err := js.OrderedConsumer(ctx, DefaultStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	subject := EventSubject(DefaultPrefix, model, worker)
	probes := 0
	for i := 0; i < len(want)+2; i++ {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Subject() != subject {
			t.Errorf("message %d on %q, want %q", i, m.Subject(), subject)
		}
		if i < 2 { // the probes of rank 0 and 1, in either order
			probes++
			continue
		}
		w := want[i-2]
		if w.payload == nil {
			var eb wire.EventBatch
			if err := wire.DecodeEventBatch(m.Data(), &eb); err != nil {
				t.Fatalf("message %d: not a kvrouterd batch: %v", i, err)
			}
			if eb.Worker != worker || eb.Model != model || len(eb.Events) != 1 || eb.Events[0].Kind != kvevent.Cleared || eb.Events[0].Rank != uint32(w.rank) {
				t.Errorf("message %d: %+v, want a clear of rank %d", i, eb, w.rank)
			}
			continue
		}
		if !bytes.Equal(m.Data(), w.payload) {
			t.Errorf("message %d: payload differs from what the engine published", i)
		}
		h := m.Headers()
		if got := h.Get(HeaderRank); got != strconv.Itoa(w.rank) {
			t.Errorf("message %d: %s %q, want %d", i, HeaderRank, got, w.rank)
		}
		if got := h.Get(HeaderEngineSeq); got != strconv.FormatUint(w.seq, 10) {
			t.Errorf("message %d: %s %q, want %d", i, HeaderEngineSeq, got, w.seq)
		}
	}
	if probes != 2 {
		t.Errorf("%d probes", probes)
	}
}

// TestBridgeInvalid: a Bridge needs a valid source and a publisher.
func TestBridgeInvalid(t *testing.T) {
	if _, err := NewBridge(EngineSource{Worker: 1, Model: "m", Endpoint: "tcp://h:1", Ranks: 1}, nil, EngineConfig{}); err == nil {
		t.Error("no error without a publisher")
	}
	if err := RunBridge(context.Background(), EngineSource{Model: "m", Ranks: 1}, &Publisher{}, nil); err == nil {
		t.Error("no error without an endpoint")
	}
}

// TestBridgeGapPolicy: a rank without a replay socket loses a batch. KeepOnGap false publishes
// a clear of the rank before the payload that revealed the gap; KeepOnGap true, as Dynamo
// does, forwards the payload alone, so the stream's consumers keep the rank's blocks.
func TestBridgeGapPolicy(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run("keepOnGap="+strconv.FormatBool(keep), func(t *testing.T) {
			nc, js := startJetStream(t)
			pub, err := NewPublisher(nc, DefaultPrefix)
			if err != nil {
				t.Fatal(err)
			}
			eng := enginetest.Start(t, enginetest.Options{})
			br, err := NewBridge(source(t, eng, 5, "m"), pub, EngineConfig{Logger: zmqTestLog(), KeepOnGap: keep})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- br.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-ran; err != nil {
					t.Error(err)
				}
			}()
			r := eng.Rank(0)
			r.Probe(func() bool { return br.Stats().Ranks[0].Counters.Messages > 0 })
			r.Drop(engineBatch(-1, stored(0, 1)), wire.EngineForm{})
			last := r.Publish(engineBatch(-1, stored(0, 2)), wire.EngineForm{})
			eventually(t, "the batch after the gap", func() bool { return br.Stats().Ranks[0].LastSeq == last })

			clears := int64(1)
			if keep {
				clears = 0
			}
			checkStats(t, br.Stats(), map[string]int64{"gaps": 1, "unrecovered": 1, "kept": 1 - clears, "clears": clears})
			cons, err := js.OrderedConsumer(ctx, DefaultStream, jetstream.OrderedConsumerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string // the stream after the probe: "clear" or the payload's engine sequence
			for range 2 + clears {
				m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if seq := m.Headers().Get(HeaderEngineSeq); seq != "" {
					got = append(got, seq)
					continue
				}
				var eb wire.EventBatch
				if err := wire.DecodeEventBatch(m.Data(), &eb); err != nil || len(eb.Events) != 1 || eb.Events[0].Kind != kvevent.Cleared {
					t.Fatalf("not an engine payload nor a clear: %+v %v", eb, err)
				}
				got = append(got, "clear")
			}
			want := []string{"clear", strconv.FormatUint(last, 10)}
			if keep {
				want = want[1:]
			}
			if got = got[1:]; !slices.Equal(got, want) {
				t.Errorf("the stream after the probe holds %v, want %v", got, want)
			}
		})
	}
}
