package ingest

// What an engine subscription reads: EngineSource (the sockets of one engine and its
// data-parallel ranks), its flag form, and EngineConfig.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"
)

// ErrEngineSource is wrapped by every error of ParseEngineSource and EngineSource.Validate.
var ErrEngineSource = errors.New("ingest: bad engine source")

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
	// ended by then has failed: the rank is cleared.
	ReplayTimeout time.Duration
	// DialTimeout bounds one attempt to connect to an engine socket (5 s).
	DialTimeout time.Duration
	// RedialMax caps the wait between attempts to connect, which starts at 50 ms and doubles
	// (2 s).
	RedialMax time.Duration
	// StaleAfter is how long a connected rank may hand on no batch before it is reported stale
	// rather than active (60 s). Engines publish nothing while idle: stale is a hint to look.
	StaleAfter time.Duration
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
	// KeepOnGap keeps a rank's blocks when batches were lost for good — a gap the replay
	// socket cannot close, or there is none — as Dynamo does, and goes on with the next batch;
	// false clears the rank first (the daemon's --clear-on-gap). Either way the gap is counted
	// and logged. A restart, or a batch kvrouterd itself lost, still clears the rank.
	// docs/decisions.md, "After batches are lost for good", says why.
	KeepOnGap bool
	// Resume, if set, says where a new subscription takes up a rank's stream: the Event.Batch
	// of the last batch the index holds from it (1 + its sequence), 0 for none. A rank resumed
	// treats its first batch as if its connection had been lost after that one: batches
	// missed in between are fetched from the replay socket, or the rank is cleared if they
	// cannot be, and a sequence that went back means the engine restarted meanwhile.
	Resume func(worker uint64, rank uint32) uint64
}

// DefaultStallTimeout is EngineConfig.StallTimeout's default.
const DefaultStallTimeout = 10 * time.Second

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
		c.StallTimeout = DefaultStallTimeout
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = DefaultStaleAfter
	}
}
