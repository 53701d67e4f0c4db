package mocker

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Config is one mocker's configuration: the single source of its defaults (Defaults), filled
// from flags by Flags and checked by Check. A plain value.
type Config struct {
	HTTPAddr string // the OpenAI API's address
	Model    string // the one model served
	WorkerID uint64 // the worker id registered with kvrouterd

	BlockSize        int        // tokens per KV block
	Blocks           int        // KV capacity in blocks
	MaxSeqs          int        // running sequences at most
	MaxBatchedTokens int        // tokens per step at most
	Timing           sim.Timing // the step-time model
	Speedup          float64    // simulated time runs this many times faster than wall time

	MaxModelLen      int // prompt + output tokens at most; 0: the whole cache (Blocks × BlockSize)
	DefaultMaxTokens int // output tokens of a request that sets no max_tokens

	KVEventsAddr  string // ZMQ PUB endpoint of the KV events (tcp://host:port); empty: none
	ReplayAddr    string // ZMQ ROUTER endpoint serving past batches; empty: none
	EventsForm    string // payload layout: vllm-array, vllm-map-events or vllm-map
	Register      string // kvrouterd's URL to register with (http://host:port); empty: none
	AdvertiseHost string // host in the endpoints registered; empty: each address's own host, 127.0.0.1 for a wildcard

	ShutdownTimeout time.Duration // how long SIGTERM waits for requests in flight before aborting them
	LogLevel        string        // debug, info, warn or error

	// Disaggregated serving (see the package doc): the role registered with kvrouterd, and
	// the KV transfer's cost model.
	Role              string        // prefill, decode or both
	KVBytesPerToken   int           // KV cache bytes of one token, all layers
	KVTransferGbps    float64       // the link's bandwidth between two workers, Gbit/s
	KVTransferLatency time.Duration // fixed cost of one transfer, on top of bytes / bandwidth
	KVTransferTimeout time.Duration // how long a prefill worker keeps blocks nobody reads (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)

	// Failures, for end-to-end tests of what stands in front of the engine.
	FailRate float64 // fraction of generate requests answered 500, drawn at random
	DieAfter int     // generate requests served before the next one crashes the mocker (Mocker.Died); 0: never
}

// Defaults returns the default configuration: sim's worker model (Dynamo's mocker's scheduler
// limits and step times) at kvrouterd's default block size of 16, vLLM's ports.
func Defaults() Config {
	d := sim.DefaultWorkerConfig()
	return Config{
		HTTPAddr:         ":8000",
		Model:            "kvr-mock",
		WorkerID:         1,
		BlockSize:        16,
		Blocks:           d.Blocks,
		MaxSeqs:          d.MaxSeqs,
		MaxBatchedTokens: d.MaxBatchedTokens,
		Timing:           d.Timing,
		Speedup:          1,
		DefaultMaxTokens: 16,
		KVEventsAddr:     "tcp://127.0.0.1:5557",
		EventsForm:       "vllm-array",
		ShutdownTimeout:  30 * time.Second,
		LogLevel:         "info",
		Role:             "both",
		// Llama-3-8B in bf16: 32 layers × 8 KV heads × 128 dims × 2 (K and V) × 2 bytes.
		KVBytesPerToken: 32 * 8 * 128 * 2 * 2,
		// One 400 Gbit/s RDMA NIC (NDR InfiniBand or 400GbE, ConnectX-7 class) per worker.
		KVTransferGbps: 400,
		// A read request and its completion notice: a few round trips of control messages.
		KVTransferLatency: time.Millisecond,
		KVTransferTimeout: 480 * time.Second,
	}
}

