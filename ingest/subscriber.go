package ingest

// Subscriber: an engine's KV events, straight from its ZMQ sockets, into an EventSink.

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// events once it returns.
type EventSink interface {
	Ingest(worker uint64, model string, events []kvevent.Event) error
}

// Subscriber reads one engine's KV events straight from its ZMQ sockets and hands them to an
// EventSink, in order per data-parallel rank, with the worker and model of its EngineSource.
// Missed batches are fetched from the engine's replay socket when it has one; when they cannot
// be, or the engine restarted, that rank is cleared (one kvevent.Cleared event of the rank) before
// its next batch. Its methods are safe for concurrent use; the sink is called by one goroutine per
// rank, never by two at once.
type Subscriber struct {
	s    *engineStream
	sink EventSink

	mu     sync.Mutex
	cancel context.CancelFunc // REQUIRES mu
	done   chan struct{}      // closed when the ranks' goroutines are gone; REQUIRES mu
}

// NewSubscriber returns a Subscriber of src feeding sink; Start starts it.
func NewSubscriber(src EngineSource, sink EventSink, cfg EngineConfig) (*Subscriber, error) {
	sub := &Subscriber{sink: sink}
	s, err := newEngineStream(src, cfg, sub)
	if err != nil {
		return nil, err
	}
	sub.s = s
	return sub, nil
}

// Start connects to the engine's sockets in the background and returns: an engine not up yet
// is retried until it is, or until ctx is done or Close is called. A Subscriber starts once.
func (sub *Subscriber) Start(ctx context.Context) error {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.done != nil {
		return errors.New("ingest: subscriber started twice")
	}
	ctx, sub.cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	sub.done = done
	go func() {
		defer close(done)
		sub.s.run(ctx)
	}()
	return nil
}

// Close stops the Subscriber and returns once its sockets are closed and its goroutines gone;
// the sink is not called after. Closing twice, or a Subscriber never started, is harmless.
func (sub *Subscriber) Close() {
	sub.mu.Lock()
	cancel, done := sub.cancel, sub.done
	sub.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// Stats returns the Subscriber's counters.
func (sub *Subscriber) Stats() EngineStats {
	st := sub.s.stats()
	sub.s.health(st.Ranks)
	return st
}

// Source returns what the Subscriber reads.
func (sub *Subscriber) Source() EngineSource { return sub.s.src }

// prepare decodes the payload into the rank's reused batch. A batch without a rank takes the
// socket's; one that states a rank keeps it.
func (sub *Subscriber) prepare(rl *rankLoop, seq uint64, payload []byte) bool {
	b := &rl.batch
	if err := b.Decode(payload); err != nil {
		rl.dropMalformed(seq, err)
		return false
	}
	if !b.HasRank {
		for i := range b.Events {
			b.Events[i].Rank = rl.rank
		}
	}
	return true
}

func (sub *Subscriber) sendLocked(_ context.Context, rl *rankLoop, seq uint64, _ []byte) error {
	evs := rl.batch.Events
	if len(evs) == 0 {
		// Nothing to apply; an empty batch would also register the worker's rank 0, whatever
		// the socket's rank.
		return nil
	}
	for i := range evs {
		evs[i].Batch = seq + 1 // the rank keeps the last one applied, to resume after a restart
	}
	if err := sub.sink.Ingest(sub.s.src.Worker, sub.s.src.Model, evs); err != nil {
		return err
	}
	rl.c[cEvents].Add(int64(len(evs)))
	if n := rl.batch.UnknownMedium; n > 0 {
		rl.c[cUnknownMedium].Add(int64(n))
		rl.warn("engine events of an unknown storage medium applied as the device tier",
			"medium", strings.Clone(rl.batch.UnknownMediumName), "events", n)
	}
	return nil
}

func (sub *Subscriber) clearLocked(_ context.Context, rl *rankLoop) error {
	rl.clearEv[0] = kvevent.Event{Kind: kvevent.Cleared, Rank: rl.rank}
	return sub.sink.Ingest(sub.s.src.Worker, sub.s.src.Model, rl.clearEv[:])
}
