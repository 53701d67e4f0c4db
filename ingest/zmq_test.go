package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// The tests below run real zmq4 sockets on 127.0.0.1: a fake engine's PUB and ROUTER sockets
// (internal/enginetest) and the Subscriber's SUB and DEALER ones. A SUB socket misses whatever
// is published before its subscription reaches the PUB, so every test first has the fake engine
// repeat an empty batch with sequence 0 until the subscriber has seen it (Probe); from then on
// TCP delivers everything in order and the tests are deterministic. They wait for conditions, never for
// time.

func zmqTestLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// eventually polls cond; its deadline bounds how long a broken build hangs, it asserts no timing.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func be8(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// source is the subscription to every rank of eng for worker and model, read from the --zmq
// flag form the engine gives.
func source(t testing.TB, eng *enginetest.Engine, worker uint64, model string) EngineSource {
	t.Helper()
	src, err := ParseEngineSource(eng.ZMQFlag(worker, model))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// recSink records what a Subscriber hands it.
type recSink struct {
	mu    sync.Mutex
	calls []sinkCall
}

type sinkCall struct {
	worker uint64
	model  string
	events []kvevent.Event
}

func (s *recSink) Ingest(worker uint64, model string, events []kvevent.Event) error {
	cp := make([]kvevent.Event, len(events))
	for i, e := range events {
		e.Hashes, e.Tokens, e.LoRA = slices.Clone(e.Hashes), slices.Clone(e.Tokens), strings.Clone(e.LoRA)
		if e.MM != nil {
			mm := make([][]uint64, len(e.MM))
			for j := range e.MM {
				mm[j] = slices.Clone(e.MM[j])
			}
			e.MM = mm
		}
		cp[i] = e
	}
	s.mu.Lock()
	s.calls = append(s.calls, sinkCall{worker, model, cp})
	s.mu.Unlock()
	return nil
}

func (s *recSink) snapshot() []sinkCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// events are the events received, one line each (evLine).
func (s *recSink) events() []string {
	var out []string
	for _, c := range s.snapshot() {
		for _, e := range c.events {
			out = append(out, evLine(e))
		}
	}
	return out
}

func (s *recSink) count() int { return len(s.events()) }

// evLine describes an event in one line; nil and empty slices read the same.
func evLine(e kvevent.Event) string {
	switch e.Kind {
	case kvevent.Stored:
		parent := "-"
		if e.HasParent {
			parent = fmt.Sprint(e.Parent)
		}
		return fmt.Sprintf("stored r%d %v parent=%s hashes=%v bs=%d tokens=%v lora=%q mm=%v", e.Rank, e.Tier, parent, e.Hashes, e.BlockSize, e.Tokens, e.LoRA, e.MM)
	case kvevent.Removed:
		return fmt.Sprintf("removed r%d %v hashes=%v", e.Rank, e.Tier, e.Hashes)
	}
	return fmt.Sprintf("%v r%d", e.Kind, e.Rank)
}

const testBlock = 4

// blockTokens are the tokens of the block with engine hash h: derived from h, so that distinct
// hashes are distinct content.
func blockTokens(hashes []uint64) []uint32 {
	var t []uint32
	for _, h := range hashes {
		for i := range testBlock {
			t = append(t, uint32(h*testBlock)+uint32(i))
		}
	}
	return t
}

func stored(parent uint64, hashes ...uint64) kvevent.Event {
	return kvevent.Event{Kind: kvevent.Stored, Hashes: hashes, Parent: parent, HasParent: parent != 0, BlockSize: testBlock, Tokens: blockTokens(hashes)}
}

func removed(hashes ...uint64) kvevent.Event {
	return kvevent.Event{Kind: kvevent.Removed, Hashes: hashes}
}

func cleared(rank uint32) string { return evLine(kvevent.Event{Kind: kvevent.Cleared, Rank: rank}) }

// engineBatch is a batch of evs; rank < 0 leaves the batch without a rank.
func engineBatch(rank int, evs ...kvevent.Event) *wire.EngineBatch {
	b := &wire.EngineBatch{TS: 1700000000.5, Events: evs}
	if rank >= 0 {
		b.Rank, b.HasRank = uint32(rank), true
	}
	return b
}

// lines are the lines of b's events as the sink should see them, with rank.
func lines(rank uint32, b *wire.EngineBatch) []string {
	var out []string
	for _, e := range b.Events {
		e.Rank = rank
		out = append(out, evLine(e))
	}
	return out
}

func startSub(t testing.TB, src EngineSource, sink EventSink, cfg EngineConfig) *Subscriber {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = zmqTestLog()
	}
	sub, err := NewSubscriber(src, sink, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	if src.Replay != "" {
		// Each connection first fetches what the replay buffer holds; the test's batches
		// come after, so that which way they arrive (live or replayed) is fixed.
		waitCaughtUp(t, sub.s)
	}
	return sub
}

// waitCaughtUp waits until every rank of s has made its first connection's catch-up.
func waitCaughtUp(t testing.TB, s *engineStream) {
	t.Helper()
	eventually(t, "the first catch-up over", func() bool {
		for _, rl := range s.ranks {
			if !rl.caughtUp.Load() {
				return false
			}
		}
		return true
	})
}

func subReady(sub *Subscriber, rank int) func() bool {
	return func() bool { return sub.Stats().Ranks[rank].Counters.Messages > 0 }
}

// waitEvents waits until the sink holds want, then checks it does exactly.
func waitEvents(t *testing.T, sink *recSink, want []string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d events", len(want)), func() bool { return sink.count() >= len(want) })
	if got := sink.events(); !slices.Equal(got, want) {
		t.Fatalf("events:\n got  %s\n want %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
	}
}

func checkStats(t *testing.T, got EngineStats, want map[string]int64) {
	t.Helper()
	if d := statsDiff(got, want); d != "" {
		t.Error(d)
	}
}

// statsDiff names the first counter of got that is not want's, "" when all are.
func statsDiff(got EngineStats, want map[string]int64) string {
	have := map[string]int64{
		"batches": got.Batches, "events": got.Events, "replayed": got.Replayed, "decode": got.DecodeErrors,
		"undelivered": got.Undelivered, "gaps": got.Gaps, "recovered": got.GapsRecovered,
		"unrecovered": got.GapsUnrecovered, "restarts": got.Restarts, "replays": got.ReplayRequests,
		"clears": got.Clears, "kept": got.GapsKept,
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if have[k] != want[k] {
			return fmt.Sprintf("stats %s = %d, want %d (%+v)", k, have[k], want[k], got)
		}
	}
	return ""
}

func TestSeqTracker(t *testing.T) {
	const none = ^uint64(0) // no batch accepted yet
	f := func(last uint64, reconnected bool, seq uint64, want seqVerdict) {
		t.Helper()
		var tr seqTracker
		if last != none {
			tr.accept(last)
		}
		if reconnected {
			tr.disconnected()
		}
		if got := tr.classify(seq); got != want {
			t.Errorf("last %d reconnected %v: classify(%d) = %v, want %v", int64(last), reconnected, seq, got, want)
		}
	}
	f(none, false, 0, seqFirst)
	f(none, false, 7, seqFirst)
	f(none, true, 7, seqFirst)
	f(5, false, 6, seqNext)
	f(5, false, 9, seqGap)
	f(5, false, 5, seqDuplicate)
	f(5, false, 3, seqDuplicate)
	f(5, false, 0, seqRestart)
	f(0, false, 0, seqDuplicate) // the probe repeated: nothing was handed on in between
	f(0, false, 1, seqNext)
	f(0, false, 2, seqGap)
	f(5, true, 6, seqNext)
	f(5, true, 9, seqGap)
	f(5, true, 5, seqRestart)
	f(5, true, 3, seqRestart)
	f(5, true, 0, seqRestart)
	f(0, true, 0, seqRestart)
	f(none-1, false, none, seqNext)
	f(none, false, 0, seqFirst)

	// accept clears the reconnect.
	var tr seqTracker
	tr.accept(5)
	tr.disconnected()
	tr.accept(2)
	if got := tr.classify(2); got != seqDuplicate {
		t.Errorf("after a restart was accepted: %v, want duplicate", got)
	}
	// A sequence at the top of the range wraps to a restart, never to "next".
	tr.accept(^uint64(0))
	if got := tr.classify(0); got != seqRestart {
		t.Errorf("0 after 2^64-1: %v, want restart", got)
	}
}

func TestParseEngineSource(t *testing.T) {
	ok := func(s string, want EngineSource) {
		t.Helper()
		got, err := ParseEngineSource(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if got != want {
			t.Fatalf("%q: got %+v, want %+v", s, got, want)
		}
		again, err := ParseEngineSource(got.String())
		if err != nil || again != got {
			t.Fatalf("%q: String %q reads back as %+v, %v", s, got.String(), again, err)
		}
	}
	ok("worker=7,model=llama,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,ranks=2",
		EngineSource{Worker: 7, Model: "llama", Endpoint: "tcp://10.0.0.5:5557", Replay: "tcp://10.0.0.5:5558", Ranks: 2})
	ok(" model = meta-llama/Llama-3.1-8B , endpoint=tcp://[::1]:5557,worker=18446744073709551615,topic=kv@,",
		EngineSource{Worker: 1<<64 - 1, Model: "meta-llama/Llama-3.1-8B", Endpoint: "tcp://[::1]:5557", Ranks: 1, Topic: "kv@"})
	ok("worker=0,model=m,endpoint=ipc:///tmp/kv.sock", EngineSource{Model: "m", Endpoint: "ipc:///tmp/kv.sock", Ranks: 1})
	ok("worker=3,model=m,endpoint=tcp://h:5558,rank=1", EngineSource{Worker: 3, Model: "m", Endpoint: "tcp://h:5558", Ranks: 1, FirstRank: 1})

	bad := func(s, key string) {
		t.Helper()
		_, err := ParseEngineSource(s)
		if err == nil || !errors.Is(err, ErrEngineSource) || !strings.Contains(err.Error(), fmt.Sprintf("key %q", key)) {
			t.Errorf("%q: error %v, want one naming key %q", s, err, key)
		}
	}
	const base = "worker=7,model=llama,endpoint=tcp://h:5557"
	bad("model=llama,endpoint=tcp://h:5557", "worker")
	bad("worker=7,endpoint=tcp://h:5557", "model")
	bad("worker=7,model=llama", "endpoint")
	bad(base+",worker=8", "worker")
	bad("worker=x,model=llama,endpoint=tcp://h:5557", "worker")
	bad("worker=-1,model=llama,endpoint=tcp://h:5557", "worker")
	bad("worker=7,model=,endpoint=tcp://h:5557", "model")
	bad(base+",ranks=0", "ranks")
	bad(base+",ranks=two", "ranks")
	bad(base+",ranks=257", "ranks")
	bad(base+",color=red", "color")
	bad(base+",rank=-1", "rank")
	bad(base+",replay", "replay")
	bad("worker=7,model=llama,endpoint=h:5557", "endpoint")
	bad("worker=7,model=llama,endpoint=tcp://*:5557", "endpoint")
	bad("worker=7,model=llama,endpoint=tcp://h:0", "endpoint")
	bad("worker=7,model=llama,endpoint=tcp://h:70000", "endpoint")
	bad("worker=7,model=llama,endpoint=tcp://h:65535,ranks=2", "endpoint")
	bad("worker=7,model=llama,endpoint=ipc:///tmp/kv,ranks=2", "endpoint")
	bad(base+",replay=udp://h:5558", "replay")
	bad(base+",replay=tcp://h", "replay")
}

func FuzzParseEngineSource(f *testing.F) {
	f.Add("worker=7,model=llama,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,ranks=2")
	f.Add("worker=1,model=m,endpoint=ipc:///tmp/x,topic=t")
	f.Add("worker=1,model=a=b,endpoint=tcp://[::1]:1,ranks=65535")
	f.Fuzz(func(t *testing.T, s string) {
		src, err := ParseEngineSource(s)
		if err != nil {
			if !errors.Is(err, ErrEngineSource) {
				t.Fatalf("%q: %v does not wrap ErrEngineSource", s, err)
			}
			return
		}
		again, err := ParseEngineSource(src.String())
		if err != nil || again != src {
			t.Fatalf("%q: %+v prints as %q, which reads back as %+v, %v", s, src, src.String(), again, err)
		}
	})
}

// TestSubscriberFlow: stored and removed events, in every form an engine writes, reach the
// sink in order with the worker, model, rank, hashes and tokens.
func TestSubscriberFlow(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{Topic: "kv@0"})
	sink := &recSink{}
	sub := startSub(t, source(t, eng, 7, "llama"), sink, EngineConfig{})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))

	b1 := engineBatch(-1, stored(0, 11, 12), stored(12, 13, 14))
	b2 := engineBatch(-1, removed(14))
	b3 := engineBatch(0, stored(0, 1<<63+5), removed(11, 12))
	r.Publish(b1, wire.EngineForm{})
	r.Publish(b2, wire.EngineForm{MapBatch: true, MapEvents: true})
	r.Publish(b3, wire.EngineForm{MapEvents: true, Hashes: wire.HashBytes32})

	want := slices.Concat(lines(0, b1), lines(0, b2), lines(0, b3))
	waitEvents(t, sink, want)
	for _, c := range sink.snapshot() {
		if c.worker != 7 || c.model != "llama" {
			t.Errorf("call for worker %d model %q, want 7 llama", c.worker, c.model)
		}
	}
	st := sub.Stats()
	checkStats(t, st, map[string]int64{"batches": 4, "events": int64(len(want)), "gaps": 0, "decode": 0, "clears": 0, "restarts": 0})
	if st.Ranks[0].LastSeq != 3 || !st.Ranks[0].Connected {
		t.Errorf("rank stats %+v, want connected at seq 3", st.Ranks[0])
	}
	if st.Messages-st.Duplicates != 4 {
		t.Errorf("%d messages, %d duplicates: want 4 handed on", st.Messages, st.Duplicates)
	}
}

