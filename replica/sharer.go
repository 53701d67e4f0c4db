package replica

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freelist"
	"github.com/kvrouterd/kvrouterd/internal/panics"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// defaultPrefix is the subject prefix when Config has none: ingest.DefaultPrefix, which a test
// holds it to.
const defaultPrefix = "kvr"

// Sink applies the other replicas' operations; router.Router is the daemon's. A Sharer calls
// it from one goroutine, one message at a time.
type Sink interface {
	BookRemote(replica, model string, worker radix.WorkerKey, id string, seqs []uint64, prefill int64, ttl time.Duration) error
	PrefillDoneRemote(replica, id string) error
	CompleteRemote(replica, id string) error
	BindRemote(replica, model, session string, worker radix.WorkerKey, ttl time.Duration) error
}

// Config configures a Sharer; a plain value.
type Config struct {
	Prefix string // subject prefix; empty is "kvr", the prefix of every kvrouterd subject
	// Replica is this replica's id: 1 to 64 bytes of [A-Za-z0-9_-]; empty picks a random one.
	Replica string
	Logger  *slog.Logger
}

// Stats are a Sharer's counters; a plain value.
type Stats struct {
	Published     int64 // messages handed to NATS
	PublishErrors int64 // messages NATS refused (closed, reconnect buffer full, too large) or not started
	Received      int64 // messages on the subscription, own ones included
	SkippedOwn    int64 // own messages, skipped
	Applied       int64 // other replicas' operations applied
	Rejected      map[string]int64
}

// Rejection reasons of Stats.Rejected.
const (
	RejectDecode   = "decode"          // malformed, or its replica is not its subject's
	RejectModel    = "unknown_model"   // a booking for a model not served here
	RejectWorker   = "unknown_worker"  // a booking for a worker not registered here
	RejectRequest  = "unknown_request" // prefill done or completed for a request not booked here
	RejectConflict = "duplicate"       // a booking of a request booked already
	RejectInvalid  = "invalid"         // the router refused its values
	RejectPanic    = "panic"           // handling it panicked (recovered)
)

var rejectReasons = [...]string{RejectDecode, RejectModel, RejectWorker, RejectRequest, RejectConflict, RejectInvalid, RejectPanic}

// Sharer, whose methods are safe for concurrent use, shares this replica's active load with the
// other replicas over NATS: it is the router.LoadSharer of this replica's router and, once
// started, applies the others' messages to it. Booked, PrefillDone and Completed allocate
// nothing once warm and do not wait for the network: core NATS copies the message into the
// connection's buffer, which a NATS goroutine writes out (only a publish that fills the 32 KiB
// buffer writes it itself; while disconnected, messages wait in the reconnect buffer and,
// once that is full, are dropped and counted).
type Sharer struct {
	replica string
	subject string // <prefix>.active.<replica>
	prefix  string // <prefix>.active.
	log     *slog.Logger
	bufs    *freelist.List[[]byte]

	// mu serializes Start and Close. Close holds it while a message being applied finishes,
	// which takes the Sink's locks (the router's load tracker): mu comes before them.
	mu     sync.Mutex
	nc     atomic.Pointer[nats.Conn]
	sub    *nats.Subscription
	closed bool

	msg Msg // the subscription's, which NATS delivers one at a time

	published, pubErrs, received, skipped, applied atomic.Int64
	rejected                                       [len(rejectReasons)]atomic.Int64
}

// New returns a Sharer that publishes nothing until Start.
func New(cfg Config) (*Sharer, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = defaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Replica == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // never fails
		cfg.Replica = hex.EncodeToString(b[:])
	}
	if err := checkID(cfg.Replica); err != nil {
		return nil, err
	}
	return &Sharer{
		replica: cfg.Replica,
		prefix:  cfg.Prefix + ".active.",
		subject: cfg.Prefix + ".active." + cfg.Replica,
		log:     cfg.Logger,
		bufs:    freelist.New[[]byte](),
	}, nil
}

func checkID(r string) error {
	if len(r) == 0 || len(r) > router.MaxReplicaID {
		return fmt.Errorf("replica: replica id %q: %d bytes, want 1 to %d", r, len(r), router.MaxReplicaID)
	}
	for i := 0; i < len(r); i++ {
		c := r[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("replica: replica id %q: byte %d (%q) is not one of [A-Za-z0-9_-]", r, i, c)
		}
	}
	return nil
}

// Replica returns this replica's id.
func (s *Sharer) Replica() string { return s.replica }