// Flags defines c's flags on fs, each defaulting to c's current value.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "address of the OpenAI-compatible API")
	fs.StringVar(&c.Model, "model", c.Model, "the model name served (requests naming another get 404)")
	fs.Uint64Var(&c.WorkerID, "worker-id", c.WorkerID, "worker id registered with kvrouterd (unique per mocker)")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "tokens per KV block (kvrouterd's default is 16)")
	fs.IntVar(&c.Blocks, "blocks", c.Blocks, "KV cache capacity in blocks")
	fs.IntVar(&c.MaxSeqs, "max-seqs", c.MaxSeqs, "running sequences at most")
	fs.IntVar(&c.MaxBatchedTokens, "max-batched-tokens", c.MaxBatchedTokens, "tokens per scheduler step at most (prefill chunks + one per decoding sequence)")
	fs.Float64Var(&c.Timing.P2, "prefill-t2", c.Timing.P2, "prefill ms = t2·T² + t1·T + t0, T = prompt tokens computed in the step")
	fs.Float64Var(&c.Timing.P1, "prefill-t1", c.Timing.P1, "see --prefill-t2")
	fs.Float64Var(&c.Timing.P0, "prefill-t0", c.Timing.P0, "see --prefill-t2")
	fs.Float64Var(&c.Timing.D2, "decode-u2", c.Timing.D2, "decode ms = max(floor, u2·u² + u1·u + u0), u = fraction of the KV cache held by running sequences")
	fs.Float64Var(&c.Timing.D1, "decode-u1", c.Timing.D1, "see --decode-u2")
	fs.Float64Var(&c.Timing.D0, "decode-u0", c.Timing.D0, "see --decode-u2")
	fs.Float64Var(&c.Timing.DecodeFloor, "decode-floor", c.Timing.DecodeFloor, "least decode ms of a step; see --decode-u2")
	fs.Float64Var(&c.Speedup, "speedup", c.Speedup, "run simulated time this many times faster than wall time (steps sleep duration/speedup)")
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "prompt + output tokens of a request at most; 0: the whole KV cache")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", c.DefaultMaxTokens, "output tokens of a request without max_tokens")
	fs.StringVar(&c.KVEventsAddr, "kv-events-addr", c.KVEventsAddr, "ZMQ PUB endpoint publishing vLLM's KV events (port 0: any free port); empty: none")
	fs.StringVar(&c.ReplayAddr, "replay-addr", c.ReplayAddr, "ZMQ ROUTER endpoint replaying the last 10,000 event batches, as vLLM's replay socket; empty: none")
	fs.StringVar(&c.EventsForm, "kv-events-form", c.EventsForm, "payload layout: vllm-array (vLLM's default up to v0.23), vllm-map-events (tagged-map events) or vllm-map")
	fs.StringVar(&c.Register, "register", c.Register, "kvrouterd to register with at start (POST /v1/workers, retried until it answers) and leave at shutdown: http://host:port")
	fs.StringVar(&c.AdvertiseHost, "advertise-host", c.AdvertiseHost, "host named in the registered endpoints; empty: each address's own host (127.0.0.1 for a wildcard)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "on SIGTERM, how long requests in flight may run before they are aborted")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.Role, "role", c.Role, "role registered with kvrouterd: prefill, decode or both (every mocker serves both kinds of kv_transfer_params, as vLLM with NixlConnector and kv_role kv_both)")
	fs.IntVar(&c.KVBytesPerToken, "kv-bytes-per-token", c.KVBytesPerToken, "KV cache bytes per token, all layers (default: Llama-3-8B in bf16; Llama-3-70B is 327680)")
	fs.Float64Var(&c.KVTransferGbps, "kv-transfer-gbps", c.KVTransferGbps, "bandwidth of the link a decode worker reads prefilled KV blocks over, Gbit/s (default: one 400G RDMA NIC)")
	fs.DurationVar(&c.KVTransferLatency, "kv-transfer-latency", c.KVTransferLatency, "fixed cost of one KV transfer, added to bytes / bandwidth")
	fs.DurationVar(&c.KVTransferTimeout, "kv-transfer-timeout", c.KVTransferTimeout, "how long a prefill worker keeps a finished request's blocks for a decode worker to read before freeing them (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT); simulated time, like step times")
	fs.Float64Var(&c.FailRate, "fail-rate", c.FailRate, "fraction (0…1) of the valid completion and chat requests answered 500 with a vLLM error body, drawn at random; streamed ones too, before any event")
	fs.IntVar(&c.DieAfter, "die-after", c.DieAfter, "crash when completion or chat request N+1 arrives, after N: close the listener, reset every open connection (streams cut short) and exit with status 3, without leaving kvrouterd; 0: never")
}

