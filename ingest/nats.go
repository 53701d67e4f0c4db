package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/panics"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// EmbeddedConfig configures the NATS server the daemon runs in its own process; a plain value.
type EmbeddedConfig struct {
	// Dir holds JetStream's files and the user files (auth.go).
	Dir string
	// Listen is the host:port of the client listener; port 0 picks a free one.
	Listen string
	// Credentials are the server's users; nil: EmbeddedCredentials(Dir), generated if missing.
	Credentials *Credentials
	// NoAuth lets any client connect with every right, anonymously: inject events, purge or
	// delete the stream. Unsafe on any host where other users or programs run.
	NoAuth bool
	// Prefix and Stream are the subject prefix and stream the publisher user may use
	// (DefaultPrefix, DefaultStream).
	Prefix, Stream string
	// Logger receives the server's notices and errors (nil: discarded).
	Logger *slog.Logger
}

// ErrEmbeddedListen is wrapped by StartEmbedded's error when its client address cannot be
// listened on.
var ErrEmbeddedListen = errors.New("embedded nats: cannot listen")

// StartEmbedded starts a NATS server with JetStream and waits until it accepts clients. Unless
// cfg.NoAuth, it accepts only the users of cfg.Credentials (auth.go).
func StartEmbedded(cfg EmbeddedConfig) (*server.Server, error) {
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("nats listen address %q: %w", cfg.Listen, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return nil, fmt.Errorf("nats listen address %q: bad port", cfg.Listen)
	}
	if p == 0 {
		p = server.RANDOM_PORT
	} else {
		// The server would only log that it cannot listen, and never become ready: say so now.
		l, err := net.Listen("tcp", net.JoinHostPort(host, port))
		if err != nil {
			return nil, fmt.Errorf("%w on %s (another NATS server, or a second kvrouterd, on this host?): %w", ErrEmbeddedListen, cfg.Listen, err)
		}
		l.Close()
	}
	opts := &server.Options{
		ServerName: "kvrouterd",
		Host:       host,
		Port:       p,
		JetStream:  true,
		StoreDir:   cfg.Dir,
		NoSigs:     true,
		// Debug logging shows the server's notices, not its ASCII-art logo.
		DisableJetStreamBanner: true,
		// Event batches of long prompts are large: allow 8 MiB messages.
		MaxPayload: 8 << 20,
	}
	if !cfg.NoAuth {
		creds := cfg.Credentials
		if creds == nil {
			if creds, err = EmbeddedCredentials(cfg.Dir); err != nil {
				return nil, err
			}
		}
		if cfg.Prefix == "" {
			cfg.Prefix = DefaultPrefix
		}
		if cfg.Stream == "" {
			cfg.Stream = DefaultStream
		}
		if opts.Users, err = creds.users(cfg.Prefix, cfg.Stream); err != nil {
			return nil, err
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if cfg.Logger != nil {
		s.SetLoggerV2(&natsLogger{cfg.Logger}, false, false, false)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded nats: not ready after 30 s")
	}
	return s, nil
}

// natsLogger adapts the server's logger to slog.
type natsLogger struct{ l *slog.Logger }

func (n *natsLogger) Noticef(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Trim(msg, "- ") == "" {
		return // the blank and ruled lines that frame the server's notices
	}
	n.l.Debug("nats: " + msg)
}
func (n *natsLogger) Warnf(format string, v ...any)  { n.l.Warn("nats: " + fmt.Sprintf(format, v...)) }
func (n *natsLogger) Fatalf(format string, v ...any) { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n *natsLogger) Errorf(format string, v ...any) { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n *natsLogger) Debugf(format string, v ...any) {}
func (n *natsLogger) Tracef(format string, v ...any) {}

// Sink is what the consumer feeds: router.Router.
type Sink interface {
	Ingest(worker uint64, model string, events []kvevent.Event) error
	Report(*router.LoadReport) error
}

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	Prefix string // subject prefix (DefaultPrefix)
	Stream string // stream name (DefaultStream)
	// MaxAge and MaxBytes bound the stream's retention (0: unbounded); Replicas is its
	// replication factor in a cluster (1).
	MaxAge   time.Duration
	MaxBytes int64
	Replicas int
	// Memory keeps the stream in memory instead of files (tests and benchmarks).
	Memory bool
	// StartSeq is the first stream sequence to apply; 0 means the oldest retained. A StartSeq
	// beyond the stream's end (a stream that was recreated, or lost its files, after the state
	// resuming from it was saved) is a gap over every sequence the stream no longer has: the
	// consumer starts from its oldest message.
	StartSeq uint64
	// OnGap, if set, is called (on the consumer's goroutine, before the message after the gap
	// is handed over) when sequences from..to were lost: retention dropped them before they were
	// read, or the stream restarted. Every event in them is lost for good, so the sink's state
	// is then wrong in ways no one can tell: a daemon clears what the events built.
	//
	// When the stream itself was lost (deleted, or replaced by another of the same name), to is
	// 0: every event after from-1 that it held, and any published while it was missing, is gone.
	OnGap func(from, to uint64)
	// CheckInterval is how often the stream is checked (1 s): a deleted stream is created
	// again and read from its start, a changed one set back (see Consumer). An error reported
	// by the consumer checks at once.
	CheckInterval time.Duration
	// ReadStall is how long the consumer may read nothing while the stream holds later
	// messages before a check starts a new one from the sequence after the last read
	// (DefaultReadStall). The client's ordered consumer recreates itself after a server
	// loss, but in a cluster its new consumer can be placed on the node that was just lost,
	// and it then waits for that node for ever.
	ReadStall time.Duration
	Logger    *slog.Logger
}

// DefaultReadStall is ConsumerConfig.ReadStall's default.
const DefaultReadStall = 10 * time.Second

// Stats are a Consumer's counters; a plain value.
type Stats struct {
	Messages  int64 // stream messages handled
	Events    int64 // events handed to the sink
	Rejected  map[string]int64
	Reports   int64  // load reports recorded
	LastSeq   uint64 // the last stream sequence handed to the sink
	Gaps      int64  // stream sequences skipped: dropped by retention before they were read, or lost with a deleted stream
	Recreated int64  // times the stream was found missing and created again
	Restored  int64  // times the stream's configuration was found changed and set back
	// Restarts counts the consumers started again because they read nothing while the stream
	// held later messages (ConsumerConfig.ReadStall).
	Restarts int64
	// UnknownMedium counts the engine events handed to the sink whose medium was unknown,
	// applied as the device tier.
	UnknownMedium int64
	// Changes counts the API changes (registrations, their removal, event batches) a Journal
	// published, applied from the stream; refused ones count in Rejected["invalid"].
	Changes int64
	// Connected: connected to NATS, and the stream is there as configured (Health is nil).
	Connected bool
}

// Rejection reasons of Stats.Rejected.
const (
	RejectSubject = "subject" // not <prefix>.events.<model>.<worker>, or disagreeing with the payload
	RejectDecode  = "decode"  // a payload that is neither format, or malformed
	RejectInvalid = "invalid" // a batch or change the router refused (block size, token count, model, ...)
	RejectReport  = "report"  // a malformed load report
	RejectPanic   = "panic"   // handling it panicked (recovered)
)

var rejectReasons = [...]string{RejectSubject, RejectDecode, RejectInvalid, RejectReport, RejectPanic}

// Consumer applies the event stream to a Sink: an ordered JetStream consumer from a known
// sequence (it resumes from the last one it handled across reconnects), plus the load-report
// subscription. Its methods are safe for concurrent use.
//
// A goroutine of its own watches the stream (ConsumerConfig.CheckInterval). A stream found
// missing is created again; one found replaced (another creation time) is read from its start
// after OnGap, since the events of the lost one are gone and the new one numbers from 1, where
// the ordered consumer would wait for the old sequence. A stream whose subjects, retention
// policy, storage or seal were changed is set back to the configuration; if the server refuses,
// Health says why. Retention limits are set at start only: replicas may differ in them.
type Consumer struct {
	cfg  ConsumerConfig
	nc   *nats.Conn
	js   jetstream.JetStream
	sc   jetstream.StreamConfig // the stream as it must be
	sink Sink
	log  *slog.Logger
	sub  *nats.Subscription

	startLast uint64        // the stream's last sequence when the consumer started
	firstSeq  atomic.Uint64 // the stream's first retained sequence at the last check

	// Owned by the watch goroutine, then by Close.
	cc        jetstream.ConsumeContext
	created   time.Time // the stream's creation time: another means another stream
	knownLast uint64    // the stream's last sequence at the last check
	noConsume bool      // the stream was replaced and no consumer of the new one runs yet
	// When the stream was first found missing (zero: it was not).
	missingSince time.Time
	// The last sequence read at the last check, and since when it has been the last.
	progressSeq uint64
	progressAt  time.Time

	poke, stop, watched chan struct{}
	// stopped ends the watch goroutine's calls to the server when Close is called.
	stopped   context.Context
	stopCalls context.CancelFunc
	stopping  sync.WaitGroup // consumers of lost streams being stopped
	health    atomic.Pointer[error]

	mu     sync.Mutex // the handler's state: one message at a time
	gen    uint64     // consumers of an older generation read a lost stream: ignored
	engine wire.EngineBatch
	groups map[uint64]*wire.EngineGroups // per worker: the KV-cache groups its stores described
	batch  wire.EventBatch
	oc     []shard.Outcome // outcomes of a change nobody here waits on

	// origin names this consumer's Journal in the changes it publishes; waiting holds the
	// ones it waits on.
	origin  string
	waiting waiters
	changes atomic.Int64

	messages, events, reports, gaps, recreated, restored, restarts atomic.Int64
	unknownMedium                                                  atomic.Int64
	lastSeq                                                        atomic.Uint64
	rejected                                                       [len(rejectReasons)]atomic.Int64
}

// NewConsumer creates the stream if needed (or updates its retention), then starts consuming
// it through nc. nc should reconnect forever (see ConnectOptions).
func NewConsumer(ctx context.Context, nc *nats.Conn, sink Sink, cfg ConsumerConfig) (*Consumer, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Stream == "" {
		cfg.Stream = DefaultStream
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = time.Second
	}
	if cfg.ReadStall <= 0 {
		cfg.ReadStall = DefaultReadStall
	}
	c := &Consumer{cfg: cfg, nc: nc, sink: sink, log: cfg.Logger, origin: strconv.FormatUint(rand.Uint64(), 36),
		poke: make(chan struct{}, 1), stop: make(chan struct{}), watched: make(chan struct{})}
	c.stopped, c.stopCalls = context.WithCancel(context.Background())
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c.js = js
	sc := jetstream.StreamConfig{
		Name:      cfg.Stream,
		Subjects:  []string{cfg.Prefix + ".events.>"},
		MaxAge:    cfg.MaxAge,
		MaxBytes:  cfg.MaxBytes,
		Replicas:  cfg.Replicas,
		Storage:   jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy,
		Discard:   jetstream.DiscardOld,
	}
	if cfg.Memory {
		sc.Storage = jetstream.MemoryStorage
	}
	if sc.MaxBytes == 0 {
		sc.MaxBytes = -1
	}
	c.sc = sc
	stream, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	c.created = stream.CachedInfo().Created
	c.startLast = stream.CachedInfo().State.LastSeq
	c.firstSeq.Store(stream.CachedInfo().State.FirstSeq)
	if cfg.StartSeq > 0 {
		info, err := stream.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", cfg.Stream, err)
		}
		if last := info.State.LastSeq; cfg.StartSeq > last+1 {
			c.log.Warn("event stream: the start sequence is past the stream's end; the stream was recreated or lost its files, so every event after the saved state is lost",
				"start_seq", cfg.StartSeq, "stream_last_seq", last)
			c.gaps.Add(int64(cfg.StartSeq - last - 1))
			if cfg.OnGap != nil {
				cfg.OnGap(last+1, cfg.StartSeq-1)
			}
			cfg.StartSeq, c.cfg.StartSeq = 0, 0
		}
	}
	if cfg.StartSeq > 0 {
		c.lastSeq.Store(cfg.StartSeq - 1)
	}
	if c.cc, err = c.consume(ctx, 0, cfg.StartSeq); err != nil {
		return nil, err
	}
	c.sub, err = nc.Subscribe(cfg.Prefix+".load.>", c.handleReport)
	if err != nil {
		c.cc.Stop()
		return nil, fmt.Errorf("load reports: %w", err)
	}
	// Reports are plain NATS messages, which the server drops while no subscription matches: a
	// round trip makes the subscription the server's before NewConsumer returns, so that a
	// report published after it is delivered. Disconnected, it will have it on reconnecting.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		c.log.Warn("load reports: subscription not confirmed by the server yet", "err", err)
	}
	go c.watch()
	return c, nil
}

