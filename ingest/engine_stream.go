package ingest

// Direct ZMQ ingestion: a Subscriber reads one engine's KV-event sockets (wire/SPEC.md §10.1)
// and hands the decoded events to the router; a Bridge (bridge.go) forwards the same batches to
// JetStream instead. Both run an engineStream: per data-parallel rank, one goroutine that owns a
// SUB socket, a seqTracker and, while it recovers missed batches, a DEALER socket on the
// engine's replay buffer. This file holds the stream and its rank loops (connect, redial,
// receive, deliver); engine_source.go what a stream reads, engine_seq.go restart and gap
// detection, engine_replay.go the replay, engine_stats.go the counters, zmtp.go the guard
// beneath zmq4, subscriber.go and bridge.go the two outputs, engines.go the registry.
//
// Order. The batches of one rank reach the output in the engine's sequence order, replayed ones
// included: the rank's goroutine hands them on itself, one at a time. The ranks of one engine
// share a mutex around the output, so that the worker's batches and clears reach it in a single
// order.
//
// Clears. Each (worker, rank) is its own cache: a rank whose batches were lost for good (a gap
// the replay cannot close, a batch the output lost, a panic mid-batch) or whose engine restarted
// clears that rank alone, before its next batch. The worker's other ranks keep their blocks.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouterd/kvrouterd/internal/panics"
	"github.com/kvrouterd/kvrouterd/internal/pause"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// errLost marks an output error after which the batch is gone for good: the rank must be
// cleared before its next batch reaches the output.
var errLost = errors.New("ingest: batch lost")

// engineOutput is where an engineStream hands batches: a Subscriber's sink or a Bridge's
// JetStream.
type engineOutput interface {
	// prepare readies the batch about to be handed on, outside the stream's lock; false drops
	// it (and the output has counted why). Called only by rl's goroutine.
	prepare(rl *rankLoop, seq uint64, payload []byte) bool
	// sendLocked hands on the batch prepared last by rl. An error wrapping errLost means the
	// batch is gone and the rank must be cleared before its next one. REQUIRES
	// engineStream.mu.
	sendLocked(ctx context.Context, rl *rankLoop, seq uint64, payload []byte) error
	// clearLocked hands on a cleared event of rl's rank. REQUIRES engineStream.mu.
	clearLocked(ctx context.Context, rl *rankLoop) error
}

// engineStream subscribes to every rank of one EngineSource and keeps each rank's sequence;
// see the file comment. Its counters are safe to read concurrently.
type engineStream struct {
	src   EngineSource
	cfg   EngineConfig
	log   *slog.Logger
	zlog  *log.Logger // zmq4's own messages, at debug level
	out   engineOutput
	ranks []*rankLoop

	mu sync.Mutex // held around every call of out's ...Locked methods
}

func newEngineStream(src EngineSource, cfg EngineConfig, out engineOutput) (*engineStream, error) {
	if err := src.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	s := &engineStream{src: src, cfg: cfg, out: out}
	s.log = cfg.Logger.With("worker", src.Worker, "model", src.Model)
	s.zlog = slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	for r := range src.Ranks {
		rank := src.FirstRank + uint32(r)
		rl := &rankLoop{s: s, rank: rank, endpoint: rankEndpoint(src.Endpoint, r), log: s.log.With("rank", rank)}
		if cfg.Resume != nil {
			if next := cfg.Resume(src.Worker, rank); next > 0 {
				rl.tracker.resume(next - 1)
			}
		}
		if src.Replay != "" {
			rl.replay = rankEndpoint(src.Replay, r)
		}
		s.ranks = append(s.ranks, rl)
	}
	return s, nil
}

// run runs every rank until ctx is done.
func (s *engineStream) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, rl := range s.ranks {
		wg.Go(func() { rl.run(ctx) })
	}
	wg.Wait()
}

