package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Bridge runs beside one engine and forwards its KV-event batches from ZMQ to JetStream: each
// payload unchanged, on the worker's event subject, with the Kvr-Rank header set to the rank
// of the socket it came from and Kvr-Engine-Seq to its engine sequence. It subscribes and
// keeps the sequence as a Subscriber does: missed batches are fetched from the replay socket
// and forwarded in order; after an engine restart, batches lost for good (unless
// EngineConfig.KeepOnGap) or a batch JetStream did not store, it publishes a kvrouterd event
// batch clearing the worker before the next payload. Payloads are not decoded: a malformed one is the consumer's to count. Its
// methods are safe for concurrent use.
//
// Each batch is published synchronously, its acknowledgement awaited before the next: the
// order in the stream is the order of the engine, and a batch JetStream did not store is known
// at once. That bounds a Bridge to one stream round trip per batch, thousands of batches a
// second on a local network, well above what one engine publishes.
type Bridge struct {
	s       *engineStream
	pub     *Publisher
	running atomic.Bool
}

// NewBridge returns a Bridge from src to pub; Run runs it.
func NewBridge(src EngineSource, pub *Publisher, cfg EngineConfig) (*Bridge, error) {
	if pub == nil {
		return nil, errors.New("ingest: bridge without a publisher")
	}
	b := &Bridge{pub: pub}
	s, err := newEngineStream(src, cfg, b)
	if err != nil {
		return nil, err
	}
	b.s = s
	return b, nil
}

// Run forwards until ctx is done, then returns nil once its sockets are closed; an engine not
// up yet is retried until it is. A Bridge runs once.
func (b *Bridge) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("ingest: bridge run twice")
	}
	b.s.run(ctx)
	return nil
}

// Stats returns the Bridge's counters (Events stays 0: payloads are not decoded).
func (b *Bridge) Stats() EngineStats {
	st := b.s.stats()
	b.s.health(st.Ranks)
	return st
}

// RunBridge runs a Bridge from src to pub with the default configuration and log as its
// logger, until ctx is done. It fails at once if src is not valid.
func RunBridge(ctx context.Context, src EngineSource, pub *Publisher, log *slog.Logger) error {
	b, err := NewBridge(src, pub, EngineConfig{Logger: log})
	if err != nil {
		return err
	}
	return b.Run(ctx)
}

func (b *Bridge) prepare(*rankLoop, uint64, []byte) bool { return true }

func (b *Bridge) sendLocked(ctx context.Context, rl *rankLoop, seq uint64, payload []byte) error {
	ctx, cancel := context.WithTimeout(ctx, b.s.cfg.PublishTimeout)
	defer cancel()
	es := int64(-1)
	if seq <= math.MaxInt64 {
		es = int64(seq)
	}
	if _, err := b.pub.Engine(ctx, b.s.src.Model, b.s.src.Worker, int64(rl.rank), es, payload); err != nil {
		return fmt.Errorf("%w: %w", errLost, err)
	}
	return nil
}

func (b *Bridge) clearLocked(ctx context.Context, rl *rankLoop) error {
	ctx, cancel := context.WithTimeout(ctx, b.s.cfg.PublishTimeout)
	defer cancel()
	rl.clearEv[0] = kvevent.Event{Kind: kvevent.Cleared, Rank: rl.rank}
	_, err := b.pub.Batch(ctx, &wire.EventBatch{Worker: b.s.src.Worker, Model: b.s.src.Model, Events: rl.clearEv[:]})
	return err
}