// consume starts an ordered consumer of generation gen from sequence start (0: the oldest).
func (c *Consumer) consume(ctx context.Context, gen, start uint64) (jetstream.ConsumeContext, error) {
	oc := jetstream.OrderedConsumerConfig{FilterSubjects: c.sc.Subjects, DeliverPolicy: jetstream.DeliverAllPolicy}
	if start > 0 {
		oc.DeliverPolicy, oc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	cons, err := c.js.OrderedConsumer(ctx, c.cfg.Stream, oc)
	if err != nil {
		return nil, fmt.Errorf("consumer of %s: %w", c.cfg.Stream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { c.handle(gen, m) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			c.log.Warn("event stream", "err", err)
			select {
			case c.poke <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", c.cfg.Stream, err)
	}
	return cc, nil
}

// groupsOf returns worker's table of KV-cache groups, which decides the group of its engine
// batches' removals (wire/SPEC.md §10.4). REQUIRES c.mu.
func (c *Consumer) groupsOf(worker uint64) *wire.EngineGroups {
	g := c.groups[worker]
	if g == nil {
		if c.groups == nil {
			c.groups = make(map[uint64]*wire.EngineGroups)
		}
		g = new(wire.EngineGroups)
		c.groups[worker] = g
	}
	return g
}

// Health is nil while the consumer is connected to NATS and the stream is there as configured;
// otherwise it says what is wrong. Cheap: it reads what the last check found.
func (c *Consumer) Health() error {
	if !c.nc.IsConnected() {
		return fmt.Errorf("not connected to NATS (%s)", c.nc.Status())
	}
	if e := c.health.Load(); e != nil {
		return *e
	}
	return nil
}

func (c *Consumer) setHealth(err error) {
	if err == nil {
		c.health.Store(nil)
		return
	}
	if old := c.health.Load(); old == nil || (*old).Error() != err.Error() {
		c.log.Warn("event stream unhealthy", "err", err)
	}
	c.health.Store(&err)
}

// watch checks the stream every CheckInterval, and when the consumer reports an error, until
// Close.
func (c *Consumer) watch() {
	defer close(c.watched)
	t := time.NewTicker(c.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.poke:
		}
		ctx, cancel := context.WithTimeout(c.stopped, max(c.cfg.CheckInterval, 5*time.Second))
		c.setHealth(c.check(ctx))
		cancel()
	}
}

// check looks at the stream and repairs what it can; the error is what it could not.
func (c *Consumer) check(ctx context.Context) error {
	if !c.nc.IsConnected() {
		c.progressAt = time.Now() // not a stall: the consumer resumes on reconnection
		return nil                // Health says so
	}
	name := c.cfg.Stream
	s, err := c.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// The server answers "not found" while it is still removing the stream's files, and a
		// stream created then has its files removed with the old one's: wait a check interval.
		if c.missingSince.IsZero() {
			c.missingSince = time.Now()
		}
		if time.Since(c.missingSince) < c.cfg.CheckInterval {
			return fmt.Errorf("stream %s was deleted; creating it again", name)
		}
		c.log.Warn("event stream: the stream was deleted; creating it again", "stream", name)
		if s, err = c.js.CreateOrUpdateStream(ctx, c.sc); err != nil {
			return fmt.Errorf("stream %s was deleted, and creating it again failed: %w", name, err)
		}
		c.recreated.Add(1)
	} else if err != nil {
		return fmt.Errorf("stream %s: %w", name, err)
	}
	c.missingSince = time.Time{}
	info := s.CachedInfo()
	if !info.Created.Equal(c.created) {
		c.replaced(info)
	}
	if diff := c.changed(&info.Config); diff != "" {
		c.log.Warn("event stream: the stream's configuration was changed; setting it back", "stream", name, "change", diff)
		if s, err = c.js.UpdateStream(ctx, c.sc); err != nil {
			return fmt.Errorf("stream %s was changed (%s), and setting it back failed: %w", name, diff, err)
		}
		c.restored.Add(1)
		info = s.CachedInfo()
	}
	if c.noConsume {
		cc, err := c.consume(ctx, c.generation(), 0)
		if err != nil {
			return fmt.Errorf("stream %s was replaced, and reading the new one failed: %w", name, err)
		}
		c.cc, c.noConsume = cc, false
	}
	c.knownLast = info.State.LastSeq
	c.firstSeq.Store(info.State.FirstSeq)
	return c.unstall(ctx, info.State.LastSeq)
}

// unstall starts a new consumer from the sequence after the last one read when the current one
// has read nothing for ReadStall while the stream's last sequence is past it.
func (c *Consumer) unstall(ctx context.Context, streamLast uint64) error {
	read, now := c.lastSeq.Load(), time.Now()
	if read >= streamLast || read != c.progressSeq || c.progressAt.IsZero() {
		c.progressSeq, c.progressAt = read, now
		return nil
	}
	stalled := now.Sub(c.progressAt)
	if stalled < c.cfg.ReadStall {
		return nil
	}
	c.progressAt = now // at most one restart per ReadStall
	c.log.Warn("event stream: the consumer read nothing while the stream holds later events; starting a new one after the last sequence read",
		"stream", c.cfg.Stream, "last_read", read, "stream_last_seq", streamLast, "stalled_for", stalled.Round(time.Second))
	c.mu.Lock() // a message being handled is handled; those the old consumer hands over next are ignored
	c.gen++
	gen, from := c.gen, c.lastSeq.Load()+1
	c.mu.Unlock()
	if old := c.cc; old != nil {
		c.cc = nil
		// Stopping an ordered consumer that is retrying waits for its next attempt.
		c.stopping.Go(old.Stop)
	}
	cc, err := c.consume(ctx, gen, from)
	if err != nil {
		return fmt.Errorf("stream %s: the consumer read nothing for %v with sequences %d to %d unread, and starting a new one failed: %w",
			c.cfg.Stream, stalled.Round(time.Second), from, streamLast, err)
	}
	c.cc = cc
	c.restarts.Add(1)
	return nil
}

// StartLastSeq is the stream's last sequence when the consumer started: what a restarted
// replica must apply before its index is caught up.
func (c *Consumer) StartLastSeq() uint64 { return c.startLast }

// FirstSeq is the stream's first retained sequence when it was last checked (once a second).
func (c *Consumer) FirstSeq() uint64 { return c.firstSeq.Load() }

func (c *Consumer) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// replaced starts over on a stream that is not the one read so far: what the old one held
// after the last sequence read is lost, and the new one is read from its start.
func (c *Consumer) replaced(info *jetstream.StreamInfo) {
	c.mu.Lock()
	c.gen++
	last := c.lastSeq.Load()
	c.lastSeq.Store(0)
	c.cfg.StartSeq = 0
	if c.knownLast > last {
		c.gaps.Add(int64(c.knownLast - last))
	}
	c.log.Warn("event stream: the stream was replaced; the events after the last one read are lost, reading the new stream from its start",
		"stream", c.cfg.Stream, "last_read", last, "old_stream_last_seq", c.knownLast)
	if c.cfg.OnGap != nil {
		c.cfg.OnGap(last+1, 0)
	}
	c.mu.Unlock()
	c.created, c.knownLast, c.noConsume = info.Created, 0, true
	if old := c.cc; old != nil {
		c.cc = nil
		// Stopping an ordered consumer that is retrying against the lost stream waits for its
		// next attempt: not on this goroutine.
		c.stopping.Go(old.Stop)
	}
}

// changed describes how cfg differs from the stream's configuration in what the consumer
// depends on; empty if it does not.
func (c *Consumer) changed(cfg *jetstream.StreamConfig) string {
	var d []string
	if !slices.Contains(cfg.Subjects, c.sc.Subjects[0]) {
		d = append(d, fmt.Sprintf("subjects %v", cfg.Subjects))
	}
	if cfg.Retention != c.sc.Retention {
		d = append(d, "retention "+cfg.Retention.String())
	}
	if cfg.Storage != c.sc.Storage {
		d = append(d, "storage "+cfg.Storage.String())
	}
	if cfg.Sealed {
		d = append(d, "sealed")
	}
	return strings.Join(d, ", ")
}

// ConnectOptions are the options every kvrouterd connection uses: reconnect forever, report
// disconnections to log.
func ConnectOptions(log *slog.Logger) []nats.Option {
	return []nats.Option{
		nats.Name("kvrouterd"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: closed on purpose, at shutdown
				log.Warn("nats disconnected; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
	}
}

func (c *Consumer) reject(reason string, msg string, args ...any) {
	for i, r := range rejectReasons {
		if r == reason {
			c.rejected[i].Add(1)
		}
	}
	c.log.Warn(msg, append(args, "reason", reason)...)
}

var magic = []byte("KVRW")

// recoverPanic, deferred by NATS's callbacks, keeps a panic while handling one message from
// ending the process: it is logged, counted, and the next message is handled.
func (c *Consumer) recoverPanic(subject string) {
	if p := recover(); p != nil {
		c.rejected[len(rejectReasons)-1].Add(1) // RejectPanic
		panics.Log(c.log, "event stream: panic recovered handling a message", p, "subject", subject)
	}
}

func (c *Consumer) handle(gen uint64, m jetstream.Msg) {
	var answered *waiter // a Journal's change, answered last: after LastSeq has its sequence
	defer func() {
		if answered != nil {
			close(answered.done)
		}
	}()
	defer c.recoverPanic(m.Subject())
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return // a consumer of a lost stream, being stopped
	}
	c.messages.Add(1)
	if md, err := m.Metadata(); err == nil {
		seq := md.Sequence.Stream
		// Sequences before the first one read were never asked for, unless a start was given.
		if last := c.lastSeq.Load(); (last > 0 || c.cfg.StartSeq > 0) && seq > last+1 {
			// Retention dropped messages before this consumer read them.
			c.gaps.Add(int64(seq - last - 1))
			c.log.Warn("event stream: sequences lost to retention", "from", last+1, "to", seq-1)
			if c.cfg.OnGap != nil {
				c.cfg.OnGap(last+1, seq-1)
			}
		}
		defer c.lastSeq.Store(seq)
	}
	kind, model, worker, err := ParseSubject(c.cfg.Prefix, m.Subject())
	if err != nil || kind != "events" {
		c.reject(RejectSubject, "event stream: bad subject", "subject", m.Subject(), "err", err)
		return
	}
	if op := m.Headers().Get(HeaderOp); op != "" {
		answered = c.handleOp(op, model, worker, m)
		return
	}
	data := m.Data()
	var events []kvevent.Event
	unknownMedium := 0
	if bytes.HasPrefix(data, magic) {
		if err := wire.DecodeEventBatch(data, &c.batch); err != nil {
			c.reject(RejectDecode, "event stream: bad event batch", "subject", m.Subject(), "err", err)
			return
		}
		if c.batch.Worker != worker || c.batch.Model != model {
			c.reject(RejectSubject, "event stream: the batch's worker or model is not its subject's",
				"subject", m.Subject(), "worker", c.batch.Worker, "model", c.batch.Model)
			return
		}
		events = c.batch.Events
	} else {
		c.engine.Groups = c.groupsOf(worker)
		if err := c.engine.Decode(data); err != nil {
			c.reject(RejectDecode, "event stream: bad engine batch", "subject", m.Subject(), "err", err)
			return
		}
		events, unknownMedium = c.engine.Events, c.engine.UnknownMedium
		if h := m.Headers().Get(HeaderRank); h != "" && !c.engine.HasRank {
			r, err := strconv.ParseUint(h, 10, 32)
			if err != nil {
				c.reject(RejectDecode, "event stream: bad "+HeaderRank+" header", "subject", m.Subject(), "value", h)
				return
			}
			for i := range events {
				events[i].Rank = uint32(r)
			}
		}
	}
	if err := c.sink.Ingest(worker, model, events); err != nil {
		if errors.Is(err, router.ErrClosed) {
			return
		}
		c.reject(RejectInvalid, "event stream: batch refused", "subject", m.Subject(), "err", err)
		return
	}
	c.events.Add(int64(len(events)))
	if unknownMedium > 0 {
		c.unknownMedium.Add(int64(unknownMedium))
		c.log.Warn("event stream: engine events of an unknown storage medium applied as the device tier",
			"medium", strings.Clone(c.engine.UnknownMediumName), "worker", worker, "model", model, "events", unknownMedium)
	}
}

func (c *Consumer) handleReport(m *nats.Msg) {
	defer c.recoverPanic(m.Subject)
	kind, model, worker, err := ParseSubject(c.cfg.Prefix, m.Subject)
	if err != nil || kind != "load" {
		c.reject(RejectReport, "load report: bad subject", "subject", m.Subject, "err", err)
		return
	}
	var rep router.LoadReport
	dec := json.NewDecoder(bytes.NewReader(m.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		c.reject(RejectReport, "load report: bad JSON", "subject", m.Subject, "err", err)
		return
	}
	if rep.Worker == 0 {
		rep.Worker = worker
	}
	if rep.Model == "" {
		rep.Model = model
	}
	if rep.Worker != worker || rep.Model != model {
		c.reject(RejectReport, "load report: worker or model is not its subject's", "subject", m.Subject)
		return
	}
	if err := c.sink.Report(&rep); err != nil {
		c.reject(RejectReport, "load report refused", "subject", m.Subject, "err", err)
		return
	}
	c.reports.Add(1)
}

// LastSeq returns the last stream sequence handed to the sink (the sink may still be applying
// it: see router.Router.Flush).
func (c *Consumer) LastSeq() uint64 { return c.lastSeq.Load() }

// Stats returns the counters.
func (c *Consumer) Stats() Stats {
	st := Stats{
		Messages: c.messages.Load(), Events: c.events.Load(), Reports: c.reports.Load(),
		LastSeq: c.lastSeq.Load(), Gaps: c.gaps.Load(), Connected: c.Health() == nil,
		Recreated: c.recreated.Load(), Restored: c.restored.Load(), Restarts: c.restarts.Load(), UnknownMedium: c.unknownMedium.Load(),
		Changes:  c.changes.Load(),
		Rejected: make(map[string]int64, len(rejectReasons)),
	}
	for i, r := range rejectReasons {
		st.Rejected[r] = c.rejected[i].Load()
	}
	return st
}

// Close stops consuming; messages being handled finish first. With the server unreachable it
// does not wait for it: the consumer is stopped rather than drained, and not waited for.
func (c *Consumer) Close() {
	close(c.stop)
	c.stopCalls()
	<-c.watched
	switch {
	case c.cc == nil:
	case c.nc.IsConnected():
		c.cc.Drain()
		<-c.cc.Closed()
	default:
		// Stopping an ordered consumer that is retrying against a server that is gone waits
		// for its next attempt (about 11 s): not here, where shutdown waits. It ends then, or
		// when the connection closes; whatever it hands over meanwhile is ignored (gen below).
		go c.cc.Stop()
	}
	_ = c.sub.Unsubscribe()
	c.mu.Lock() // wait for a handler still running
	c.gen++     // and ignore any of a consumer still being stopped
	c.mu.Unlock()
	c.stopping.Wait()
}