// TestSubscriberReplay: batches the PUB socket dropped come back from the replay socket, in
// order, before the message that revealed the gap; for both reply shapes.
func TestSubscriberReplay(t *testing.T) {
	for _, topic := range []bool{false, true} {
		t.Run(fmt.Sprintf("replyTopic=%v", topic), func(t *testing.T) {
			eng := enginetest.Start(t, enginetest.Options{Replay: true, ReplyTopic: topic, Topic: "kv"})
			sink := &recSink{}
			sub := startSub(t, source(t, eng, 3, "m"), sink, EngineConfig{})
			r := eng.Rank(0)
			r.Probe(subReady(sub, 0))

			var bs []*wire.EngineBatch
			for i := range 6 {
				bs = append(bs, engineBatch(-1, stored(0, uint64(100+i))))
			}
			r.Publish(bs[0], wire.EngineForm{}) // 1
			r.Drop(bs[1], wire.EngineForm{})    // 2
			r.Drop(bs[2], wire.EngineForm{})    // 3
			r.Drop(bs[3], wire.EngineForm{})    // 4
			r.Publish(bs[4], wire.EngineForm{}) // 5: reveals the gap
			r.Publish(bs[5], wire.EngineForm{}) // 6

			var want []string
			for _, b := range bs {
				want = append(want, lines(0, b)...)
			}
			waitEvents(t, sink, want)
			checkStats(t, sub.Stats(), map[string]int64{"gaps": 1, "recovered": 1, "unrecovered": 0, "replays": 2, "replayed": 3, "clears": 0, "batches": 7})
		})
	}
}

