package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/nats-io/nats.go/jetstream"
)

// catchUp is the readiness check "catching up": not ready until the index has applied the event
// stream up to where the stream ended when the daemon started, so that a restarted replica
// answers from a whole index, not one half replayed. Once caught up it stays so: later lag is
// the steady state, not a restart's. Its methods are safe for concurrent use; watch runs once.
type catchUp struct {
	cons   *ingest.Consumer
	target atomic.Uint64 // the stream's last sequence at start; 0 until read
	known  atomic.Bool   // target was read
	done   atomic.Bool
}

// catchUpPoll is how often watch compares the consumer's sequence with the target.
const catchUpPoll = 10 * time.Millisecond

// watch reads the stream's last sequence, waits until the consumer has handed every event up to
// it to r and r has applied them, then marks the daemon caught up. It returns then or when ctx
// ends. If retention drops the events still to read, there is nothing left to catch up on.
func (cu *catchUp) watch(ctx context.Context, st *ingest.Stream, stream string, r *router.Router, log *slog.Logger) {
	start := time.Now()
	js, err := jetstream.New(st.Conn)
	if err != nil {
		log.Error("catching up: no JetStream context; readiness will not wait for the replay", "err", err)
		cu.done.Store(true)
		return
	}
	// info is the stream's state: first and last sequence.
	info := func() (jetstream.StreamState, error) {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s, err := js.Stream(ictx, stream)
		if err != nil {
			return jetstream.StreamState{}, err
		}
		return s.CachedInfo().State, nil
	}
	t := time.NewTicker(catchUpPoll)
	defer t.Stop()
	var lastInfo time.Time
	for {
		if lastInfo.IsZero() || time.Since(lastInfo) >= time.Second { // a cheap request, but a request
			lastInfo = time.Now()
			state, err := info()
			switch {
			case err != nil && ctx.Err() != nil:
				return
			case err != nil:
				log.Warn("catching up: the event stream's state cannot be read; trying again", "err", err)
			case !cu.known.Load():
				cu.target.Store(state.LastSeq)
				cu.known.Store(true)
			case state.FirstSeq > cu.target.Load():
				// Retention dropped every event up to the target before it was read.
				cu.target.Store(cu.cons.LastSeq())
			}
		}
		if cu.known.Load() && cu.cons.LastSeq() >= cu.target.Load() {
			if err := r.Flush(); err != nil {
				return // closed: shutting down
			}
			cu.done.Store(true)
			log.Info("caught up with the event stream", "stream_seq", cu.target.Load(), "since_start", time.Since(start))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ready is the check: nil once caught up, else how far the replay is.
func (cu *catchUp) ready() error {
	switch {
	case cu.done.Load():
		return nil
	case !cu.known.Load():
		return errors.New("reading where the event stream ends")
	default:
		return fmt.Errorf("event stream applied to sequence %d of %d", cu.cons.LastSeq(), cu.target.Load())
	}
}
