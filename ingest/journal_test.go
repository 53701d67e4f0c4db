package ingest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
)

// TestJournalReplicas runs two replicas (a router and a consumer each) on one stream and makes
// every kind of change through the first one's Journal: each is made on the first replica when
// the call returns, with the Router's own answer (outcomes, refusals), and the second replica
// comes to the same state. Requests refused by a local look publish nothing; a stream that is
// gone answers router.ErrUnavailable.
func TestJournalReplicas(t *testing.T) {
	ns := embedded(t)
	ctx := context.Background()
	newReplica := func() (*router.Router, *Consumer, *Journal) {
		r := router.New(router.Config{Shards: 2, Logger: quietLog()})
		t.Cleanup(r.Close)
		nc := connect(t, ns.ClientURL())
		c, err := NewConsumer(ctx, nc, r, ConsumerConfig{Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return r, c, journal(t, c, nc, r)
	}
	ra, ca, ja := newReplica()
	rb, cb, _ := newReplica()
	const model = "m"
	same := func(what string) {
		t.Helper()
		waitFor(t, what+" on the second replica", func() bool { return cb.LastSeq() == ca.LastSeq() })
		for _, r := range []*router.Router{ra, rb} {
			if err := r.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		wa, wb := ra.Workers(), rb.Workers()
		if len(wa) != len(wb) {
			t.Fatalf("%s: %d workers on the first replica, %d on the second", what, len(wa), len(wb))
		}
		for i := range wa {
			if wa[i].ID != wb[i].ID || wa[i].Rank != wb[i].Rank || wa[i].Model != wb[i].Model || wa[i].CachedBlocks != wb[i].CachedBlocks || wa[i].LastEventID != wb[i].LastEventID {
				t.Fatalf("%s: worker %+v on the first replica, %+v on the second", what, wa[i], wb[i])
			}
			if da, db := ra.DumpWorker(wa[i].ID, nil), rb.DumpWorker(wb[i].ID, nil); !slices.Equal(da, db) {
				t.Fatalf("%s: worker %d holds %v on the first replica, %v on the second", what, wa[i].ID, da, db)
			}
		}
	}

	// A registration is made before Register returns, and on the other replica after.
	if err := ja.Register(router.Registration{ID: 5, Model: model, BlockSize: 4, Ranks: []uint32{0, 1}, Capacity: 100}); err != nil {
		t.Fatal(err)
	}
	if m, ok := ra.WorkerModel(5); !ok || m != model {
		t.Fatalf("worker 5 on the first replica when Register returned: %q %v", m, ok)
	}
	same("the registration")
	if !rb.HasRank(5, 1) {
		t.Fatal("the second replica does not have worker 5's rank 1")
	}

	// Events: the outcomes are the first replica's, appended to dst.
	b := &wire.EventBatch{Worker: 5, Model: model, Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, BlockSize: 4, Hashes: []uint64{11, 12}, Tokens: toks(0, 8)},
		{Kind: kvevent.Stored, ID: 2, Rank: 1, BlockSize: 4, Hashes: []uint64{21}, Tokens: toks(0, 4)},
		{Kind: kvevent.Removed, ID: 3, Hashes: []uint64{99}}, // not held
	}}
	dst := make([]shard.Outcome, 1, 8)
	oc, err := ja.ApplyEvents(b, dst[:1])
	if err != nil {
		t.Fatal(err)
	}
	if len(oc) != 4 || &oc[0] != &dst[0] || oc[1].Applied != 2 || oc[2].Applied != 1 || oc[2].Rank != 1 || oc[3].Applied != 0 {
		t.Fatalf("outcomes %+v: want dst's first, then 2 and 1 blocks stored and nothing removed", oc)
	}
	if err := ra.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := cached(t, ra, model, toks(0, 8)); got[5<<8] != 2 || got[5<<8|1] != 1 {
		t.Fatalf("cached on the first replica: %v", got)
	}
	same("the events")

	// Refusals. A worker not registered here, or a batch naming another model: the Router's
	// answer, nothing published.
	before := ca.LastSeq()
	if _, err := ja.ApplyEvents(&wire.EventBatch{Worker: 6, Events: b.Events[:1]}, nil); !errors.Is(err, router.ErrUnknownWorker) {
		t.Fatalf("events of an unknown worker: %v", err)
	}
	if _, err := ja.ApplyEvents(&wire.EventBatch{Worker: 5, Model: "other", Events: b.Events[:1]}, nil); err == nil {
		t.Fatal("events naming another model than the worker's were accepted")
	}
	if err := ja.Unregister(6); !errors.Is(err, router.ErrUnknownWorker) {
		t.Fatalf("unregistering an unknown worker: %v", err)
	}
	var fe *router.FieldError
	if err := ja.Register(router.Registration{ID: 9, Model: model, Capacity: -1}); !errors.As(err, &fe) || fe.Field != "capacity_blocks" {
		t.Fatalf("a negative capacity: %v, want a refusal naming capacity_blocks", err)
	}
	// A registration the Router refuses once it comes out of the stream: its error, from the
	// first replica, and the same refusal counted on both.
	err = ja.Register(router.Registration{ID: 7, Model: model, BlockSize: 8})
	if !errors.As(err, &fe) || fe.Field != "block_size" {
		t.Fatalf("a second block size for the model: %v, want a refusal naming block_size", err)
	}
	if got := ca.LastSeq(); got != before+1 {
		t.Fatalf("the stream went from %d to %d: only the refused registration should be in it", before, got)
	}
	same("the refusals")
	if a, b := ca.Stats(), cb.Stats(); a.Rejected[RejectInvalid] != 1 || b.Rejected[RejectInvalid] != 1 || a.Changes != 2 || b.Changes != 2 {
		t.Fatalf("changes and refusals: first replica %d and %v, second %d and %v; want 2 and invalid 1 each",
			a.Changes, a.Rejected, b.Changes, b.Rejected)
	}

	// Unregistering one rank, then the worker.
	if err := ja.UnregisterRank(5, 1); err != nil {
		t.Fatal(err)
	}
	if ra.HasRank(5, 1) || !ra.HasRank(5, 0) {
		t.Fatal("worker 5's ranks on the first replica when UnregisterRank returned: want rank 0 alone")
	}
	same("the removal of a rank")
	if rb.HasRank(5, 1) || !rb.HasRank(5, 0) {
		t.Fatal("worker 5's ranks on the second replica: want rank 0 alone")
	}
	if err := ja.Unregister(5); err != nil {
		t.Fatal(err)
	}
	if _, ok := ra.WorkerModel(5); ok {
		t.Fatal("worker 5 still on the first replica when Unregister returned")
	}
	same("the removal")
	if _, ok := rb.WorkerModel(5); ok {
		t.Fatal("worker 5 still on the second replica")
	}

	// No way to the stream: router.ErrUnavailable.
	nc := connect(t, ns.ClientURL())
	jc := journal(t, ca, nc, ra)
	nc.Close()
	if err := jc.Register(router.Registration{ID: 8, Model: model, BlockSize: 4}); !errors.Is(err, router.ErrUnavailable) {
		t.Fatalf("registering with the stream gone: %v, want router.ErrUnavailable", err)
	}
	if _, ok := ra.WorkerModel(8); ok {
		t.Fatal("worker 8 registered without the stream")
	}
}

// TestJournalTooLarge: a change over the stream's message limit is refused naming the field,
// before anything is published.
func TestJournalTooLarge(t *testing.T) {
	ns := embedded(t)
	r := router.New(router.Config{Shards: 1, Logger: quietLog()})
	defer r.Close()
	nc := connect(t, ns.ClientURL())
	c, err := NewConsumer(context.Background(), nc, r, ConsumerConfig{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	j := journal(t, c, nc, r)
	if err := j.Register(router.Registration{ID: 1, Model: "m", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	n := int(nc.MaxPayload()/4 + 4)
	b := &wire.EventBatch{Worker: 1, Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1, BlockSize: 4, Hashes: make([]uint64, n/4), Tokens: toks(0, n/4*4)}}}
	for i := range b.Events[0].Hashes {
		b.Events[0].Hashes[i] = uint64(i + 1)
	}
	before := c.LastSeq()
	_, err = j.ApplyEvents(b, nil)
	var fe *router.FieldError
	if !errors.As(err, &fe) || fe.Field != "events" || !errors.Is(err, router.ErrTooLong) {
		t.Fatalf("a batch over the stream's message limit: %v, want ErrTooLong naming events", err)
	}
	if c.LastSeq() != before {
		t.Fatal("the batch over the limit was published")
	}
}

func journal(t *testing.T, c *Consumer, nc *nats.Conn, local Local) *Journal {
	t.Helper()
	j, err := NewJournal(c, nc, local, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return j
}
