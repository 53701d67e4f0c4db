package ingest

// Recovering missed batches from an engine's replay socket.

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

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
		err := rl.replayRange(ctx, seq)
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
	err := rl.replayRange(ctx, seq)
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

// replayRange asks the rank's replay socket for the batches from the last one handed on up to
// (not including) upto, and hands them on in order; with none handed on yet (history), from
// the oldest the buffer holds. The reply is read to its end marker even
// when it cannot close the gap, so that zmq4 is left no message it would block on.
func (rl *rankLoop) replayRange(ctx context.Context, upto uint64) error {
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
		if !rl.tracker.started {
			next = seq // history: the oldest batch the buffer holds starts the rank's stream
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
	if !rl.tracker.started {
		return nil // history: the buffer holds nothing older than the live batch
	}
	if next := rl.tracker.last + 1; next != upto {
		return fmt.Errorf("replay %s: it ended before batch %d", rl.replay, next)
	}
	return nil
}