// Check reports the first invalid setting of c, naming its flag.
func (c *Config) Check() error {
	bad := func(flag, format string, args ...any) error {
		return fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...))
	}
	switch {
	case c.HTTPAddr == "":
		return bad("http-addr", "empty")
	case c.Model == "":
		return bad("model", "empty")
	case c.BlockSize < 1 || c.BlockSize > 65536:
		return bad("block-size", "%d is not in 1…65536", c.BlockSize)
	case c.Blocks < 1:
		return bad("blocks", "%d is not positive", c.Blocks)
	case c.MaxSeqs < 1:
		return bad("max-seqs", "%d is not positive", c.MaxSeqs)
	case c.MaxBatchedTokens < 1:
		return bad("max-batched-tokens", "%d is not positive", c.MaxBatchedTokens)
	case c.Timing == sim.Timing{}:
		return bad("prefill-t0", "every timing coefficient is 0: steps would take no time")
	case !(c.Speedup > 0) || c.Speedup > 1e9:
		return bad("speedup", "%v is not in (0, 1e9]", c.Speedup)
	case c.MaxModelLen < 0 || c.MaxModelLen > c.Blocks*c.BlockSize:
		return bad("max-model-len", "%d is not in 0…%d (the KV cache's tokens)", c.MaxModelLen, c.Blocks*c.BlockSize)
	case c.DefaultMaxTokens < 1:
		return bad("default-max-tokens", "%d is not positive", c.DefaultMaxTokens)
	case c.ShutdownTimeout < 0:
		return bad("shutdown-timeout", "negative")
	case c.Role != "prefill" && c.Role != "decode" && c.Role != "both":
		return bad("role", "%q is not prefill, decode or both", c.Role)
	case c.KVBytesPerToken < 1:
		return bad("kv-bytes-per-token", "%d is not positive", c.KVBytesPerToken)
	case !(c.KVTransferGbps > 0) || c.KVTransferGbps > 1e6:
		return bad("kv-transfer-gbps", "%v is not in (0, 1e6]", c.KVTransferGbps)
	case c.KVTransferLatency < 0:
		return bad("kv-transfer-latency", "negative")
	case c.KVTransferTimeout <= 0:
		return bad("kv-transfer-timeout", "%v is not positive", c.KVTransferTimeout)
	case !(c.FailRate >= 0 && c.FailRate <= 1):
		return bad("fail-rate", "%v is not a fraction in 0…1", c.FailRate)
	case c.DieAfter < 0:
		return bad("die-after", "%d is negative (0: never die)", c.DieAfter)
	}
	if _, err := c.form(); err != nil {
		return bad("kv-events-form", "%v", err)
	}
	for _, e := range []struct{ flag, addr string }{{"kv-events-addr", c.KVEventsAddr}, {"replay-addr", c.ReplayAddr}} {
		if e.addr != "" && !strings.HasPrefix(e.addr, "tcp://") {
			return bad(e.flag, "%q is not tcp://host:port", e.addr)
		}
	}
	if c.ReplayAddr != "" && c.KVEventsAddr == "" {
		return bad("replay-addr", "a replay socket without --kv-events-addr has nothing to replay")
	}
	if c.Register != "" {
		u, err := url.Parse(c.Register)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("register", "%q is not http://host:port", c.Register)
		}
		if c.KVEventsAddr == "" {
			return bad("register", "kvrouterd needs the KV events: set --kv-events-addr")
		}
	}
	if _, err := c.level(); err != nil {
		return bad("log-level", "%v", err)
	}
	return nil
}

func (c *Config) maxModelLen() int {
	if c.MaxModelLen > 0 {
		return c.MaxModelLen
	}
	return c.Blocks * c.BlockSize
}

func (c *Config) form() (wire.EngineForm, error) {
	switch c.EventsForm {
	case "vllm-array":
		return wire.EngineForm{}, nil
	case "vllm-map-events":
		return wire.EngineForm{MapEvents: true}, nil
	case "vllm-map":
		return wire.EngineForm{MapBatch: true, MapEvents: true}, nil
	}
	return wire.EngineForm{}, fmt.Errorf("%q is not vllm-array, vllm-map-events or vllm-map", c.EventsForm)
}

func (c *Config) level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, errors.New("not debug, info, warn or error")
	}
	return l, nil
}

func (c *Config) workerConfig() sim.WorkerConfig {
	return sim.WorkerConfig{Blocks: c.Blocks, BlockSize: c.BlockSize, MaxSeqs: c.MaxSeqs,
		MaxBatchedTokens: c.MaxBatchedTokens, Timing: c.Timing}
}
