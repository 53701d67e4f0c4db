package ingest

// Load sharing between router replicas.
//
// Replicas behind one event stream hold the same index but each books only the requests it
// routed (router.LoadSharer). A Sharer publishes this replica's bookings, prefill-dones and
// completions on plain NATS (not kept in the stream: they matter only while the requests run)
// and applies every other replica's to its router, so that each replica's load view includes
// the whole fleet's requests. Expiry is not published: each replica expires its copy after
// the time the booking carries.
//
// # Subject
//
// Replica R publishes on <prefix>.active.<R> and every Sharer subscribes to <prefix>.active.*,
// skipping its own subject before decoding (on a connection of its own without echo,
// Stream.Dial with nats.NoEcho, its own messages do not even come back). A replica id is 1 to 64 bytes of [A-Za-z0-9_-]: random
// per process unless configured. Two live processes must not share one: each would skip the
// other's messages.
//
// NATS keeps one publisher's messages in order, so a booking reaches the others before its
// completion. A booking lost (a slow subscriber, a reconnect with a full buffer, a replica
// started after it) is missing from the receiver's view until its completion comes, which is
// then counted as unknown_request; a completion lost leaves the remote booking to expire.
//
// # Message
//
// One operation per message, little-endian, every length checked; a message that decodes
// re-encodes to the same bytes.
//
//	offset    size  field
//	0         4     magic "KVRA"
//	4         1     version (1)
//	5         1     op: 1 booked, 2 prefill done, 3 completed
//	6         1     R: replica id length, 1..64
//	7         R     replica id
//	7+R       2     L: request id length, 1..1024
//	9+R       L     request id, as the replica's client gave it
//	                -- op 1 (booked) only: --
//	9+R+L     2     M: model name length, 1..1024
//	11+R+L    M     model name; let o = 11+R+L+M
//	o         8     worker id
//	o+8       4     data-parallel rank
//	o+12      8     prefill tokens: the request's uncached prompt tokens
//	o+20      4     ttl: milliseconds until the booking expires unless completed, ≥ 1
//	o+24      4     n: blocks booked, at most 4,194,304
//	o+28      8n    the blocks' sequence hashes (router hashes, first block first)
//
// A booking of a 2,048-token prompt (128 blocks of 16) with a 36-byte request id, a 16-byte
// replica id and a 30-byte model name is 1,145 bytes; a completion, 61.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/internal/freelist"
	"github.com/kvrouterd/kvrouterd/internal/panics"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// ShareOp is the operation of a load-share message.
type ShareOp uint8

// Operations of load-share messages.
const (
	ShareBooked      ShareOp = 1
	SharePrefillDone ShareOp = 2
	ShareCompleted   ShareOp = 3
)

// Limits of load-share messages.
const (
	shareVersion   = 1
	maxShareString = 1024
	// MaxShareBlocks bounds the blocks of a booking: a prompt of router.MaxTokens tokens in
	// blocks of one.
	MaxShareBlocks = router.MaxTokens
)

var shareMagic = [4]byte{'K', 'V', 'R', 'A'}

// ErrShareMsg is what every load-share decode error wraps.
var ErrShareMsg = errors.New("ingest: malformed load-share message")

// ShareMsg is one load-share message. After DecodeShare its strings alias the decoded buffer
// and Seqs reuses its own array: valid until the next decode into it. A value belongs to one
// goroutine.
type ShareMsg struct {
	Op      ShareOp
	Replica string
	ID      string
	// Booked only:
	Model   string
	Worker  radix.WorkerKey
	Prefill uint64
	TTL     uint32 // milliseconds
	Seqs    []uint64
}

// AppendShare appends m's encoding to dst. Fields beyond their limits are the caller's error:
// the message will not decode.
func AppendShare(dst []byte, m *ShareMsg) []byte {
	dst = append(dst, shareMagic[:]...)
	dst = append(dst, shareVersion, byte(m.Op), byte(len(m.Replica)))
	dst = append(dst, m.Replica...)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m.ID)))
	dst = append(dst, m.ID...)
	if m.Op != ShareBooked {
		return dst
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m.Model)))
	dst = append(dst, m.Model...)
	dst = binary.LittleEndian.AppendUint64(dst, m.Worker.ID)
	dst = binary.LittleEndian.AppendUint32(dst, m.Worker.Rank)
	dst = binary.LittleEndian.AppendUint64(dst, m.Prefill)
	dst = binary.LittleEndian.AppendUint32(dst, m.TTL)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.Seqs)))
	for _, s := range m.Seqs {
		dst = binary.LittleEndian.AppendUint64(dst, s)
	}
	return dst
}

// shareDecoder reads a message front to back; the first error sticks. at is the offset of the
// field read last, for the error.
type shareDecoder struct {
	b       []byte
	off, at int
	err     error
}

