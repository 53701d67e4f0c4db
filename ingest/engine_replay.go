package ingest

// Recovering missed batches from an engine's replay socket.

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/go-zeromq/zmq4"
	"github.com/kvrouterd/kvrouterd/wire"
)

// recover hands on the batches between the rank's last one and seq from the replay socket; if
// it cannot, it clears the rank or, with KeepOnGap, keeps its blocks (lost).
func (rl *rankLoop) recover(ctx context.Context, seq uint64) {
	from := rl.tracker.last + 1
	reason := "no replay endpoint"
	if rl.replay != "" {
		rl.c[cReplayRequests].Add(1)
		err := rl.replayRange(ctx, seq, fromOldest)
		if err == nil {
			rl.c[cGapsRecovered].Add(1)
			rl.log.Info("missed batches recovered from the replay socket", "first", from, "last", seq-1)
			return
		}
		reason = err.Error()
	}
	if ctx.Err() != nil {
		return
	}
	rl.lost(ctx, "engine batches lost", "first", rl.tracker.last+1, "last", seq-1, "reason", reason)
}

// lost counts batches lost for good and, unless KeepOnGap, clears the rank; the warning says
// which.
func (rl *rankLoop) lost(ctx context.Context, msg string, args ...any) {
	rl.c[cGapsUnrecovered].Add(1)
	if rl.s.cfg.KeepOnGap {
		rl.c[cGapsKept].Add(1)
		rl.log.Warn(msg+"; the rank's blocks are kept", args...)
		return
	}
	rl.log.Warn(msg+"; the rank's blocks are cleared", args...)
	rl.clear(ctx)
}

// history hands on, before the first live batch seq, what the engine's replay buffer still holds
// from before it: the cache the engine built before the rank was subscribed (registered late,
// or kvrouterd started after the engine). Nothing was applied from the rank before, so a buffer
// that holds nothing older loses nothing kvrouterd had; for a rank resumed after earlier
// batches, a buffer with a hole in it is a gap like any other (lost).
func (rl *rankLoop) history(ctx context.Context, seq uint64) {
	rl.c[cReplayRequests].Add(1)
	err := rl.replayRange(ctx, seq, fromOldest)
	switch {
	case err == nil:
		if rl.tracker.started {
			rl.log.Info("engine history fetched from the replay socket", "first_live", seq, "last", rl.tracker.last)
		}
		return
	case ctx.Err() != nil:
		return
	case !rl.tracker.started:
		rl.warn("engine history not fetched; the rank starts from its live batches", "first_live", seq, "err", err)
		return
	}
	rl.lost(ctx, "engine history has a hole", "last", rl.tracker.last, "first_live", seq, "err", err)
}

// catchUp runs as each connection to the rank's PUB socket is made, before its first live
// message is read: it hands on whatever the replay buffer holds after the last batch handed on
// (everything it holds, for a rank never fed), so that the cache an engine built while nobody
// listened counts at once rather than at the engine's next batch, which an idle engine may
// never publish. Subscribing first and asking second leaves no batch between the two: one
// published meanwhile arrives live as well and is a duplicate, one published before the
// subscription took effect is in the reply. Batches after the rank's last one are a gap,
// recovered; a buffer that no longer reaches back to it is a gap lost.
func (rl *rankLoop) catchUp(ctx context.Context) {
	started, last := rl.tracker.started, rl.tracker.last
	rl.c[cReplayRequests].Add(1)
	err := rl.replayRange(ctx, openEnded, fromOldest)
	switch {
	case ctx.Err() != nil:
		return
	case err == nil && !started:
		if rl.tracker.started {
			rl.log.Info("engine history fetched from the replay socket", "last", rl.tracker.last)
		}
	case err == nil:
		if rl.tracker.last != last {
			rl.c[cGaps].Add(1)
			rl.c[cGapsRecovered].Add(1)
			rl.log.Info("batches published while unsubscribed recovered from the replay socket", "first", last+1, "last", rl.tracker.last)
		}
	case !started && !rl.tracker.started:
		rl.warn("engine history not fetched; the rank starts from its live batches", "err", err)
	default:
		rl.c[cGaps].Add(1)
		rl.lost(ctx, "batches published while unsubscribed are no longer in the replay buffer", "last", rl.tracker.last, "err", err)
	}
}