// Start publishes through nc from now on and applies the other replicas' messages to sink.
// nc should reconnect for ever and, being the Sharer's own, have no echo: the daemon's comes
// from ingest.Stream.Dial with nats.NoEcho. A Sharer starts once.
func (s *Sharer) Start(nc *nats.Conn, sink Sink) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sub != nil || s.closed {
		return errors.New("replica: a Sharer starts once")
	}
	sub, err := nc.Subscribe(s.prefix+"*", func(m *nats.Msg) {
		// NATS calls this on its own goroutine, where a panic would end the process.
		defer func() {
			if p := recover(); p != nil {
				s.rejected[len(rejectReasons)-1].Add(1) // RejectPanic
				panics.Log(s.log, "load sharing: panic recovered handling a message", p, "subject", m.Subject)
			}
		}()
		s.handle(m, sink)
	})
	if err != nil {
		return fmt.Errorf("load sharing: %w", err)
	}
	s.sub = sub
	s.nc.Store(nc)
	// Make sure the server has the subscription before this replica routes: messages of the
	// others published before it do not reach it. Disconnected, it will have it on reconnecting.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		s.log.Warn("load sharing: subscription not confirmed by the server yet", "err", err)
	}
	return nil
}

// Close stops publishing and applying; a message being applied finishes first.
func (s *Sharer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nc.Store(nil)
	if s.sub != nil && !s.closed {
		// Drain returns at once; wait (boundedly: the connection may be gone) for the
		// messages already delivered to be applied.
		if s.sub.Drain() == nil {
			for deadline := time.Now().Add(5 * time.Second); s.sub.IsValid() && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}
	}
	s.closed = true
}

// Booked publishes a booking (router.LoadSharer).
func (s *Sharer) Booked(model string, worker radix.WorkerKey, id string, seqs []uint64, prefill int64, ttl time.Duration) {
	m := Msg{
		Op: OpBooked, Replica: s.replica, ID: id, Model: model, Worker: worker,
		Prefill: uint64(max(prefill, 0)), Seqs: seqs,
		TTL: uint32(min(max(ttl.Milliseconds(), 1), int64(^uint32(0)))),
	}
	s.publish(&m)
}

// PrefillDone publishes a prefill done (router.LoadSharer).
func (s *Sharer) PrefillDone(id string) {
	m := Msg{Op: OpPrefillDone, Replica: s.replica, ID: id}
	s.publish(&m)
}

// Completed publishes a completion (router.LoadSharer).
func (s *Sharer) Completed(id string) {
	m := Msg{Op: OpCompleted, Replica: s.replica, ID: id}
	s.publish(&m)
}

// SessionBound publishes a session's binding to a worker (router.LoadSharer).
func (s *Sharer) SessionBound(model, session string, worker radix.WorkerKey, ttl time.Duration) {
	m := Msg{Op: OpSession, Replica: s.replica, ID: session, Model: model, Worker: worker,
		TTL: uint32(min(max(ttl.Milliseconds(), 1), int64(^uint32(0))))}
	s.publish(&m)
}

func (s *Sharer) publish(m *Msg) {
	nc := s.nc.Load()
	if nc == nil || len(m.ID) > maxString || len(m.Model) > maxString || len(m.Seqs) > MaxBlocks {
		s.pubErrs.Add(1) // not started, closed, or beyond what the others would decode
		return
	}
	bp := s.bufs.Get()
	b := Append((*bp)[:0], m)
	// Publish copies b into the connection's buffer, or its reconnect buffer while
	// disconnected; a NATS goroutine writes it out.
	if err := nc.Publish(s.subject, b); err != nil {
		if s.pubErrs.Add(1) == 1 {
			s.log.Warn("load sharing: publish failed; counting further failures without logging", "err", err)
		}
	} else {
		s.published.Add(1)
	}
	if cap(b) <= 1<<20 { // a long prompt's buffer is not worth keeping
		*bp = b
		s.bufs.Put(bp)
	}
}

