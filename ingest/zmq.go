package ingest

// Direct ZMQ ingestion: a Subscriber reads one engine's KV-event sockets (wire/SPEC.md §10.1)
// and hands the decoded events to the router; a Bridge (bridge.go) forwards the same batches to
// JetStream instead. Both run an engineStream: per data-parallel rank, one goroutine that owns a
// SUB socket, a seqTracker and, while it recovers missed batches, a DEALER socket on the
// engine's replay buffer.
//
// Order. The batches of one rank reach the output in the engine's sequence order, replayed ones
// included: the rank's goroutine hands them on itself, one at a time. The ranks of one engine
// share a mutex around the output, so that the worker's batches and clears reach it in a single
// order, on which the rule below relies.
//
// Clears. A cleared event clears every rank of the worker in the index, not only the rank that
// sends it. After an engine restart all its ranks number from 0 again; a clear per rank would
// wipe the batches the first rank delivered after its own clear. So a rank skips its clear when
// a clear was handed on after its own last batch: that clear already removed everything the
// rank had delivered before.

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// ErrEngineSource is wrapped by every error of ParseEngineSource and EngineSource.Validate.
var ErrEngineSource = errors.New("ingest: bad engine source")

// errLost marks an output error after which the batch is gone for good: the worker must be
// cleared before the next batch reaches the output.
var errLost = errors.New("ingest: batch lost")

// MaxEngineRanks bounds EngineSource.Ranks.
const MaxEngineRanks = 256

// EngineSource names the KV-event sockets of one engine (one worker) and what its events are
// about. A plain value, safe to copy.
type EngineSource struct {
	Worker uint64
	Model  string
	// Endpoint is rank 0's PUB socket, tcp://host:port (or ipc://path for a single rank).
	Endpoint string
	// Replay is rank 0's replay ROUTER socket, in the same form; "" when the engine has none.
	Replay string
	// Ranks is the number of data-parallel ranks, at least 1: rank FirstRank + r publishes on
	// Endpoint's port + r and replays on Replay's port + r.
	Ranks int
	// FirstRank is the data-parallel rank of Endpoint (0, unless each rank is registered on its
	// own, as Dynamo's /register does).
	FirstRank uint32
	// Topic is the subscription prefix; "" receives every topic.
	Topic string
}

// ParseEngineSource reads the flag form of an EngineSource: comma-separated key=value pairs,
//
//	worker=7,model=llama,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,ranks=2
//
// worker, model and endpoint are required; replay, ranks (1), rank (the first rank, 0) and
// topic ("") are optional.
// Values cannot hold commas. Errors wrap ErrEngineSource and name the bad key.
func ParseEngineSource(s string) (EngineSource, error) {
	src := EngineSource{Ranks: 1}
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok {
			return EngineSource{}, sourceErr(k, "no value: want key=value")
		}
		if seen[k] {
			return EngineSource{}, sourceErr(k, "given twice")
		}
		seen[k] = true
		switch k {
		case "worker":
			w, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return EngineSource{}, sourceErr(k, "%q is not a decimal worker id", v)
			}
			src.Worker = w
		case "model":
			src.Model = v
		case "endpoint":
			src.Endpoint = v
		case "replay":
			src.Replay = v
		case "ranks":
			n, err := strconv.Atoi(v)
			if err != nil {
				return EngineSource{}, sourceErr(k, "%q is not a number", v)
			}
			src.Ranks = n
		case "rank":
			r, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return EngineSource{}, sourceErr(k, "%q is not a data-parallel rank", v)
			}
			src.FirstRank = uint32(r)
		case "topic":
			src.Topic = v
		default:
			return EngineSource{}, sourceErr(k, "unknown key: want worker, model, endpoint, replay, ranks, rank or topic")
		}
	}
	for _, k := range []string{"worker", "model", "endpoint"} {
		if !seen[k] {
			return EngineSource{}, sourceErr(k, "missing")
		}
	}
	return src, src.Validate()
}

// String is the flag form ParseEngineSource reads.
func (s EngineSource) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "worker=%d,model=%s,endpoint=%s", s.Worker, s.Model, s.Endpoint)
	if s.Replay != "" {
		b.WriteString(",replay=" + s.Replay)
	}
	if s.Ranks > 1 {
		b.WriteString(",ranks=" + strconv.Itoa(s.Ranks))
	}
	if s.FirstRank > 0 {
		b.WriteString(",rank=" + strconv.FormatUint(uint64(s.FirstRank), 10))
	}
	if s.Topic != "" {
		b.WriteString(",topic=" + s.Topic)
	}
	return b.String()
}