// fail records an error in the field read last.
func (d *shareDecoder) fail(field, format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: field %q at offset %d: %s", ErrShareMsg, field, d.at, fmt.Sprintf(format, args...))
	}
}

// take returns the next n bytes of field, or nil once anything failed.
func (d *shareDecoder) take(field string, n int) []byte {
	if d.err != nil {
		return nil
	}
	d.at = d.off
	if len(d.b)-d.off < n {
		d.fail(field, "truncated: need %d bytes, have %d", n, len(d.b)-d.off)
		return nil
	}
	d.off += n
	return d.b[d.at:d.off:d.off]
}

func (d *shareDecoder) u8(field string) uint8 {
	if b := d.take(field, 1); b != nil {
		return b[0]
	}
	return 0
}

func (d *shareDecoder) u16(field string) uint16 {
	if b := d.take(field, 2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *shareDecoder) u32(field string) uint32 {
	if b := d.take(field, 4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *shareDecoder) u64(field string) uint64 {
	if b := d.take(field, 8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// str reads a string of n bytes, 1..max (n was read last, as field's length), aliasing the
// buffer.
func (d *shareDecoder) str(field string, n, max int) string {
	if d.err == nil && (n < 1 || n > max) {
		d.fail(field+"_length", "%d, want 1 to %d", n, max)
	}
	if b := d.take(field, n); len(b) > 0 {
		return unsafe.String(&b[0], len(b))
	}
	return ""
}

// DecodeShare decodes a load-share message into m. Errors wrap ErrShareMsg and name the field
// and its byte offset. It allocates only to grow m.Seqs.
func DecodeShare(b []byte, m *ShareMsg) error {
	d := shareDecoder{b: b}
	if mg := d.take("magic", 4); mg != nil && [4]byte(mg) != shareMagic {
		d.fail("magic", "%q, want %q", mg, shareMagic[:])
	}
	if v := d.u8("version"); d.err == nil && v != shareVersion {
		d.fail("version", "%d, want %d", v, shareVersion)
	}
	m.Op = ShareOp(d.u8("op"))
	if d.err == nil && (m.Op < ShareBooked || m.Op > ShareCompleted) {
		d.fail("op", "unknown op %d", m.Op)
	}
	m.Replica = d.str("replica", int(d.u8("replica_length")), router.MaxReplicaID)
	m.ID = d.str("request_id", int(d.u16("request_id_length")), maxShareString)
	m.Model, m.Worker, m.Prefill, m.TTL, m.Seqs = "", radix.WorkerKey{}, 0, 0, m.Seqs[:0]
	if m.Op == ShareBooked {
		m.Model = d.str("model", int(d.u16("model_length")), maxShareString)
		m.Worker.ID = d.u64("worker")
		m.Worker.Rank = d.u32("dp_rank")
		m.Prefill = d.u64("prefill_tokens")
		if m.TTL = d.u32("ttl_ms"); d.err == nil && m.TTL == 0 {
			d.fail("ttl_ms", "must be at least 1")
		}
		n := int(d.u32("blocks"))
		if d.err == nil && n > MaxShareBlocks {
			d.fail("blocks", "%d, at most %d", n, MaxShareBlocks)
		}
		if hs := d.take("block_hashes", 8*n); hs != nil {
			for i := range n {
				m.Seqs = append(m.Seqs, binary.LittleEndian.Uint64(hs[8*i:]))
			}
		}
	}
	if d.err == nil && d.off != len(b) {
		d.at = d.off
		d.fail("end", "%d trailing bytes", len(b)-d.off)
	}
	if d.err != nil {
		m.Op, m.Replica, m.ID, m.Model, m.Seqs = 0, "", "", "", m.Seqs[:0]
	}
	return d.err
}

// ShareSink applies other replicas' bookings: router.Router.
type ShareSink interface {
	BookRemote(replica, model string, worker radix.WorkerKey, id string, seqs []uint64, prefill int64, ttl time.Duration) error
	PrefillDoneRemote(replica, id string) error
	CompleteRemote(replica, id string) error
}

// ShareConfig configures a Sharer; a plain value.
type ShareConfig struct {
	Prefix string // subject prefix (DefaultPrefix)
	// Replica is this replica's id: 1 to 64 bytes of [A-Za-z0-9_-]; empty picks a random one.
	Replica string
	Logger  *slog.Logger
}

// ShareStats are a Sharer's counters; a plain value.
type ShareStats struct {
	Published     int64 // messages handed to NATS
	PublishErrors int64 // messages NATS refused (closed, reconnect buffer full, too large) or not started
	Received      int64 // messages on the subscription, own ones included
	SkippedOwn    int64 // own messages, skipped
	Applied       int64 // other replicas' operations applied
	Rejected      map[string]int64
}

// Rejection reasons of ShareStats.Rejected.
const (
	ShareRejectDecode   = "decode"          // malformed, or its replica is not its subject's
	ShareRejectModel    = "unknown_model"   // a booking for a model not served here
	ShareRejectWorker   = "unknown_worker"  // a booking for a worker not registered here
	ShareRejectRequest  = "unknown_request" // prefill done or completed for a request not booked here
	ShareRejectConflict = "duplicate"       // a booking of a request booked already
	ShareRejectInvalid  = "invalid"         // the router refused its values
	ShareRejectPanic    = "panic"           // handling it panicked (recovered)
)

var shareRejectReasons = [...]string{ShareRejectDecode, ShareRejectModel, ShareRejectWorker, ShareRejectRequest, ShareRejectConflict, ShareRejectInvalid, ShareRejectPanic}

// Sharer shares this replica's active load with the other replicas over NATS: it is the
// router.LoadSharer of this replica's router and, once started, applies the others' messages
// to it. Its methods are safe for concurrent use. Booked, PrefillDone and Completed allocate
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

	mu     sync.Mutex // Start and Close
	nc     atomic.Pointer[nats.Conn]
	sub    *nats.Subscription
	closed bool

	msg ShareMsg // the subscription's, which NATS delivers one at a time

	published, pubErrs, received, skipped, applied atomic.Int64
	rejected                                       [len(shareRejectReasons)]atomic.Int64
}

// NewSharer returns a Sharer that publishes nothing until Start.
func NewSharer(cfg ShareConfig) (*Sharer, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Replica == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // never fails
		cfg.Replica = hex.EncodeToString(b[:])
	}
	if err := checkReplica(cfg.Replica); err != nil {
		return nil, err
	}
	return &Sharer{
		replica: cfg.Replica,
		prefix:  cfg.Prefix + ".active.",
		subject: cfg.Prefix + ".active." + cfg.Replica,
		log:     cfg.Logger,
		bufs:    freelist.New[[]byte](4 * runtime.GOMAXPROCS(0)),
	}, nil
}

func checkReplica(r string) error {
	if len(r) == 0 || len(r) > router.MaxReplicaID {
		return fmt.Errorf("ingest: replica id %q: %d bytes, want 1 to %d", r, len(r), router.MaxReplicaID)
	}
	for i := 0; i < len(r); i++ {
		c := r[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("ingest: replica id %q: byte %d (%q) is not one of [A-Za-z0-9_-]", r, i, c)
		}
	}
	return nil
}

// Replica returns this replica's id.
func (s *Sharer) Replica() string { return s.replica }

// Start publishes through nc from now on and applies the other replicas' messages to sink.
// nc should reconnect forever (see ConnectOptions). A Sharer starts once.
func (s *Sharer) Start(nc *nats.Conn, sink ShareSink) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sub != nil || s.closed {
		return errors.New("ingest: a Sharer starts once")
	}
	sub, err := nc.Subscribe(s.prefix+"*", func(m *nats.Msg) {
		// NATS calls this on its own goroutine, where a panic would end the process.
		defer func() {
			if p := recover(); p != nil {
				s.rejected[len(shareRejectReasons)-1].Add(1) // ShareRejectPanic
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
	m := ShareMsg{
		Op: ShareBooked, Replica: s.replica, ID: id, Model: model, Worker: worker,
		Prefill: uint64(max(prefill, 0)), Seqs: seqs,
		TTL: uint32(min(max(ttl.Milliseconds(), 1), int64(^uint32(0)))),
	}
	s.publish(&m)
}

// PrefillDone publishes a prefill done (router.LoadSharer).
func (s *Sharer) PrefillDone(id string) {
	m := ShareMsg{Op: SharePrefillDone, Replica: s.replica, ID: id}
	s.publish(&m)
}

// Completed publishes a completion (router.LoadSharer).
func (s *Sharer) Completed(id string) {
	m := ShareMsg{Op: ShareCompleted, Replica: s.replica, ID: id}
	s.publish(&m)
}

func (s *Sharer) publish(m *ShareMsg) {
	nc := s.nc.Load()
	if nc == nil || len(m.ID) > maxShareString || len(m.Model) > maxShareString || len(m.Seqs) > MaxShareBlocks {
		s.pubErrs.Add(1) // not started, closed, or beyond what the others would decode
		return
	}
	bp := s.bufs.Get()
	b := AppendShare((*bp)[:0], m)
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
func (s *Sharer) handle(msg *nats.Msg, sink ShareSink) {
	s.received.Add(1)
	rep, _ := strings.CutPrefix(msg.Subject, s.prefix)
	if rep == s.replica {
		s.skipped.Add(1)
		return
	}
	m := &s.msg
	if err := DecodeShare(msg.Data, m); err != nil {
		s.reject(ShareRejectDecode, slog.LevelWarn, "load sharing: bad message", "subject", msg.Subject, "err", err)
		return
	}
	if m.Replica != rep {
		s.reject(ShareRejectDecode, slog.LevelWarn, "load sharing: the message's replica is not its subject's", "subject", msg.Subject, "replica", m.Replica)
		return
	}
	var err error
	switch m.Op {
	case ShareBooked:
		err = sink.BookRemote(m.Replica, m.Model, m.Worker, m.ID, m.Seqs, int64(m.Prefill), time.Duration(m.TTL)*time.Millisecond)
	case SharePrefillDone:
		err = sink.PrefillDoneRemote(m.Replica, m.ID)
	case ShareCompleted:
		err = sink.CompleteRemote(m.Replica, m.ID)
	}
	// Completions of requests booked before this replica started, and bookings of workers not
	// (yet) registered here, are expected: counted, logged at debug.
	switch {
	case err == nil:
		s.applied.Add(1)
	case errors.Is(err, router.ErrUnknownRequest):
		s.reject(ShareRejectRequest, slog.LevelDebug, "load sharing: unknown request", "replica", m.Replica, "op", m.Op, "err", err)
	case errors.Is(err, router.ErrUnknownWorker):
		s.reject(ShareRejectWorker, slog.LevelDebug, "load sharing: booking of an unknown worker", "replica", m.Replica, "err", err)
	case errors.Is(err, router.ErrUnknownModel):
		s.reject(ShareRejectModel, slog.LevelDebug, "load sharing: booking of an unknown model", "replica", m.Replica, "err", err)
	case errors.Is(err, router.ErrConflict):
		s.reject(ShareRejectConflict, slog.LevelWarn, "load sharing: booking refused", "replica", m.Replica, "err", err)
	default:
		s.reject(ShareRejectInvalid, slog.LevelWarn, "load sharing: refused", "replica", m.Replica, "op", m.Op, "err", err)
	}
}

func (s *Sharer) reject(reason string, level slog.Level, msg string, args ...any) {
	for i, r := range shareRejectReasons {
		if r == reason {
			s.rejected[i].Add(1)
		}
	}
	if ctx := context.Background(); s.log.Enabled(ctx, level) {
		s.log.Log(ctx, level, msg, append(args, "reason", reason)...)
	}
}

// Stats returns the counters.
func (s *Sharer) Stats() ShareStats {
	st := ShareStats{
		Published: s.published.Load(), PublishErrors: s.pubErrs.Load(), Received: s.received.Load(),
		SkippedOwn: s.skipped.Load(), Applied: s.applied.Load(),
		Rejected: make(map[string]int64, len(shareRejectReasons)),
	}
	for i, r := range shareRejectReasons {
		st.Rejected[r] = s.rejected[i].Load()
	}
	return st
}

var (
	descSharePublished = prometheus.NewDesc("kvrouterd_share_published_total", "Load-share messages of this replica published.", nil, nil)
	descSharePubErrors = prometheus.NewDesc("kvrouterd_share_publish_errors_total", "Load-share messages of this replica NATS refused.", nil, nil)
	descShareReceived  = prometheus.NewDesc("kvrouterd_share_received_total", "Load-share messages received, this replica's own included.", nil, nil)
	descShareSkipped   = prometheus.NewDesc("kvrouterd_share_skipped_own_total", "Load-share messages of this replica received back and skipped.", nil, nil)
	descShareApplied   = prometheus.NewDesc("kvrouterd_share_applied_total", "Other replicas' bookings, prefill-dones and completions applied.", nil, nil)
	descShareRejected  = prometheus.NewDesc("kvrouterd_share_rejected_total", "Other replicas' load-share messages not applied, by reason.", []string{"reason"}, nil)
)

// Collector returns the Sharer's metrics, read at scrape time.
func (s *Sharer) Collector() prometheus.Collector { return shareCollector{s} }

type shareCollector struct{ s *Sharer }

func (sc shareCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(sc, ch)
}

func (sc shareCollector) Collect(ch chan<- prometheus.Metric) {
	st := sc.s.Stats()
	ch <- prometheus.MustNewConstMetric(descSharePublished, prometheus.CounterValue, float64(st.Published))
	ch <- prometheus.MustNewConstMetric(descSharePubErrors, prometheus.CounterValue, float64(st.PublishErrors))
	ch <- prometheus.MustNewConstMetric(descShareReceived, prometheus.CounterValue, float64(st.Received))
	ch <- prometheus.MustNewConstMetric(descShareSkipped, prometheus.CounterValue, float64(st.SkippedOwn))
	ch <- prometheus.MustNewConstMetric(descShareApplied, prometheus.CounterValue, float64(st.Applied))
	for _, r := range shareRejectReasons {
		ch <- prometheus.MustNewConstMetric(descShareRejected, prometheus.CounterValue, float64(st.Rejected[r]), r)
	}
}