// TestSubscriberReplayFails: when the replay socket cannot close the gap (its buffer no longer
// reaches back, it does not answer, or it is down), the rank is cleared before the message
// that revealed the gap.
func TestSubscriberReplayFails(t *testing.T) {
	for _, how := range []string{"forgotten", "silent", "down"} {
		t.Run(how, func(t *testing.T) {
			eng := enginetest.Start(t, enginetest.Options{Replay: true})
			src := source(t, eng, 3, "m")
			r := eng.Rank(0)
			switch how {
			case "forgotten":
				r.Forget(3) // batch 2 has left the buffer
			case "silent":
				r.Silence()
			case "down":
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				src.Replay = "tcp://" + l.Addr().String()
				l.Close()
			}
			sink := &recSink{}
			sub := startSub(t, src, sink, EngineConfig{ReplayTimeout: 200 * time.Millisecond})
			r.Probe(subReady(sub, 0))

			b1, b2, b3, b4 := engineBatch(-1, stored(0, 1)), engineBatch(-1, stored(0, 2)), engineBatch(-1, stored(0, 3)), engineBatch(-1, stored(0, 4))
			r.Publish(b1, wire.EngineForm{})
			r.Drop(b2, wire.EngineForm{})
			r.Drop(b3, wire.EngineForm{})
			r.Publish(b4, wire.EngineForm{})
			waitEvents(t, sink, slices.Concat(lines(0, b1), []string{cleared(0)}, lines(0, b4)))
			checkStats(t, sub.Stats(), map[string]int64{"gaps": 1, "recovered": 0, "unrecovered": 1, "replays": 2, "replayed": 0, "clears": 1})
		})
	}
}

