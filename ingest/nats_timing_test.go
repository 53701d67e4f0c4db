package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// ingestLoad is a steady stream of engine batches: per worker, a batch storing 32 chains of 16
// blocks (16 tokens each), then a batch removing them, and so on, so that every message does
// real work and the index stays the same size. Workers in groups of 8 share prompts.
type ingestLoad struct {
	workers  int
	payloads [][2][]byte // per worker: store, remove
	blocks   int         // per message
}

func newIngestLoad(workers int) *ingestLoad {
	const events, perEvent, bs = 32, 16, 16
	l := &ingestLoad{workers: workers, blocks: events * perEvent}
	for w := range workers {
		var store, remove wire.EngineBatch
		for e := range events {
			ev := kvevent.Event{Kind: kvevent.Stored, BlockSize: bs, Tokens: toks((w/8)*1_000_000+e*perEvent*bs, perEvent*bs)}
			for b := range perEvent {
				ev.Hashes = append(ev.Hashes, uint64(w)<<32|uint64(e*perEvent+b+1))
			}
			store.Events = append(store.Events, ev)
			remove.Events = append(remove.Events, kvevent.Event{Kind: kvevent.Removed, Hashes: ev.Hashes})
		}
		l.payloads = append(l.payloads, [2][]byte{
			wire.AppendEngineBatch(nil, &store, wire.EngineForm{}),
			wire.AppendEngineBatch(nil, &remove, wire.EngineForm{}),
		})
	}
	return l
}

// BenchmarkNATSIngest measures events published → applied through the embedded NATS server
// with JetStream on files, as the daemon runs it: one op is one engine batch of 512 blocks
// published over TCP by another connection, stored by JetStream, consumed, decoded, and
// applied to the index (stores and removals alternate). It reports applied blocks/s.
func BenchmarkNATSIngest(b *testing.B) {
	for _, memory := range []bool{false, true} {
		name := "storage=file"
		if memory {
			name = "storage=memory"
		}
		b.Run(name, func(b *testing.B) {
			s := embedded(b)
			r := router.New(router.Config{Logger: quietLog()})
			defer r.Close()
			ctx := context.Background()
			cons, err := NewConsumer(ctx, connect(b, s.ClientURL()), r, ConsumerConfig{Logger: quietLog(), Memory: memory})
			if err != nil {
				b.Fatal(err)
			}
			defer cons.Close()
			pub, err := NewPublisher(connect(b, s.ClientURL()), "")
			if err != nil {
				b.Fatal(err)
			}
			l := newIngestLoad(64)
			var bytes int64
			for _, p := range l.payloads {
				bytes += int64(len(p[0]) + len(p[1]))
			}
			b.SetBytes(bytes / int64(2*len(l.payloads)))
			base := cons.LastSeq()
			b.ResetTimer()
			start := time.Now()
			var sent int
			for i := range b.N {
				w := i % l.workers
				if _, err := pub.EngineAsync("m", uint64(w+1), 0, -1, l.payloads[w][(i/l.workers)%2]); err != nil {
					b.Fatal(err)
				}
				sent++
			}
			<-pub.PublishAsyncComplete()
			waitFor(b, "every batch", func() bool { return cons.LastSeq() >= base+uint64(sent) })
			if err := r.Flush(); err != nil {
				b.Fatal(err)
			}
			el := time.Since(start)
			b.StopTimer()
			if st := cons.Stats(); st.Rejected[RejectInvalid]+st.Rejected[RejectDecode] != 0 {
				b.Fatalf("rejections: %v", st.Rejected)
			}
			b.ReportMetric(float64(sent*l.blocks)/el.Seconds(), "blocks/s")
		})
	}
}

// BenchmarkConsumerCloseServerGone measures Close of a consumer whose NATS server has gone away
// (a daemon stopped while NATS is unreachable): it does not wait for the server.
func BenchmarkConsumerCloseServerGone(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		ns := embedded(b)
		r := router.New(router.Config{Shards: 1, Logger: quietLog()})
		nc := connect(b, ns.ClientURL())
		c, err := NewConsumer(context.Background(), nc, r, ConsumerConfig{Logger: quietLog()})
		if err != nil {
			b.Fatal(err)
		}
		ns.Shutdown()
		for nc.IsConnected() {
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
		c.Close()
		b.StopTimer()
		r.Close()
		b.StartTimer()
	}
}
