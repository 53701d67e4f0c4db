package ingest

// Restart and gap detection: what a live message's batch sequence says about its publisher.

import "fmt"

// seqVerdict is what a live message's sequence number says about the stream.
type seqVerdict uint8

const (
	seqFirst     seqVerdict = iota + 1 // the first message seen: it sets the cursor
	seqNext                            // last + 1: in order
	seqGap                             // beyond last + 1: batches went missing
	seqDuplicate                       // at or before last on the same connection: handed on already
	seqRestart                         // back to 0, or back at all after a reconnect: the engine restarted
)

func (v seqVerdict) String() string {
	switch v {
	case seqFirst:
		return "first"
	case seqNext:
		return "next"
	case seqGap:
		return "gap"
	case seqDuplicate:
		return "duplicate"
	case seqRestart:
		return "restart"
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}

// seqTracker follows the batch sequence of one publisher (one rank's PUB socket). A plain
// value, for one goroutine.
//
// Engines number batches from 0 and start again from 0 when they restart. A sequence that goes
// back therefore means a restart when it is 0 (a repeated 0 is a duplicate: nothing was
// delivered in between), or when the connection was lost since the last batch: the engine
// came back and the new connection missed its first batches, as a SUB socket misses what is
// published before it has subscribed. On one connection otherwise, TCP delivers in order, and
// a sequence that goes back is a duplicate.
//
// What the tracker cannot tell: an engine that restarted and, before the reconnect, published
// more batches than it had before shows up as a gap. Its replay buffer then holds the new
// engine's batches, which is what the router needs from here on; the old engine's blocks stay
// in the index until they are removed or the worker is cleared.
type seqTracker struct {
	last        uint64 // sequence of the last batch accepted
	started     bool   // a batch was accepted
	reconnected bool   // the connection was lost since the last batch accepted
}

// classify says what seq means after the batches accepted so far; it changes nothing.
func (t *seqTracker) classify(seq uint64) seqVerdict {
	switch {
	case !t.started:
		return seqFirst
	case seq == t.last+1 && seq != 0:
		return seqNext
	case seq > t.last:
		return seqGap
	case t.reconnected || seq == 0 && t.last > 0:
		return seqRestart
	}
	return seqDuplicate
}

// accept moves the cursor to seq, the batch handed on (or dropped as malformed) last.
func (t *seqTracker) accept(seq uint64) {
	t.last, t.started, t.reconnected = seq, true, false
}

// resume sets the cursor to last, a batch handed on by an earlier subscription, as if the
// connection had been lost since.
func (t *seqTracker) resume(last uint64) {
	t.last, t.started, t.reconnected = last, true, true
}

// disconnected notes that the connection was lost.
func (t *seqTracker) disconnected() { t.reconnected = true }