// Validate reports the first field of s that cannot be used, naming its key.
func (s EngineSource) Validate() error {
	if s.Model == "" {
		return sourceErr("model", "empty")
	}
	if s.Ranks < 1 || s.Ranks > MaxEngineRanks {
		return sourceErr("ranks", "%d, want 1 to %d", s.Ranks, MaxEngineRanks)
	}
	if err := checkEndpoint("endpoint", s.Endpoint, s.Ranks); err != nil {
		return err
	}
	if s.Replay != "" {
		if err := checkEndpoint("replay", s.Replay, s.Ranks); err != nil {
			return err
		}
	}
	for _, kv := range [...][2]string{{"model", s.Model}, {"endpoint", s.Endpoint}, {"replay", s.Replay}, {"topic", s.Topic}} {
		if v := kv[1]; strings.Contains(v, ",") || strings.TrimSpace(v) != v {
			return sourceErr(kv[0], "%q: commas and surrounding spaces do not survive the flag form", v)
		}
	}
	return nil
}

func sourceErr(key, format string, args ...any) error {
	return fmt.Errorf("%w: key %q: %s", ErrEngineSource, key, fmt.Sprintf(format, args...))
}

func checkEndpoint(key, ep string, ranks int) error {
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		switch {
		case path == "":
			return sourceErr(key, "%q has no path", ep)
		case ranks > 1:
			return sourceErr(key, "%q: data-parallel ranks need tcp:// endpoints (rank r is on port + r)", ep)
		}
		return nil
	}
	host, port, err := splitTCP(ep)
	if err != nil {
		return sourceErr(key, "%v", err)
	}
	if host == "" || host == "*" {
		return sourceErr(key, "%q is an address to bind; give the engine's host", ep)
	}
	if port+ranks-1 > 65535 {
		return sourceErr(key, "port %d + %d ranks passes 65535", port, ranks)
	}
	return nil
}

func splitTCP(ep string) (string, int, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("%q: want tcp://host:port or ipc://path", ep)
	}
	host, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %v", ep, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: port %q is not 1 to 65535", ep, p)
	}
	return host, port, nil
}

// rankEndpoint is the endpoint of data-parallel rank r: base's port + r. REQUIRES: base
// passed checkEndpoint for more than r ranks.
func rankEndpoint(base string, r int) string {
	if r == 0 {
		return base
	}
	host, port, _ := splitTCP(base)
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+r))
}

// EngineConfig tunes a Subscriber or a Bridge; the zero value means the defaults. A plain
// value.
type EngineConfig struct {
	// Logger receives connections at info level, lost batches, restarts and dropped messages at
	// warn (slog.Default()).
	Logger *slog.Logger
	// ReplayTimeout bounds one replay request, connecting included (5 s). A replay that has not
	// ended by then has failed: the worker is cleared.
	ReplayTimeout time.Duration
	// DialTimeout bounds one attempt to connect to an engine socket (5 s).
	DialTimeout time.Duration
	// RedialMax caps the wait between attempts to connect, which starts at 50 ms and doubles
	// (2 s).
	RedialMax time.Duration
	// PublishTimeout bounds one publish to JetStream, acknowledgement included (Bridge; 5 s).
	PublishTimeout time.Duration
	// MaxMessageBytes bounds one message from an engine, its frames together (32 MiB), and
	// what one socket holds received and not yet handled. A connection announcing more is
	// dropped before anything is allocated for it, counted, and dialled again with backoff.
	MaxMessageBytes int64
	// StallTimeout is how long an engine may stop in the middle of a message, or of the
	// connection's handshake, before the connection is dropped and dialled again (10 s).
	// Between messages an engine may be silent for any time.
	StallTimeout time.Duration
}

// DefaultMaxMessageBytes is EngineConfig.MaxMessageBytes's default: four times the largest
// message the embedded NATS server takes, far above any engine's batch.
const DefaultMaxMessageBytes = 32 << 20

const redialMin = 50 * time.Millisecond

func (c *EngineConfig) defaults() {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 5 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.RedialMax <= 0 {
		c.RedialMax = 2 * time.Second
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 5 * time.Second
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 10 * time.Second
	}
}