// newLimit returns a fresh limit for one socket of the stream.
func (s *engineStream) newLimit() *zmtpLimit {
	return newLimit(s.cfg.MaxMessageBytes, s.cfg.StallTimeout)
}

func (s *engineStream) socketOptions() []zmq4.Option {
	return []zmq4.Option{
		zmq4.WithLogger(s.zlog),
		zmq4.WithDialerTimeout(s.cfg.DialTimeout),
		// One attempt per Dial: rankLoop.connect retries itself, without blocking Close.
		zmq4.WithDialerMaxRetries(0),
	}
}

func (s *engineStream) stats() EngineStats {
	var sum countValues
	ranks := make([]RankStats, len(s.ranks))
	for i, rl := range s.ranks {
		v := rl.c.load()
		sum.add(&v)
		ranks[i] = RankStats{Rank: rl.rank, Connected: rl.connected.Load(), LastSeq: rl.lastSeq.Load(), Counters: v.stats()}
	}
	st := sum.stats()
	st.Ranks = ranks
	return st
}

// clear clears rl's rank now, or before its next batch if the output fails now.
func (rl *rankLoop) clear(ctx context.Context) {
	rl.owed = true
	rl.s.mu.Lock()
	defer rl.s.mu.Unlock()
	rl.clearLocked(ctx)
}

// clearLocked hands on the clear owed; false if the output failed, in which case the clear
// stays owed. REQUIRES engineStream.mu.
func (rl *rankLoop) clearLocked(ctx context.Context) bool {
	if err := rl.s.out.clearLocked(ctx, rl); err != nil {
		if ctx.Err() == nil {
			rl.warn("clear not delivered; it is retried before the next batch", "err", err)
		}
		return false
	}
	rl.owed = false
	rl.c[cClears].Add(1)
	return true
}

// rankLoop is the goroutine of one data-parallel rank and everything it owns.
type rankLoop struct {
	s        *engineStream
	rank     uint32
	endpoint string // PUB
	replay   string // ROUTER; "" without replay
	log      *slog.Logger

	// Owned by the goroutine.
	tracker    seqTracker
	batch      wire.EngineBatch // the Subscriber's decode buffer
	clearEv    [1]kvevent.Event
	gate       time.Time // warn is quiet until then
	suppressed int       // warnings not logged since the last one

	owed bool // the rank must be cleared before its next batch

	c         engineCounters
	connected atomic.Bool
	caughtUp  atomic.Bool // the first connection's catch-up is over (for tests)
	lastSeq   atomic.Uint64
	health    rankHealth
}

func (rl *rankLoop) run(ctx context.Context) {
	var backoff time.Duration
	for {
		if backoff > 0 && !pause.For(ctx, backoff) {
			return
		}
		ok, clean, err := rl.session(ctx)
		if !ok || ctx.Err() != nil {
			return
		}
		// A connection that ended in a refused message, a stall, a protocol error or a panic,
		// or that delivered nothing, is dialled again after a growing wait: a hostile or broken
		// peer cannot keep kvrouterd reconnecting in a tight loop.
		if clean {
			backoff = 0
		} else {
			backoff = min(max(2*backoff, redialMin), rl.s.cfg.RedialMax)
		}
		rl.c[cDisconnects].Add(1)
		rl.tracker.disconnected()
		rl.warn("engine connection lost; reconnecting", "endpoint", rl.endpoint, "err", err, "wait", backoff)
	}
}