// TestSubscriberGapNoReplay: without a replay socket a gap clears the rank.
func TestSubscriberGapNoReplay(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{})
	sink := &recSink{}
	sub := startSub(t, source(t, eng, 3, "m"), sink, EngineConfig{})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))

	b1, b2, b3 := engineBatch(-1, stored(0, 1)), engineBatch(-1, stored(0, 2)), engineBatch(-1, stored(0, 3))
	r.Publish(b1, wire.EngineForm{})
	r.Drop(b2, wire.EngineForm{})
	r.Publish(b3, wire.EngineForm{})
	waitEvents(t, sink, slices.Concat(lines(0, b1), []string{cleared(0)}, lines(0, b3)))
	checkStats(t, sub.Stats(), map[string]int64{"gaps": 1, "unrecovered": 1, "replays": 0, "clears": 1, "restarts": 0})
	if got := sub.Stats().Ranks[0].LastSeq; got != 3 {
		t.Errorf("last seq %d, want 3", got)
	}
}

// TestSubscriberRestart: the sequence going back to 0 on the same connection clears the rank.
func TestSubscriberRestart(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{})
	sink := &recSink{}
	sub := startSub(t, source(t, eng, 3, "m"), sink, EngineConfig{})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))

	b1, b2, b3, b4 := engineBatch(-1, stored(0, 1)), engineBatch(-1, stored(1, 2)), engineBatch(-1, stored(0, 3)), engineBatch(-1, stored(3, 4))
	r.Publish(b1, wire.EngineForm{})
	r.Publish(b2, wire.EngineForm{})
	r.ResetSeq()
	r.Publish(b3, wire.EngineForm{}) // 0
	r.Publish(b4, wire.EngineForm{}) // 1
	waitEvents(t, sink, slices.Concat(lines(0, b1), lines(0, b2), []string{cleared(0)}, lines(0, b3), lines(0, b4)))
	checkStats(t, sub.Stats(), map[string]int64{"restarts": 1, "clears": 1, "gaps": 0})
}