// restarted hands on, after a restart revealed by live batch seq, the restarted engine's
// batches before it from the replay buffer: its first ones may have been published before the
// subscription reached its new PUB socket. The rank was just cleared and nothing of the new
// engine was handed on, so the reply must start at batch 0; a buffer that no longer holds it
// has lost batches for good.
func (rl *rankLoop) restarted(ctx context.Context, seq uint64) {
	rl.tracker = seqTracker{}
	rl.c[cReplayRequests].Add(1)
	err := rl.replayRange(ctx, seq, fromZero)
	switch {
	case err == nil:
		if rl.tracker.started {
			rl.log.Info("restarted engine's first batches recovered from the replay socket", "last", rl.tracker.last)
		}
	case ctx.Err() != nil:
	default:
		rl.c[cGaps].Add(1)
		rl.lost(ctx, "restarted engine's first batches lost", "first_live", seq, "err", err)
	}
}

// openEnded as replayRange's upto asks for every batch the buffer holds.
const openEnded = math.MaxUint64

// replayOrigin is where a replay for a rank with nothing handed on yet must start.
type replayOrigin uint8

const (
	fromOldest replayOrigin = iota // the oldest batch the buffer holds (history)
	fromZero                       // batch 0 (a restarted engine's stream)
)

// replayRange asks the rank's replay socket for the batches from the last one handed on up to
// (not including) upto, or all of them (openEnded), and hands them on in order; with none
// handed on yet, from origin. The reply is read to its end marker even
// when it cannot close the gap, so that zmq4 is left no message it would block on.
func (rl *rankLoop) replayRange(ctx context.Context, upto uint64, origin replayOrigin) error {
	s := rl.s
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	lim := s.newLimit()
	d := zmq4.NewDealer(withLimit(rctx, lim), s.socketOptions()...)
	defer d.Close()
	if err := d.Dial(guardedEndpoint(rl.replay)); err != nil {
		return fmt.Errorf("replay %s: %w", rl.replay, err)
	}
	var start [8]byte
	if rl.tracker.started {
		binary.BigEndian.PutUint64(start[:], rl.tracker.last+1)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return fmt.Errorf("replay %s: request: %w", rl.replay, err)
	}
	var (
		hole error
		prev zmq4.Msg // handled: its bytes go back to the limit before the next is received
	)
	for {
		lim.releaseMsg(prev)
		msg, err := d.Recv()
		if err != nil {
			if errors.Is(rctx.Err(), context.DeadlineExceeded) {
				err = fmt.Errorf("no end marker within %v", s.cfg.ReplayTimeout)
			}
			return fmt.Errorf("replay %s: %w", rl.replay, err)
		}
		prev = msg
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		seq, payload, end, err := wire.ParseReplayReply(msg.Frames)
		if err != nil {
			hole = cmp.Or(hole, err)
			continue
		}
		if end {
			break
		}
		next := rl.tracker.last + 1
		switch {
		case rl.tracker.started:
		case origin == fromOldest:
			next = seq // history: the oldest batch the buffer holds starts the rank's stream
		default:
			next = 0
		}
		switch {
		case hole != nil, seq < next, next == upto, seq >= upto:
			// Handed on already, or the live stream's; or the gap cannot be closed anyway.
		case seq > next:
			hole = fmt.Errorf("the replay has batch %d where %d is missing", seq, next)
		default:
			rl.deliver(ctx, seq, payload, true)
		}
	}
	if hole != nil {
		return fmt.Errorf("replay %s: %w", rl.replay, hole)
	}
	switch {
	case upto == openEnded:
		return nil // all there was
	case !rl.tracker.started && origin == fromOldest:
		return nil // history: the buffer holds nothing older than the live batch
	case !rl.tracker.started:
		return fmt.Errorf("replay %s: it holds no batch 0", rl.replay)
	}
	if next := rl.tracker.last + 1; next != upto {
		return fmt.Errorf("replay %s: it ended before batch %d", rl.replay, next)
	}
	return nil
}
