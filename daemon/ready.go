package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
)

// catchUp is the readiness check "catching up": not ready until the index has applied the event
// stream up to where the stream ended when the daemon started, so that a restarted replica
// answers from a whole index, not one half replayed. Once caught up it stays so: later lag is
// the steady state, not a restart's. Its methods are safe for concurrent use; watch runs once.
type catchUp struct {
	cons *ingest.Consumer
	done atomic.Bool
}

// catchUpPoll is how often watch compares the consumer's sequence with the target.
const catchUpPoll = 10 * time.Millisecond

// watch waits until the consumer has handed every event up to the stream's end at start to r
// and r has applied them, then marks the daemon caught up. It returns then or when ctx ends. If
// retention drops the events still to read, there is nothing left to catch up on.
func (cu *catchUp) watch(ctx context.Context, r *router.Router, log *slog.Logger) {
	start, target := time.Now(), cu.cons.StartLastSeq()
	t := time.NewTicker(catchUpPoll)
	defer t.Stop()
	for cu.cons.LastSeq() < target && cu.cons.FirstSeq() <= target {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	if err := r.Flush(); err != nil {
		return // closed: shutting down
	}
	cu.done.Store(true)
	log.Info("caught up with the event stream", "stream_seq", target, "since_start", time.Since(start))
}

// ready is the check: nil once caught up, else how far the replay is.
func (cu *catchUp) ready() error {
	if cu.done.Load() {
		return nil
	}
	return fmt.Errorf("event stream applied to sequence %d of %d", cu.cons.LastSeq(), cu.cons.StartLastSeq())
}