// handle applies one message of another replica; NATS calls it one message at a time.
func (s *Sharer) handle(msg *nats.Msg, sink Sink) {
	s.received.Add(1)
	rep, _ := strings.CutPrefix(msg.Subject, s.prefix)
	if rep == s.replica {
		s.skipped.Add(1)
		return
	}
	m := &s.msg
	if err := Decode(msg.Data, m); err != nil {
		s.reject(RejectDecode, slog.LevelWarn, "load sharing: bad message", "subject", msg.Subject, "err", err)
		return
	}
	if m.Replica != rep {
		s.reject(RejectDecode, slog.LevelWarn, "load sharing: the message's replica is not its subject's", "subject", msg.Subject, "replica", m.Replica)
		return
	}
	var err error
	switch m.Op {
	case OpBooked:
		err = sink.BookRemote(m.Replica, m.Model, m.Worker, m.ID, m.Seqs, int64(m.Prefill), time.Duration(m.TTL)*time.Millisecond)
	case OpPrefillDone:
		err = sink.PrefillDoneRemote(m.Replica, m.ID)
	case OpCompleted:
		err = sink.CompleteRemote(m.Replica, m.ID)
	case OpSession:
		err = sink.BindRemote(m.Replica, m.Model, m.ID, m.Worker, time.Duration(m.TTL)*time.Millisecond)
	}
	// Completions of requests booked before this replica started, and bookings of workers not
	// (yet) registered here, are expected: counted, logged at debug.
	switch {
	case err == nil:
		s.applied.Add(1)
	case errors.Is(err, router.ErrUnknownRequest):
		s.reject(RejectRequest, slog.LevelDebug, "load sharing: unknown request", "replica", m.Replica, "op", m.Op, "err", err)
	case errors.Is(err, router.ErrUnknownWorker):
		s.reject(RejectWorker, slog.LevelDebug, "load sharing: booking of an unknown worker", "replica", m.Replica, "err", err)
	case errors.Is(err, router.ErrUnknownModel):
		s.reject(RejectModel, slog.LevelDebug, "load sharing: booking of an unknown model", "replica", m.Replica, "err", err)
	case errors.Is(err, router.ErrConflict):
		s.reject(RejectConflict, slog.LevelWarn, "load sharing: booking refused", "replica", m.Replica, "err", err)
	default:
		s.reject(RejectInvalid, slog.LevelWarn, "load sharing: refused", "replica", m.Replica, "op", m.Op, "err", err)
	}
}

func (s *Sharer) reject(reason string, level slog.Level, msg string, args ...any) {
	for i, r := range rejectReasons {
		if r == reason {
			s.rejected[i].Add(1)
		}
	}
	if ctx := context.Background(); s.log.Enabled(ctx, level) {
		s.log.Log(ctx, level, msg, append(args, "reason", reason)...)
	}
}

// Stats returns the counters.
func (s *Sharer) Stats() Stats {
	st := Stats{
		Published: s.published.Load(), PublishErrors: s.pubErrs.Load(), Received: s.received.Load(),
		SkippedOwn: s.skipped.Load(), Applied: s.applied.Load(),
		Rejected: make(map[string]int64, len(rejectReasons)),
	}
	for i, r := range rejectReasons {
		st.Rejected[r] = s.rejected[i].Load()
	}
	return st
}

var (
	descPublished = prometheus.NewDesc("kvrouterd_share_published_total", "Load-share messages of this replica published.", nil, nil)
	descPubErrors = prometheus.NewDesc("kvrouterd_share_publish_errors_total", "Load-share messages of this replica NATS refused.", nil, nil)
	descReceived  = prometheus.NewDesc("kvrouterd_share_received_total", "Load-share messages received, this replica's own included.", nil, nil)
	descSkipped   = prometheus.NewDesc("kvrouterd_share_skipped_own_total", "Load-share messages of this replica received back and skipped.", nil, nil)
	descApplied   = prometheus.NewDesc("kvrouterd_share_applied_total", "Other replicas' bookings, prefill-dones and completions applied.", nil, nil)
	descRejected  = prometheus.NewDesc("kvrouterd_share_rejected_total", "Other replicas' load-share messages not applied, by reason.", []string{"reason"}, nil)
)

// Collector returns the Sharer's metrics, read at scrape time.
func (s *Sharer) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Sharer }

func (sc collector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(sc, ch)
}

func (sc collector) Collect(ch chan<- prometheus.Metric) {
	st := sc.s.Stats()
	ch <- prometheus.MustNewConstMetric(descPublished, prometheus.CounterValue, float64(st.Published))
	ch <- prometheus.MustNewConstMetric(descPubErrors, prometheus.CounterValue, float64(st.PublishErrors))
	ch <- prometheus.MustNewConstMetric(descReceived, prometheus.CounterValue, float64(st.Received))
	ch <- prometheus.MustNewConstMetric(descSkipped, prometheus.CounterValue, float64(st.SkippedOwn))
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.CounterValue, float64(st.Applied))
	for _, r := range rejectReasons {
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(st.Rejected[r]), r)
	}
}