// TestSubscriberReconnect: the engine goes away and comes back on the same port, numbering from
// 0; the subscriber connects again by itself and clears the rank, even though it missed the
// new engine's first batches.
func TestSubscriberReconnect(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{})
	sink := &recSink{}
	sub := startSub(t, source(t, eng, 3, "m"), sink, EngineConfig{})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))

	b1, b2, b3 := engineBatch(-1, stored(0, 1)), engineBatch(-1, stored(1, 2)), engineBatch(-1, stored(0, 3))
	r.Publish(b1, wire.EngineForm{})
	r.Publish(b2, wire.EngineForm{})
	waitEvents(t, sink, slices.Concat(lines(0, b1), lines(0, b2)))

	r.Restart()
	// Lost to the reconnect: batches 0 and 1 of the new engine.
	r.Drop(engineBatch(-1), wire.EngineForm{})
	r.Drop(engineBatch(-1), wire.EngineForm{})
	// Batch 2 of the new engine, repeated until the subscriber is back: it goes back from 2.
	payload := wire.AppendEngineBatch(nil, b3, wire.EngineForm{})
	seq := r.Record(payload)
	for sub.Stats().Restarts == 0 {
		r.Send(nil, be8(seq), payload)
		time.Sleep(2 * time.Millisecond)
	}
	waitEvents(t, sink, slices.Concat(lines(0, b1), lines(0, b2), []string{cleared(0)}, lines(0, b3)))
	st := sub.Stats()
	checkStats(t, st, map[string]int64{"restarts": 1, "clears": 1, "gaps": 0})
	if st.Disconnects < 1 {
		t.Errorf("%d disconnects, want at least 1", st.Disconnects)
	}
}