// session connects and handles the socket's messages until the connection fails. ok is false
// once ctx is done before a connection was made; clean is true when the connection delivered
// batches and then was lost, rather than refused by the guard. A panic while handling a message
// ends the session only: it is logged and counted, and the rank is cleared before its next
// batch, since the panic may have cut a batch short.
func (rl *rankLoop) session(ctx context.Context) (ok, clean bool, err error) {
	sock, lim := rl.connect(ctx)
	if sock == nil {
		return false, false, nil
	}
	// zmq4 does not reconnect a SUB socket by itself unless asked to, and when asked it
	// redials from inside the failed connection's reader, so that messages of the new
	// connection can overtake the news of the old one's loss. A fresh socket per session keeps
	// the order: everything received from here on is after the loss.
	defer sock.Close()
	rl.health.connecting()
	rl.connected.Store(true)
	defer rl.connected.Store(false)
	before := rl.c[cBatches].Load()
	defer func() {
		if p := recover(); p != nil {
			ok, clean, err = true, false, rl.recovered(p)
			rl.owed = true
		}
		rl.caughtUp.Store(true)
	}()
	if rl.replay != "" {
		rl.catchUp(ctx)
	}
	rl.caughtUp.Store(true)
	err = rl.receive(ctx, sock, lim)
	return true, rl.count(err) && rl.c[cBatches].Load() > before, err
}

// count counts a connection's end by its cause; false when the guard or ZMTP refused it.
func (rl *rankLoop) count(err error) bool {
	switch {
	case errors.Is(err, ErrZMQMessageTooLarge):
		rl.c[cOversized].Add(1)
	case errors.Is(err, ErrZMQStalled):
		rl.c[cStalled].Add(1)
	case errors.Is(err, errZMTP):
		rl.c[cProtocolErrors].Add(1)
	case errors.Is(err, errPanic):
		// counted by recovered
	default:
		return true
	}
	return false
}