// EngineStats are the counters of a Subscriber or a Bridge; a plain value.
type EngineStats struct {
	Messages        int64 // live messages received, duplicates and malformed ones included
	Batches         int64 // batches handed on (to the sink, or stored by JetStream), replayed ones included
	Events          int64 // events handed to the sink (Subscriber only)
	Replayed        int64 // batches handed on from a replay socket
	DecodeErrors    int64 // messages dropped as malformed: frames, sequence or payload
	Undelivered     int64 // batches the sink refused, or JetStream did not store
	Duplicates      int64 // live messages dropped because their batch was handed on already
	Gaps            int64 // live messages that revealed missed batches
	GapsRecovered   int64 // gaps filled from the replay socket
	GapsUnrecovered int64 // gaps that cleared the worker instead
	Restarts        int64 // engine restarts seen: the sequence went back
	ReplayRequests  int64 // replay requests sent
	Clears          int64 // cleared events handed on (restarts and unrecovered gaps, at most one per restart of all ranks)
	Disconnects     int64 // connections lost; each is followed by attempts to connect again
	Oversized       int64 // connections dropped for announcing a message over MaxMessageBytes
	Stalled         int64 // connections dropped for stalling mid-message or mid-handshake
	ProtocolErrors  int64 // connections dropped for breaking ZMTP framing
	Panics          int64 // panics recovered while handling the engine's messages
	Ranks           []RankStats
}

// RankStats describe one data-parallel rank's socket; a plain value.
type RankStats struct {
	Rank      uint32
	Connected bool
	LastSeq   uint64 // sequence of the last batch handed on (0 before the first)
	// Counters are the rank's share of EngineStats' counters (its Ranks is nil).
	Counters EngineStats
}

// counter names one of a rank's counters.
type counter uint8

const (
	cMessages counter = iota
	cBatches
	cEvents
	cReplayed
	cDecodeErrors
	cUndelivered
	cDuplicates
	cGaps
	cGapsRecovered
	cGapsUnrecovered
	cRestarts
	cReplayRequests
	cClears
	cDisconnects
	cOversized
	cStalled
	cProtocolErrors
	cPanics
	nCounters
)

// engineCounters are one rank's counters, read by stats while its goroutine writes them.
type engineCounters [nCounters]atomic.Int64

// countValues are counters read at one time, or summed over ranks.
type countValues [nCounters]int64

func (c *engineCounters) load() countValues {
	var v countValues
	for i := range c {
		v[i] = c[i].Load()
	}
	return v
}

func (v *countValues) add(o *countValues) {
	for i := range v {
		v[i] += o[i]
	}
}

func (v *countValues) stats() EngineStats {
	return EngineStats{
		Messages:        v[cMessages],
		Batches:         v[cBatches],
		Events:          v[cEvents],
		Replayed:        v[cReplayed],
		DecodeErrors:    v[cDecodeErrors],
		Undelivered:     v[cUndelivered],
		Duplicates:      v[cDuplicates],
		Gaps:            v[cGaps],
		GapsRecovered:   v[cGapsRecovered],
		GapsUnrecovered: v[cGapsUnrecovered],
		Restarts:        v[cRestarts],
		ReplayRequests:  v[cReplayRequests],
		Clears:          v[cClears],
		Disconnects:     v[cDisconnects],
		Oversized:       v[cOversized],
		Stalled:         v[cStalled],
		ProtocolErrors:  v[cProtocolErrors],
		Panics:          v[cPanics],
	}
}

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

// disconnected notes that the connection was lost.
func (t *seqTracker) disconnected() { t.reconnected = true }

// engineOutput is where an engineStream hands batches: a Subscriber's sink or a Bridge's
// JetStream.
type engineOutput interface {
	// prepare readies the batch about to be handed on, outside the stream's lock; false drops
	// it (and the output has counted why). Called only by rl's goroutine.
	prepare(rl *rankLoop, seq uint64, payload []byte) bool
	// sendLocked hands on the batch prepared last by rl. An error wrapping errLost means the
	// batch is gone and the worker must be cleared before the next one. REQUIRES
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

	mu     sync.Mutex // held around every call of out's ...Locked methods
	clears uint64     // clears handed on so far; REQUIRES mu
	owed   bool       // a clear must precede the next batch; REQUIRES mu
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

// clear clears the worker on behalf of rl, unless a clear handed on after rl's last batch
// already did.
func (s *engineStream) clear(ctx context.Context, rl *rankLoop) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.clears > rl.seenClears || s.owed {
		return
	}
	s.owed = true
	s.clearLocked(ctx, rl)
}

// clearLocked hands on the clear owed; false if the output failed, in which case the clear
// stays owed. REQUIRES s.mu.
func (s *engineStream) clearLocked(ctx context.Context, rl *rankLoop) bool {
	if err := s.out.clearLocked(ctx, rl); err != nil {
		if ctx.Err() == nil {
			rl.warn("clear not delivered; it is retried before the next batch", "err", err)
		}
		return false
	}
	s.owed = false
	s.clears++
	rl.seenClears = s.clears
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
	clearEv    [1]shard.Event
	gate       time.Time // warn is quiet until then
	suppressed int       // warnings not logged since the last one

	seenClears uint64 // engineStream.clears after this rank's last batch; REQUIRES engineStream.mu

	c         engineCounters
	connected atomic.Bool
	lastSeq   atomic.Uint64
}