// TestSubscriberRanks: with ranks=2 the subscriber reads port and port+1; a batch without a
// rank takes its socket's, one that states a rank keeps it; a gap on rank 1 is filled from
// replay port + 1.
func TestSubscriberRanks(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{Ranks: 2, Replay: true})
	sink := &recSink{}
	sub := startSub(t, source(t, eng, 9, "m"), sink, EngineConfig{})
	r0, r1 := eng.Rank(0), eng.Rank(1)
	r0.Probe(subReady(sub, 0))
	r1.Probe(subReady(sub, 1))

	var want []string
	step := func(r *enginetest.Rank, b *wire.EngineBatch, rank uint32, fm wire.EngineForm) {
		t.Helper()
		r.Publish(b, fm)
		want = append(want, lines(rank, b)...)
		waitEvents(t, sink, want)
	}
	step(r0, engineBatch(-1, stored(0, 1, 2)), 0, wire.EngineForm{})
	step(r1, engineBatch(1, stored(0, 3)), 1, wire.EngineForm{MapBatch: true})
	step(r1, engineBatch(-1, stored(3, 4)), 1, wire.EngineForm{})
	step(r0, engineBatch(1, removed(3)), 1, wire.EngineForm{}) // states rank 1 on rank 0's socket
	step(r0, engineBatch(0, removed(2)), 0, wire.EngineForm{})

	missed := engineBatch(-1, stored(4, 5))
	r1.Drop(missed, wire.EngineForm{})
	last := engineBatch(1, stored(5, 6))
	r1.Publish(last, wire.EngineForm{})
	want = slices.Concat(want, lines(1, missed), lines(1, last))
	waitEvents(t, sink, want)

	st := sub.Stats()
	checkStats(t, st, map[string]int64{"gaps": 1, "recovered": 1, "replayed": 1, "clears": 0})
	if st.Ranks[0].LastSeq != 3 || st.Ranks[1].LastSeq != 4 {
		t.Errorf("last seqs %d and %d, want 3 and 4", st.Ranks[0].LastSeq, st.Ranks[1].LastSeq)
	}
}

// TestSubscriberRanksRestart: when both ranks of an engine restart, each clears its own rank
// before its next batch, and only its own: rank 1's clear leaves what rank 0 delivered after
// its clear.
func TestSubscriberRanksRestart(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{Ranks: 2})
	sink := &recSink{}
	sub := startSub(t, source(t, eng, 9, "m"), sink, EngineConfig{})
	r0, r1 := eng.Rank(0), eng.Rank(1)
	r0.Probe(subReady(sub, 0))
	r1.Probe(subReady(sub, 1))

	var want []string
	step := func(r *enginetest.Rank, b *wire.EngineBatch, rank uint32, extra ...string) {
		t.Helper()
		r.Publish(b, wire.EngineForm{})
		want = slices.Concat(want, extra, lines(rank, b))
		waitEvents(t, sink, want)
	}
	step(r0, engineBatch(-1, stored(0, 1)), 0)
	step(r1, engineBatch(-1, stored(0, 2)), 1)
	r0.ResetSeq()
	r1.ResetSeq()
	step(r0, engineBatch(-1, stored(0, 3)), 0, cleared(0))
	step(r1, engineBatch(-1, stored(0, 4)), 1, cleared(1))
	step(r1, engineBatch(-1, stored(4, 5)), 1)
	// A later gap on rank 1 (no replay socket) clears rank 1 again.
	r1.Drop(engineBatch(-1, stored(5, 6)), wire.EngineForm{})
	step(r1, engineBatch(-1, stored(0, 7)), 1, cleared(1))
	checkStats(t, sub.Stats(), map[string]int64{"restarts": 2, "unrecovered": 1, "clears": 3})
}

// TestSubscriberMalformed: malformed messages are counted and dropped; the stream goes on.
func TestSubscriberMalformed(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{})
	sink := &recSink{}
	sub := startSub(t, source(t, eng, 3, "m"), sink, EngineConfig{})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))

	b1, b3 := engineBatch(-1, stored(0, 1)), engineBatch(-1, stored(1, 2))
	r.Publish(b1, wire.EngineForm{})
	bad := r.Record([]byte{0x93, 0xcb}) // [ts, ...: the payload ends inside ts
	r.Send(nil, be8(bad), []byte{0x93, 0xcb})
	r.Send(nil, be8(bad+1))                                // two frames
	r.Send(nil, []byte{0, 0, 0, 0, 0, 0, 3}, []byte{0x90}) // a 7-byte sequence
	r.Send(nil, be8(bad+1), []byte{0x92, 0xc3, 0x90}, nil) // four frames
	r.Publish(b3, wire.EngineForm{})                       // bad + 1: no gap
	waitEvents(t, sink, slices.Concat(lines(0, b1), lines(0, b3)))
	checkStats(t, sub.Stats(), map[string]int64{"decode": 4, "gaps": 0, "clears": 0, "batches": 3})
}