// connect returns a SUB socket connected to the rank's PUB socket and its limit, trying until
// it succeeds; nil once ctx is done.
func (rl *rankLoop) connect(ctx context.Context) (zmq4.Socket, *zmtpLimit) {
	wait := redialMin
	for attempt := 0; ; attempt++ {
		sock, lim, err := rl.dial(ctx)
		if err == nil {
			rl.log.Info("subscribed to engine KV events", "endpoint", rl.endpoint, "topic", rl.s.src.Topic)
			return sock, lim
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		rl.count(err)
		if attempt == 0 {
			rl.warn("engine KV-event socket unreachable; retrying", "endpoint", rl.endpoint, "err", err)
		} else {
			rl.log.Debug("engine KV-event socket still unreachable", "endpoint", rl.endpoint, "err", err)
		}
		if !pause.For(ctx, wait) {
			return nil, nil
		}
		wait = min(2*wait, rl.s.cfg.RedialMax)
	}
}

// dial makes one attempt to connect. zmq4 parses the peer's handshake inside Dial, and
// malformed metadata can panic it: that is an error of this attempt like any other.
func (rl *rankLoop) dial(ctx context.Context) (sock zmq4.Socket, lim *zmtpLimit, err error) {
	lim = rl.s.newLimit()
	sock = zmq4.NewSub(withLimit(ctx, lim), rl.s.socketOptions()...)
	defer func() {
		if p := recover(); p != nil {
			err = rl.recovered(p)
		}
		if err != nil {
			sock.Close()
			sock, lim = nil, nil
		}
	}()
	if err = sock.SetOption(zmq4.OptionSubscribe, rl.s.src.Topic); err == nil {
		err = sock.Dial(guardedEndpoint(rl.endpoint))
	}
	return sock, lim, err
}

// errPanic is wrapped by the error a recovered panic becomes.
var errPanic = errors.New("ingest: panic")

// recovered counts and logs a panic recovered on rl's goroutine and returns it as an error.
func (rl *rankLoop) recovered(p any) error {
	rl.c[cPanics].Add(1)
	panics.Log(rl.log, "panic recovered while reading an engine's KV events; its connection is dialled again", p, "endpoint", rl.endpoint)
	return fmt.Errorf("%w: %v", errPanic, p)
}

// receive handles the socket's messages until it fails: the connection was lost, or ctx is
// done. Each message's bytes go back to lim once handled.
func (rl *rankLoop) receive(ctx context.Context, sock zmq4.Socket, lim *zmtpLimit) error {
	for {
		msg, err := sock.Recv()
		if err != nil {
			return err
		}
		if msg.Type != zmq4.CmdMsg { // ZMTP commands (heartbeats) come through zmq4's reader too
			rl.handle(ctx, msg.Frames)
		}
		lim.releaseMsg(msg)
	}
}

// handle handles one live message: [topic, seq, payload].
func (rl *rankLoop) handle(ctx context.Context, frames [][]byte) {
	rl.c[cMessages].Add(1)
	if len(frames) != 3 {
		rl.dropMalformed(0, &wire.Error{Msg: "engine frames", Field: "frames", Offset: -1, Err: wire.ErrInvalid,
			Detail: fmt.Sprintf("%d frames, want [topic, seq, payload]", len(frames))})
		return
	}
	seq, err := wire.ParseEngineSeq(frames[1])
	if err != nil {
		rl.dropMalformed(0, err)
		return
	}
	switch v := rl.tracker.classify(seq); v {
	case seqFirst:
		if rl.replay != "" && seq > 0 {
			rl.history(ctx, seq)
		}
	case seqDuplicate:
		rl.c[cDuplicates].Add(1)
		return
	case seqRestart:
		rl.c[cRestarts].Add(1)
		rl.log.Warn("engine restarted (its batch sequence went back); the rank's blocks are cleared", "seq", seq, "last", rl.tracker.last)
		rl.clear(ctx)
		if rl.replay != "" && seq > 0 {
			rl.restarted(ctx, seq)
		}
	case seqGap:
		rl.c[cGaps].Add(1)
		rl.recover(ctx, seq)
	}
	rl.deliver(ctx, seq, frames[2], false)
}

// deliver moves the cursor to seq and hands the batch on. The sequence that Stats reports moves
// once the batch is with the sink (or given up), so that a reader who sees it can flush the
// sink and find the batch applied.
func (rl *rankLoop) deliver(ctx context.Context, seq uint64, payload []byte, replayed bool) {
	s := rl.s
	rl.tracker.accept(seq)
	defer rl.lastSeq.Store(seq)
	if !s.out.prepare(rl, seq, payload) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rl.owed && !rl.clearLocked(ctx) {
		rl.c[cUndelivered].Add(1)
		return
	}
	if err := s.out.sendLocked(ctx, rl, seq, payload); err != nil {
		rl.c[cUndelivered].Add(1)
		if errors.Is(err, errLost) {
			rl.owed = true
		}
		if ctx.Err() == nil {
			rl.warn("engine batch not delivered", "seq", seq, "err", err)
		}
		return
	}
	rl.c[cBatches].Add(1)
	rl.health.batch()
	if replayed {
		rl.c[cReplayed].Add(1)
	}
}

// dropMalformed counts and logs a message that cannot be read. The cursor stays where the
// message's sequence put it: its events are lost, but no batch went missing in transport.
func (rl *rankLoop) dropMalformed(seq uint64, err error) {
	rl.c[cDecodeErrors].Add(1)
	field := ""
	var we *wire.Error
	if errors.As(err, &we) {
		field = we.Field
	}
	rl.warn("malformed engine message dropped", "seq", seq, "field", field, "err", err)
}

// warn logs at warn level at most once a second per rank, so that an engine sending garbage
// at thousands of batches a second cannot flood the log; the next warning that gets through
// says how many were left out. Called only by rl's goroutine.
func (rl *rankLoop) warn(msg string, args ...any) {
	now := time.Now()
	if now.Before(rl.gate) {
		rl.suppressed++
		return
	}
	rl.gate = now.Add(time.Second)
	if rl.suppressed > 0 {
		args = append(args, "suppressed", rl.suppressed)
		rl.suppressed = 0
	}
	rl.log.Warn(msg, args...)
}

// EventSink receives a Subscriber's events: router.Router is one. Ingest may keep nothing of