func (rl *rankLoop) run(ctx context.Context) {
	var backoff time.Duration
	for {
		if backoff > 0 && !sleepCtx(ctx, backoff) {
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
// ends the session only: it is logged and counted, and the worker is cleared before its next
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
	rl.connected.Store(true)
	defer rl.connected.Store(false)
	before := rl.c[cBatches].Load()
	defer func() {
		if p := recover(); p != nil {
			ok, clean, err = true, false, rl.recovered(p)
			rl.s.mu.Lock()
			rl.s.owed = true
			rl.s.mu.Unlock()
		}
	}()
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
		if !sleepCtx(ctx, wait) {
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
	logPanic(rl.log, "panic recovered while reading an engine's KV events; its connection is dialled again", p, "endpoint", rl.endpoint)
	return fmt.Errorf("%w: %v", errPanic, p)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
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
	s := rl.s
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
	case seqDuplicate:
		rl.c[cDuplicates].Add(1)
		return
	case seqRestart:
		rl.c[cRestarts].Add(1)
		rl.log.Warn("engine restarted (its batch sequence went back); the worker's blocks are cleared", "seq", seq, "last", rl.tracker.last)
		s.clear(ctx, rl)
	case seqGap:
		rl.c[cGaps].Add(1)
		rl.recover(ctx, seq)
	}
	rl.deliver(ctx, seq, frames[2], false)
}

// recover hands on the batches between the rank's last one and seq from the replay socket; if
// it cannot, it clears the worker.
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
	rl.c[cGapsUnrecovered].Add(1)
	rl.log.Warn("engine batches lost; the worker's blocks are cleared", "first", rl.tracker.last+1, "last", seq-1, "reason", reason)
	rl.s.clear(ctx, rl)
}

// replayRange asks the rank's replay socket for the batches from the last one handed on up to
// (not including) upto, and hands them on in order. The reply is read to its end marker even
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
	binary.BigEndian.PutUint64(start[:], rl.tracker.last+1)
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
		case hole != nil, seq < next, next == upto:
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
	if next := rl.tracker.last + 1; next != upto {
		return fmt.Errorf("replay %s: it ended before batch %d", rl.replay, next)
	}
	return nil
}

// deliver moves the cursor to seq and hands the batch on.
func (rl *rankLoop) deliver(ctx context.Context, seq uint64, payload []byte, replayed bool) {
	s := rl.s
	rl.tracker.accept(seq)
	rl.lastSeq.Store(seq)
	if !s.out.prepare(rl, seq, payload) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owed && !s.clearLocked(ctx, rl) {
		rl.c[cUndelivered].Add(1)
		return
	}
	if err := s.out.sendLocked(ctx, rl, seq, payload); err != nil {
		rl.c[cUndelivered].Add(1)
		if errors.Is(err, errLost) {
			s.owed = true
		}
		if ctx.Err() == nil {
			rl.warn("engine batch not delivered", "seq", seq, "err", err)
		}
		return
	}
	rl.seenClears = s.clears
	rl.c[cBatches].Add(1)
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
// events once it returns.
type EventSink interface {
	Ingest(worker uint64, model string, events []shard.Event) error
}

// Subscriber reads one engine's KV events straight from its ZMQ sockets and hands them to an
// EventSink, in order per data-parallel rank, with the worker and model of its EngineSource.
// Missed batches are fetched from the engine's replay socket when it has one; when they cannot
// be, or the engine restarted, the worker is cleared (one shard.Cleared event) before the next
// batch. Its methods are safe for concurrent use; the sink is called by one goroutine per
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
func (sub *Subscriber) Stats() EngineStats { return sub.s.stats() }

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

func (sub *Subscriber) sendLocked(_ context.Context, rl *rankLoop, _ uint64, _ []byte) error {
	evs := rl.batch.Events
	if len(evs) == 0 {
		// Nothing to apply; an empty batch would also register the worker's rank 0, whatever
		// the socket's rank.
		return nil
	}
	if err := sub.sink.Ingest(sub.s.src.Worker, sub.s.src.Model, evs); err != nil {
		return err
	}
	rl.c[cEvents].Add(int64(len(evs)))
	return nil
}

func (sub *Subscriber) clearLocked(_ context.Context, rl *rankLoop) error {
	rl.clearEv[0] = shard.Event{Kind: shard.Cleared, Rank: rl.rank}
	return sub.sink.Ingest(sub.s.src.Worker, sub.s.src.Model, rl.clearEv[:])
}