// TestSubscriberRouter feeds a real router.Router and checks its index.
func TestSubscriberRouter(t *testing.T) {
	rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
	defer rt.Close()
	eng := enginetest.Start(t, enginetest.Options{Ranks: 2})
	sub := startSub(t, source(t, eng, 42, "llama"), rt, EngineConfig{})
	r0, r1 := eng.Rank(0), eng.Rank(1)
	r0.Probe(subReady(sub, 0))
	r1.Probe(subReady(sub, 1))

	prompt := blockTokens([]uint64{1, 2, 3, 4})
	match := func(batches int64, want map[uint32]uint32) {
		t.Helper()
		eventually(t, "batches handed on", func() bool { return sub.Stats().Batches >= batches })
		if err := rt.Flush(); err != nil {
			t.Fatal(err)
		}
		var resp wire.RouteResponse
		if err := rt.Match(&wire.RouteRequest{Model: "llama", Tokens: prompt}, &resp); err != nil {
			t.Fatal(err)
		}
		got := map[uint32]uint32{}
		for _, c := range resp.Candidates {
			if c.Worker != 42 {
				t.Fatalf("candidate worker %d", c.Worker)
			}
			got[c.Rank] = c.CachedBlocks
		}
		for rank, n := range want {
			if got[rank] != n {
				t.Errorf("rank %d: %d cached blocks, want %d (all: %v)", rank, got[rank], n, got)
			}
		}
	}
	r0.Publish(engineBatch(-1, stored(0, 1, 2), stored(2, 3)), wire.EngineForm{})
	r1.Publish(engineBatch(1, stored(0, 1)), wire.EngineForm{MapBatch: true, MapEvents: true})
	match(4, map[uint32]uint32{0: 3, 1: 1})

	r0.Publish(engineBatch(-1, removed(3)), wire.EngineForm{})
	match(5, map[uint32]uint32{0: 2, 1: 1})

	// Rank 0's engine restarts: its blocks are cleared, rank 1's stay (each rank is its own
	// cache), and rank 1 still chains onto its own earlier block.
	r0.ResetSeq()
	r0.Publish(engineBatch(-1, stored(0, 1)), wire.EngineForm{})
	match(6, map[uint32]uint32{0: 1, 1: 1})
	r1.Publish(engineBatch(1, stored(1, 2)), wire.EngineForm{MapBatch: true, MapEvents: true})
	match(7, map[uint32]uint32{0: 1, 1: 2})
	checkStats(t, sub.Stats(), map[string]int64{"restarts": 1, "clears": 1, "undelivered": 0})
}

// nopSink takes events and keeps nothing.
type nopSink struct{}

func (nopSink) Ingest(uint64, string, []kvevent.Event) error { return nil }

// TestSubscriberAllocs: past zmq4, which allocates every frame it reads, handling a live
// message allocates nothing.
func TestSubscriberAllocs(t *testing.T) {
	sub, err := NewSubscriber(EngineSource{Worker: 1, Model: "m", Endpoint: "tcp://127.0.0.1:1", Ranks: 1}, nopSink{}, EngineConfig{Logger: zmqTestLog()})
	if err != nil {
		t.Fatal(err)
	}
	rl := sub.s.ranks[0]
	var evs []kvevent.Event
	for i := range 8 {
		evs = append(evs, stored(uint64(i*10), uint64(i*10+1), uint64(i*10+2)), removed(uint64(i)))
	}
	payload := wire.AppendEngineBatch(nil, engineBatch(-1, evs...), wire.EngineForm{MapEvents: true})
	frames := [][]byte{nil, make([]byte, 8), payload}
	seq := uint64(0)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		binary.BigEndian.PutUint64(frames[1], seq)
		seq++
		rl.handle(ctx, frames)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per message, want 0", allocs)
	}
	checkStats(t, sub.Stats(), map[string]int64{"decode": 0, "gaps": 0})
}
