package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/natstest"
	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/nats-io/nats.go"
)

// TestConsumerClusterFailover reads a stream replicated on a three-node NATS cluster while
// batches are published, and kills (SIGKILL) the node the consumer is connected to: the
// consumer must go on from the next sequence through the other nodes, and the router end with
// exactly the index of a reference handed every acknowledged batch. Before the Consumer
// restarted a stalled consumer (ReadStall), it stopped here in some runs (3 of the first 20):
// the client's ordered consumer, recreating itself after the reconnection, never delivered
// again.
func TestConsumerClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three nats-server processes")
	}
	cl := natstest.StartCluster(t, natstest.Binary(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer r.Close()
	ref := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer ref.Close()
	var logs syncbuf.Buffer
	nc, err := nats.Connect(cl.URLs(), ConnectOptions(slog.New(slog.NewTextHandler(&logs, nil)))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cons, err := NewConsumer(ctx, nc, r, ConsumerConfig{Replicas: 3, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	pub, err := NewPublisher(connect(t, cl.URLs()), "")
	if err != nil {
		t.Fatal(err)
	}
	g := newStreamGen(3)
	var last uint64
	publish := func(n int) {
		t.Helper()
		for range n {
			b := g.batch()
			for {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				seq, err := pub.Batch(pctx, b)
				pcancel()
				if err == nil {
					last = seq
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("publish: %v\n%s", err, cl.Logs())
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err := ref.Ingest(b.Worker, b.Model, b.Events); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(200)
	waitFor(t, "the first events", func() bool { return cons.LastSeq() == last })

	host := nc.ConnectedServerName()
	n := cl.Node(host)
	if n == nil {
		t.Fatalf("the consumer is connected to no node of the cluster (%q)", host)
	}
	n.Kill()
	publish(200)
	for cons.LastSeq() != last {
		if ctx.Err() != nil {
			t.Fatalf("the consumer stopped at sequence %d of %d after %s, which it was connected to, was killed; stats %+v\n%s",
				cons.LastSeq(), last, host, cons.Stats(), logs.String()+cl.Logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	n.Start()
	cl.AwaitJoined(n)
	publish(200)
	waitFor(t, "the events published after the node came back", func() bool { return cons.LastSeq() == last })
	got, want := matchAll(t, r, g), matchAll(t, ref, g)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("index after the failover differs from the reference:\n got %v\nwant %v", got, want)
	}
	cs := cons.Stats()
	if cs.Gaps != 0 {
		t.Fatalf("consumer stats %+v", cs)
	}
	t.Logf("%d stalled consumers restarted", cs.Restarts)
}

// TestConsumerRestartsWhenStalled stops the client's consumer behind the Consumer's back, as
// one waiting for a lost cluster node is stopped in effect: with later events in the stream and
// nothing read for ReadStall, a check starts a new consumer after the last sequence read, and
// the router ends with every event once.
func TestConsumerRestartsWhenStalled(t *testing.T) {
	s := embedded(t)
	ctx := context.Background()
	r := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer r.Close()
	ref := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer ref.Close()
	cons, err := NewConsumer(ctx, connect(t, s.ClientURL()), r, ConsumerConfig{Memory: true, Logger: quietLog(),
		CheckInterval: 10 * time.Millisecond, ReadStall: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	pub, err := NewPublisher(connect(t, s.ClientURL()), "")
	if err != nil {
		t.Fatal(err)
	}
	g := newStreamGen(4)
	var last uint64
	publish := func(n int) {
		t.Helper()
		for range n {
			b := g.batch()
			if last, err = pub.Batch(ctx, b); err != nil {
				t.Fatal(err)
			}
			if err := ref.Ingest(b.Worker, b.Model, b.Events); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(100)
	waitFor(t, "the first events", func() bool { return cons.LastSeq() == last })
	// Set before the watch goroutine started, which replaces it only on a restart.
	cons.cc.Stop()
	publish(100)
	waitFor(t, "the consumer started again", func() bool { return cons.LastSeq() == last })
	got, want := matchAll(t, r, g), matchAll(t, ref, g)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("index after the restart differs from the reference:\n got %v\nwant %v", got, want)
	}
	st, rst := cons.Stats(), r.Stats()
	if st.Restarts < 1 || st.Gaps != 0 || rst.Events.ByStatus[shard.Duplicate] != 0 {
		t.Fatalf("restarts %d, gaps %d, duplicate events %d: want a restart, nothing lost, nothing twice", st.Restarts, st.Gaps, rst.Events.ByStatus[shard.Duplicate])
	}
}
