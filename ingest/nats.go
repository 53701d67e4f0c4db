package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

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
	}
	opts := &server.Options{
		ServerName: "kvrouterd",
		Host:       host,
		Port:       p,
		JetStream:  true,
		StoreDir:   cfg.Dir,
		NoSigs:     true,
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
	n.l.Debug("nats: " + fmt.Sprintf(format, v...))
}
func (n *natsLogger) Warnf(format string, v ...any)  { n.l.Warn("nats: " + fmt.Sprintf(format, v...)) }
func (n *natsLogger) Fatalf(format string, v ...any) { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n *natsLogger) Errorf(format string, v ...any) { n.l.Error("nats: " + fmt.Sprintf(format, v...)) }
func (n *natsLogger) Debugf(format string, v ...any) {}
func (n *natsLogger) Tracef(format string, v ...any) {}

// Sink is what the consumer feeds: router.Router.
type Sink interface {
	Ingest(worker uint64, model string, events []shard.Event) error
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
	OnGap  func(from, to uint64)
	Logger *slog.Logger
}

// Stats are a Consumer's counters; a plain value.
type Stats struct {
	Messages  int64 // stream messages handled
	Events    int64 // events handed to the sink
	Rejected  map[string]int64
	Reports   int64  // load reports recorded
	LastSeq   uint64 // the last stream sequence handed to the sink
	Gaps      int64  // stream sequences skipped (retention dropped them before they were read)
	Connected bool
}

// Rejection reasons of Stats.Rejected.
const (
	RejectSubject = "subject" // not <prefix>.events.<model>.<worker>, or disagreeing with the payload
	RejectDecode  = "decode"  // a payload that is neither format, or malformed
	RejectInvalid = "invalid" // a batch the router refused (block size, token count, model, ...)
	RejectReport  = "report"  // a malformed load report
)

var rejectReasons = [...]string{RejectSubject, RejectDecode, RejectInvalid, RejectReport}

// Consumer applies the event stream to a Sink: an ordered JetStream consumer from a known
// sequence (it resumes from the last one it handled across reconnects), plus the load-report
// subscription. Its methods are safe for concurrent use.
type Consumer struct {
	cfg  ConsumerConfig
	nc   *nats.Conn
	sink Sink
	log  *slog.Logger
	cc   jetstream.ConsumeContext
	sub  *nats.Subscription

	mu     sync.Mutex // the handler's state: one message at a time
	engine wire.EngineBatch
	batch  wire.EventBatch

	messages, events, reports, gaps atomic.Int64
	lastSeq                         atomic.Uint64
	rejected                        [len(rejectReasons)]atomic.Int64
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
	c := &Consumer{cfg: cfg, nc: nc, sink: sink, log: cfg.Logger}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
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
	stream, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
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
	oc := jetstream.OrderedConsumerConfig{FilterSubjects: sc.Subjects, DeliverPolicy: jetstream.DeliverAllPolicy}
	if cfg.StartSeq > 0 {
		oc.DeliverPolicy, oc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cfg.StartSeq
		c.lastSeq.Store(cfg.StartSeq - 1)
	}
	cons, err := js.OrderedConsumer(ctx, cfg.Stream, oc)
	if err != nil {
		return nil, fmt.Errorf("consumer of %s: %w", cfg.Stream, err)
	}
	c.cc, err = cons.Consume(c.handle, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		c.log.Warn("event stream", "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", cfg.Stream, err)
	}
	c.sub, err = nc.Subscribe(cfg.Prefix+".load.>", c.handleReport)
	if err != nil {
		c.cc.Stop()
		return nil, fmt.Errorf("load reports: %w", err)
	}
	return c, nil
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
			log.Warn("nats disconnected; reconnecting", "err", err)
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

func (c *Consumer) handle(m jetstream.Msg) {
	c.mu.Lock()
	defer c.mu.Unlock()
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
	data := m.Data()
	var events []shard.Event
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
		if err := c.engine.Decode(data); err != nil {
			c.reject(RejectDecode, "event stream: bad engine batch", "subject", m.Subject(), "err", err)
			return
		}
		events = c.engine.Events
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
}

func (c *Consumer) handleReport(m *nats.Msg) {
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
		LastSeq: c.lastSeq.Load(), Gaps: c.gaps.Load(), Connected: c.nc.IsConnected(),
		Rejected: make(map[string]int64, len(rejectReasons)),
	}
	for i, r := range rejectReasons {
		st.Rejected[r] = c.rejected[i].Load()
	}
	return st
}

// Close stops consuming; messages being handled finish first.
func (c *Consumer) Close() {
	c.cc.Drain()
	<-c.cc.Closed()
	_ = c.sub.Unsubscribe()
	c.mu.Lock() // wait for a handler still running
	defer c.mu.Unlock()
}
