package daemon

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/server"
)

// Config is the daemon's whole configuration, a plain value: Defaults, then what the command sets
// (environment variables, then flags, through Flags), then Check. Every default is written here
// and nowhere else.
type Config struct {
	Shards             int
	HTTPAddr           string
	DataDir            string
	BlockSize          int
	RouterMode         string
	OverlapScoreWeight float64
	RouterTemperature  float64
	TrackPrefillTokens bool
	// The load model: Dynamo main's cost formula and its terms (--router-cost main), booking
	// without assumed reuse, output blocks.
	RouterCost                string
	CacheWeight               float64
	LoadAware, Agentic        bool
	PrefillLoadModel          string
	OverlapScoreCredit        float64
	OverlapScoreCreditDecay   float64
	PrefillLoadScale          float64
	DecodeActiveRequestWeight float64
	// HostCacheHitWeight and DiskCacheHitWeight credit the blocks the lower storage tiers add
	// to a worker's device prefix (host; disk and external), in both cost formulas.
	HostCacheHitWeight float64
	DiskCacheHitWeight float64
	NoAssumeKVReuse    bool
	TrackOutputBlocks  bool
	// The identities active blocks are booked under (tracking.go): public-xxh3-v1, or
	// keyed-xxh3-v1 with the provider's 32-byte key file and its key id (epoch).
	RouterTrackingHash    string
	RouterTrackingKeyFile string
	RouterTrackingKeyID   string
	RequestExpiry         time.Duration

	// The router queue: off unless RouterQueueThreshold is set (Dynamo main's rule).
	RouterQueueThreshold   OptFloat
	RouterQueuePolicy      string
	RouterPolicyConfig     string // Dynamo's policy classes (router.ParsePolicyConfig): queues the models it has a profile for
	RouterQueueMaxRequests int
	RouterQueueMaxWait     time.Duration
	TTFTSLO                time.Duration

	// Session affinity: off unless its time to live is set.
	SessionAffinityTTL  time.Duration
	SessionAffinityMode string
	MaxCandidates       int

	// Predict-on-route: off unless its time to live is set.
	PredictedTTL time.Duration

	// Disaggregated prefill/decode (disagg.go): --enforce-disagg, and conditional
	// disaggregation, off unless ConditionalDisagg, set by its flags or its JSON config.
	EnforceDisagg                     bool
	ConditionalDisagg                 bool
	ConditionalDisaggConfig           string
	ConditionalDisaggPolicy           string
	ConditionalDisaggPrefillThreshold OptFloat
	ConditionalDisaggDecodeThreshold  OptFloat

	// Busy thresholds (busy.go): unset unless given. OverloadStatus answers a route refused
	// as every eligible worker is overloaded.
	ActiveDecodeBlocksThreshold      OptFloat
	ActivePrefillTokensThreshold     OptUint
	ActivePrefillTokensThresholdFrac OptFloat
	WaitingRequestsThreshold         OptUint
	OverloadStatus                   int

	MaxBlocks         int64
	MaxIndexBytes     int64
	QueueLen          int
	MaxBodyBytes      int
	HTTPReadBuffer    int
	HTTPWriteBuffer   int
	HTTPMaxConns      int
	HTTPMaxConnsPerIP int // 0: a quarter of HTTPMaxConns
	HTTPIdleTimeout   time.Duration
	ShutdownTimeout   time.Duration
	LogLevel          string
	LogFormat         string
	LogFile           string // "" logs to stderr
	// TransparentHugePages is "off" (the daemon keeps them out of its memory, whatever the
	// host's mode: restores are faster without) or "system" (the host's mode applies).
	TransparentHugePages string

	// Dynamo's indexer peers: recovery from their /dump at start, and the block tree that
	// lets this one's /dump answer in Dynamo's form.
	Peers         string // comma-separated URLs
	KeepBlockTree bool
	// TestEndpoints mounts Dynamo's listener-control test endpoints, /test/pause_listener and
	// /test/resume_listener (Dynamo's switch: DYN_KV_INDEXER_TEST_ENDPOINTS).
	TestEndpoints bool

	// DynamoIgnored are the Dynamo settings the command line or environment gave that kvrouterd
	// accepts without effect; Start logs one warning for each.
	DynamoIgnored []IgnoredSetting

	// Event ingestion.
	NATSURL       string
	NATSListen    string
	NATSNoAuth    bool     // the embedded server takes anonymous clients
	NATS          NATSAuth // for --nats-url
	NATSStream    string
	NATSPrefix    string
	NATSMaxAge    time.Duration
	NATSMaxBytes  int64
	NATSReplicas  int
	NATSStartSeq  uint64
	WorkerTimeout time.Duration
	ClearOnGap    bool
	ZMQ           []ingest.EngineSource
	ZMQLimits     ZMQLimits
	ZMQStaleAfter time.Duration

	// Replicas.
	ShareLoad bool
	ReplicaID string

	// Persistence.
	NoSnapshots      bool
	SnapshotInterval time.Duration
	SnapshotKeep     int
	BootstrapFrom    string
	MinFreeDisk      int64

	// Dynamo's selection service: its own listener, off when empty.
	FrontendAddr    string
	FrontendRetries int
	FrontendTimeout time.Duration
	// Outlier ejection of failing workers (router.EjectConfig): off, the failures in a row
	// that eject, the first ejection's length, the longest, and the most of a model's ranks
	// out at once (percent).
	WorkerEject              bool
	WorkerEjectFailures      int
	WorkerEjectBaseTime      time.Duration
	WorkerEjectMaxTime       time.Duration
	WorkerEjectMaxPercent    int
	SelectionAddr            string
	SlotTrackerAddr          string
	SelectionCacheTTL        time.Duration
	SelectionCacheMaxEntries int

	// Who may call the HTTP listeners, over what (security.go).
	Security Security

	// Approximate mode.
	NoKVEvents        bool
	ApproxTTL         time.Duration
	ApproxMaxBlocks   int
	ApproxPruneTarget float64
	// ApproxCachePolicy is approximate mode's retention: ttl (the TTL and cap above) or lru
	// (Dynamo's --router-approximate-cache-policy lru: each rank held to its registered KV
	// capacity, blocks leased by their requests, no TTL; ranks without a capacity keep ttl).
	ApproxCachePolicy string

	// Build is what the binary was built from, exported as kvrouterd_build_info. Not a flag:
	// the command sets it (ReadBuild with its link-time version); zero reads the running
	// binary's.
	Build BuildInfo
}

// Defaults returns the configuration of a daemon started without flags.
func Defaults() Config {
	return Config{
		Shards:                   runtime.GOMAXPROCS(0),
		HTTPAddr:                 ":8090",
		DataDir:                  "./data",
		BlockSize:                16,
		RouterMode:               "kv",
		OverlapScoreWeight:       1.0,
		RouterTemperature:        0.0,
		TrackPrefillTokens:       true,
		RouterCost:               "auto",
		CacheWeight:              scoring.DefaultCacheWeight,
		PrefillLoadModel:         "none",
		OverlapScoreCredit:       1.0,
		PrefillLoadScale:         1.0,
		RouterTrackingHash:       trackingPublic,
		HostCacheHitWeight:       0.75,
		DiskCacheHitWeight:       0.25,
		RouterQueuePolicy:        "fcfs",
		ConditionalDisaggPolicy:  "isl_bounding",
		RouterQueueMaxRequests:   1024,
		RouterQueueMaxWait:       30 * time.Second,
		SessionAffinityMode:      "hard",
		RequestExpiry:            300 * time.Second,
		OverloadStatus:           529,
		QueueLen:                 256,
		MaxBodyBytes:             8 << 20,
		HTTPReadBuffer:           16 << 10,
		HTTPWriteBuffer:          64 << 10,
		HTTPMaxConns:             server.DefaultMaxConns(server.FileLimit()),
		HTTPIdleTimeout:          120 * time.Second,
		ShutdownTimeout:          30 * time.Second,
		LogLevel:                 "info",
		LogFormat:                "text",
		TransparentHugePages:     "off",
		NATSListen:               "127.0.0.1:4222",
		NATSStream:               ingest.DefaultStream,
		NATSPrefix:               ingest.DefaultPrefix,
		NATSMaxAge:               24 * time.Hour,
		NATSMaxBytes:             4 << 30,
		NATSReplicas:             1,
		WorkerTimeout:            30 * time.Second,
		ClearOnGap:               false,
		ShareLoad:                true,
		SnapshotInterval:         time.Minute,
		SnapshotKeep:             3,
		MinFreeDisk:              64 << 20,
		FrontendRetries:          2,
		WorkerEject:              true,
		WorkerEjectFailures:      3,
		WorkerEjectBaseTime:      10 * time.Second,
		WorkerEjectMaxTime:       300 * time.Second,
		WorkerEjectMaxPercent:    50,
		SelectionCacheTTL:        120 * time.Second,
		SelectionCacheMaxEntries: 4096,
		ApproxTTL:                120 * time.Second,
		ApproxMaxBlocks:          1 << 20,
		ApproxPruneTarget:        0.8,
		ApproxCachePolicy:        "ttl",
		ZMQLimits:                DefaultZMQLimits(),
		ZMQStaleAfter:            ingest.DefaultStaleAfter,
		Security:                 DefaultSecurity(),
	}
}

// Flags defines a flag on fs for every field of c, with c's values as the defaults.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Shards, "shards", c.Shards, "event-application shards (goroutines); default: GOMAXPROCS, the CPUs the process may use (a container's CPU limit)")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "address of the HTTP API")
	fs.StringVar(&c.FrontendAddr, "frontend-addr", c.FrontendAddr, "address of the OpenAI-compatible front door (/v1/chat/completions, /v1/completions, /v1/models; Dynamo's frontend serves it on :8000): each request tokenized by a worker, routed and forwarded to the chosen worker's http_endpoint; empty: off")
	fs.IntVar(&c.FrontendRetries, "frontend-retries", c.FrontendRetries, "front door: other workers a request is sent to after one refuses the connection or answers 5xx before its first byte (Dynamo's migration limit); 0: none")
	fs.DurationVar(&c.FrontendTimeout, "frontend-timeout", c.FrontendTimeout, "front door: the longest a request may take, first byte to last (its booking is freed then); 0: no limit")
	fs.BoolVar(&c.WorkerEject, "worker-eject", c.WorkerEject, "front door: take a worker rank that keeps failing out of routing for a while, and probe its /health to bring it back (Envoy's outlier detection); false: failures are only counted")
	fs.IntVar(&c.WorkerEjectFailures, "worker-eject-failures", c.WorkerEjectFailures, "front door: 5xx answers, resets, timeouts or failed /tokenize calls in a row that eject a worker rank (one refused connection does)")
	fs.DurationVar(&c.WorkerEjectBaseTime, "worker-eject-base-time", c.WorkerEjectBaseTime, "front door: how long a first ejection lasts; each later one lasts this times the ejections so far")
	fs.DurationVar(&c.WorkerEjectMaxTime, "worker-eject-max-time", c.WorkerEjectMaxTime, "front door: the longest an ejection lasts")
	fs.IntVar(&c.WorkerEjectMaxPercent, "worker-eject-max-percent", c.WorkerEjectMaxPercent, "front door: the most of a model's worker ranks out of routing at once, in percent (the first ejection is always allowed)")
	fs.StringVar(&c.SelectionAddr, "selection-addr", c.SelectionAddr, "address of NVIDIA Dynamo's selection-service API (python -m dynamo.select_service; its default port is 8092: :8092), over the same router and bookings as the HTTP API; empty: off")
	fs.StringVar(&c.SlotTrackerAddr, "slot-tracker-addr", c.SlotTrackerAddr, "address of NVIDIA Dynamo's standalone slot-tracker API (python -m dynamo.slot_tracker; its default port is 8091: :8091), its requests booked as the router's own; empty: off")
	fs.DurationVar(&c.SelectionCacheTTL, "selection-cache-ttl", c.SelectionCacheTTL, "selection service: how long a /select with a selection_id is kept for its POST /reservations")
	fs.IntVar(&c.SelectionCacheMaxEntries, "selection-cache-max-entries", c.SelectionCacheMaxEntries, "selection service: selections kept for a POST /reservations at most; past it the oldest go")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the embedded NATS server and snapshots")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "tokens per KV block of models registered without one")
	fs.StringVar(&c.RouterMode, "router-mode", c.RouterMode, "routing mode: "+scoring.ModeNames+" (Dynamo's spellings with dashes too)")
	fs.Float64Var(&c.OverlapScoreWeight, "overlap-score-weight", c.OverlapScoreWeight, "weight of prefill cost against decode load in the kv cost")
	fs.Float64Var(&c.RouterTemperature, "router-temperature", c.RouterTemperature, "softmax temperature of worker selection; 0 picks the cheapest")
	fs.Var(&c.RouterQueueThreshold, "router-queue-threshold", "turns the router queue on: a worker rank is busy when its booked prompt tokens not yet prefilled exceed this × its max_num_batched_tokens, and a request waits while every rank it may go to is busy; unset: off")
	fs.StringVar(&c.RouterPolicyConfig, "router-policy-config", c.RouterPolicyConfig, "Dynamo's policy classes: a YAML or JSON file of per-class router queues (busy thresholds, limits, slo_ms, DRR quantum) chosen by the x-dynamo-meta-policy-class header (docs/configuration.md)")
	fs.StringVar(&c.RouterQueuePolicy, "router-queue-policy", c.RouterQueuePolicy, "router queue order: fcfs (best tail TTFT), wspt (shortest uncached prompt first, best mean TTFT) or lcfs; strict priority first, priority jumps in seconds")
	fs.IntVar(&c.RouterQueueMaxRequests, "router-queue-max-requests", c.RouterQueueMaxRequests, "router queue: requests a model's queue holds at most; a request that finds it full is refused with 429")
	fs.DurationVar(&c.SessionAffinityTTL, "router-session-affinity-ttl", c.SessionAffinityTTL, "session affinity: a request's session id (session_id, nvext.session_control, the X-Dynamo-Session-ID header) keeps it on the worker its session was first routed to, for this long after the session's last request; shared with the other replicas; 0: off")
	fs.DurationVar(&c.PredictedTTL, "router-predicted-ttl", c.PredictedTTL, "predict-on-route: each routed request's blocks count as cached on its worker for this long (5s suggested), until the worker's KV events tell of them, so that sibling requests follow it; a side index, never snapshotted; needs KV events; 0: off")
	fs.BoolVar(&c.EnforceDisagg, "enforce-disagg", c.EnforceDisagg, "refuse (503) a request asking for a disaggregated decision whose model has no prefill worker, instead of serving it whole on a decode worker")
	fs.BoolVar(&c.ConditionalDisagg, "router-conditional-disagg", c.ConditionalDisagg, "conditional disaggregation: a disaggregated request may skip its prefill stage and be served whole by the decode worker the full cost picks, as --router-conditional-disagg-policy decides per request")
	fs.StringVar(&c.ConditionalDisaggConfig, "router-conditional-disagg-config", c.ConditionalDisaggConfig, `conditional disaggregation's settings as Dynamo's JSON object: {"policy", "eff_isl_threshold", "eff_isl_ratio_threshold", "prefill_busy_threshold", "decode_busy_threshold"}, over the single flags; needs --router-conditional-disagg`)
	fs.StringVar(&c.ConditionalDisaggPolicy, "router-conditional-disagg-policy", c.ConditionalDisaggPolicy, "conditional disaggregation policy: isl_bounding (skip the prefill stage when the prompt's tokens not cached on the decode worker are below 2048 and below 0.7 of the prompt), prefill_load (when the prefill worker it would go to has more than the prefill busy threshold × its max batched tokens active) or isl_or_load")
	fs.Var(&c.ConditionalDisaggPrefillThreshold, "router-conditional-disagg-prefill-busy-threshold", "conditional disaggregation: prefill_load's line, a fraction of the prefill worker's max batched tokens; unset: --router-queue-threshold's")
	fs.Var(&c.ConditionalDisaggDecodeThreshold, "router-conditional-disagg-decode-busy-threshold", "conditional disaggregation: keep a request whole only if the decode worker then holds at most this fraction of its KV capacity (never while its capacity is unknown); unset: no such gate")
	fs.StringVar(&c.SessionAffinityMode, "router-session-affinity-mode", c.SessionAffinityMode, "session affinity: hard (a session leaves its worker only when the worker is gone) or soft (also when it is overloaded)")
	fs.DurationVar(&c.RouterQueueMaxWait, "router-queue-max-wait", c.RouterQueueMaxWait, "router queue: the longest a request waits when it does not say (max_wait_ms); past it, 503")
	fs.DurationVar(&c.TTFTSLO, "ttft-slo", c.TTFTSLO, "router queue: also hold a request while no worker rank it may go to is predicted to give its first token within this time (one that would miss it even on an idle worker is not held); 0: off")
	fs.BoolVar(&c.TrackPrefillTokens, "track-prefill-tokens", c.TrackPrefillTokens, "charge and book each request's uncached prompt tokens as prefill; false routes on decode load alone, as Dynamo's decode stage")
	fs.StringVar(&c.RouterCost, "router-cost", c.RouterCost, "cost formula of the kv mode: ttft (the predicted time to first token on each worker, plus --router-cache-weight × the prefill time of the tokens it computes: kvrouterd's own), v1 (--overlap-score-weight × prefill blocks + decode blocks, Dynamo's releases), main (Dynamo's main branch: cached blocks a credit against the prompt, the rest scaled, active requests weighed; the --router-kv-overlap-score-credit, --router-kv-overlap-score-credit-decay, --router-prefill-load-scale and --router-decode-active-request-weight terms), or auto: ttft, unless --overlap-score-weight (v1) or one of main's terms (main) is given other than its default, or a preset is")
	fs.Float64Var(&c.CacheWeight, "router-cache-weight", c.CacheWeight, "--router-cost ttft: what each prompt token a worker computes costs beyond its own prefill time, in multiples of it (a second copy of a prefix, blocks others would hit pushed out)")
	fs.BoolVar(&c.LoadAware, "load-aware", c.LoadAware, "Dynamo's load-aware preset: --router-cost main with no overlap credit, bookings without assumed reuse, prefill tokens tracked (routing on load alone)")
	fs.BoolVar(&c.Agentic, "agentic", c.Agentic, "Dynamo's agentic preset: --router-cost main with overlap credit 2, prefill load scale 4 and 64 blocks per active request, over those flags")
	fs.StringVar(&c.PrefillLoadModel, "router-prefill-load-model", c.PrefillLoadModel, "none, or aic (Dynamo's): a worker's booked prefill tokens decay as its oldest prefill runs, at the rate of the step model's full steps (Dynamo asks AIC for each request's prefill time instead); --router-cost ttft always decays")
	fs.Float64Var(&c.OverlapScoreCredit, "router-kv-overlap-score-credit", c.OverlapScoreCredit, "--router-cost main: share of each cached block taken off the prompt's prefill blocks, 0 to 1")
	fs.Float64Var(&c.OverlapScoreCreditDecay, "router-kv-overlap-score-credit-decay", c.OverlapScoreCreditDecay, "--router-cost main: shrink a worker's credit by 1 / (1 + decay × its prefill backlog above the least loaded worker's, in request sizes); 0: no decay")
	fs.Float64Var(&c.HostCacheHitWeight, "router-host-cache-hit-weight", c.HostCacheHitWeight, "share of a cached block credited for each block the host tier (CPU memory) adds to a worker's device prefix, in both cost formulas; 0 indexes the tier without crediting it")
	fs.Float64Var(&c.DiskCacheHitWeight, "router-disk-cache-hit-weight", c.DiskCacheHitWeight, "share of a cached block credited for each block the disk and external tiers add to a worker's device and host prefix, in both cost formulas")
	fs.Float64Var(&c.PrefillLoadScale, "router-prefill-load-scale", c.PrefillLoadScale, "--router-cost main: weight of the prefill blocks left after the credit (Dynamo main reads --overlap-score-weight as this when it is given other than 1)")
	fs.Float64Var(&c.DecodeActiveRequestWeight, "router-decode-active-request-weight", c.DecodeActiveRequestWeight, "--router-cost main: cost in blocks of each request active on a worker")
	fs.BoolVar(&c.NoAssumeKVReuse, "no-router-assume-kv-reuse", c.NoAssumeKVReuse, "book each request's blocks under random hashes, so that concurrent requests share no active block (engines without prefix caching); a request's assume_kv_reuse overrides it")
	fs.BoolVar(&c.TrackOutputBlocks, "router-track-output-blocks", c.TrackOutputBlocks, "grow a request's booking by a block each time its prompt and generated tokens cross a block boundary, as the front door or POST /v1/requests/{id}/output reports them, decayed toward its expected output length when it gives one")
	fs.StringVar(&c.RouterTrackingHash, "router-tracking-hash", c.RouterTrackingHash, "identities of the active blocks a request books, which the load counts and replicas share: public-xxh3-v1 (the blocks' public sequence hashes) or keyed-xxh3-v1 (derived from --router-tracking-key-file, so that who can compute public hashes cannot probe which prompts are active; replicas and Dynamo routers share bookings only under the same key and key id); the index is matched by public hashes either way")
	fs.StringVar(&c.RouterTrackingKeyFile, "router-tracking-key-file", c.RouterTrackingKeyFile, "keyed-xxh3-v1: a file of exactly 32 raw bytes, the provider's secret key; a missing or bad one refuses the start")
	fs.StringVar(&c.RouterTrackingKeyID, "router-tracking-key-id", c.RouterTrackingKeyID, "keyed-xxh3-v1: the key's id (epoch), non-empty without surrounding blanks; change it with the key, on every replica at once")
	fs.DurationVar(&c.RequestExpiry, "request-expiry", c.RequestExpiry, "free routed requests not completed after this long")
	fs.IntVar(&c.MaxCandidates, "max-candidates", c.MaxCandidates, "candidates in a route or match answer when the request does not say: the chosen worker, then the lowest costs; 0 = every worker")
	c.busyFlags(fs)
	fs.Int64Var(&c.MaxBlocks, "max-blocks", c.MaxBlocks, "bound on (block, worker) residencies over all models and storage tiers; 0 = none")
	fs.Int64Var(&c.MaxIndexBytes, "max-index-bytes", c.MaxIndexBytes, "bound on the index's memory for blocks, in bytes (64 per residency, its most; each worker rank's fixed cost, about 2 KiB, comes on top): at the bound the least recently matched blocks of the worker holding the most are evicted; 0 = none")
	fs.IntVar(&c.QueueLen, "queue-len", c.QueueLen, "event batches each shard queue holds before producers wait")
	fs.IntVar(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "largest HTTP request body accepted")
	fs.IntVar(&c.HTTPReadBuffer, "http-read-buffer", c.HTTPReadBuffer, "bytes of read buffer per open HTTP connection; bounds request headers, and a request that fits is read in one system call")
	fs.IntVar(&c.HTTPWriteBuffer, "http-write-buffer", c.HTTPWriteBuffer, "bytes of write buffer per open HTTP connection; an answer that fits goes out in one system call")
	fs.IntVar(&c.HTTPMaxConns, "http-max-conns", c.HTTPMaxConns, "open HTTP connections at most; at the limit a new one closes the connection idle longest, or is refused with 503 if none is idle. "+
		"Default: the open-file limit less a reserve of 256 + 1/8 of it for the daemon's other files, between 64 and 16384")
	fs.IntVar(&c.HTTPMaxConnsPerIP, "http-max-conns-per-ip", c.HTTPMaxConnsPerIP, "open HTTP connections from one client address at most; beyond, a new one is refused with 503. 0 = a quarter of --http-max-conns")
	fs.DurationVar(&c.HTTPIdleTimeout, "http-idle-timeout", c.HTTPIdleTimeout, "close a keep-alive HTTP connection after this long without a request (a new connection's first request must come within 30s)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long a graceful shutdown waits for requests in flight")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error (debug logs every routing decision)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.StringVar(&c.TransparentHugePages, "transparent-huge-pages", c.TransparentHugePages, "off: keep Linux's transparent huge pages out of the daemon's memory, whatever the host's mode (on a VM whose host mode was always, a restart at 10^7 residencies took about 2.4 times as long with them); system: leave the process as the host and its parent set it")
	fs.StringVar(&c.LogFile, "log-file", c.LogFile, "log to this file (appended, created if missing) instead of stderr; POST /reopen_logs reopens it after a rotation")
	fs.StringVar(&c.Peers, "peers", c.Peers, "comma-separated URLs of Dynamo indexers or kvrouterd replicas (with --keep-block-tree) whose /dump seeds the index at start, the first that answers; between kvrouterd replicas --bootstrap-from is faster")
	fs.BoolVar(&c.TestEndpoints, "kv-indexer-test-endpoints", c.TestEndpoints, "mount Dynamo's listener-control test endpoints, POST /test/pause_listener and /test/resume_listener {instance_id, dp_rank}, which stop and restart a rank's ZMQ subscription; for tests only, never in production")
	fs.BoolVar(&c.KeepBlockTree, "keep-block-tree", c.KeepBlockTree, "keep each block's local hash and parent (two map entries per block), so that /dump answers in Dynamo's form and Dynamo indexers can recover from it")
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "NATS server or cluster to take events from (comma-separated URLs); empty runs an embedded server with JetStream in --data-dir")
	fs.StringVar(&c.NATSListen, "nats-listen", c.NATSListen, "client address of the embedded NATS server, for publishers (port 0: any free port)")
	fs.BoolVar(&c.NATSNoAuth, "nats-no-auth", c.NATSNoAuth, "UNSAFE: the embedded NATS server takes anonymous clients with every right (inject events, purge or delete the stream); by default it takes only the users in --data-dir/nats/*.auth")
	c.NATS.Flags(fs)
	fs.StringVar(&c.NATSStream, "nats-stream", c.NATSStream, "JetStream stream holding the events (created if missing)")
	fs.StringVar(&c.NATSPrefix, "nats-subject-prefix", c.NATSPrefix, "first token of the event and load-report subjects")
	fs.DurationVar(&c.NATSMaxAge, "nats-max-age", c.NATSMaxAge, "stream retention: events older than this are dropped (0: no limit)")
	fs.Int64Var(&c.NATSMaxBytes, "nats-max-bytes", c.NATSMaxBytes, "stream retention: the oldest events are dropped past this size (0: no limit)")
	fs.IntVar(&c.NATSReplicas, "nats-replicas", c.NATSReplicas, "stream replicas in a NATS cluster")
	fs.Uint64Var(&c.NATSStartSeq, "nats-start-seq", c.NATSStartSeq, "first stream sequence to apply; 0 = the oldest retained")
	fs.Var(&SourceList{P: &c.ZMQ}, "zmq", "subscribe to an engine's ZMQ KV events: worker=ID,model=NAME,endpoint=tcp://host:port[,replay=tcp://host:port][,ranks=N][,rank=R][,topic=T]; repeat the flag, or separate sources with ';'")
	c.ZMQLimits.Flags(fs)
	c.Security.Flags(fs)
	fs.DurationVar(&c.ZMQStaleAfter, "zmq-stale-after", c.ZMQStaleAfter, "report an engine's connected ZMQ rank stale, not active, in /workers and /metrics once it has sent no batch for this long (an idle engine publishes nothing: a hint to look, not a failure)")
	fs.BoolVar(&c.ShareLoad, "share-load", c.ShareLoad, "tell the other replicas on the same NATS of every request this one routes, and count theirs in the load (off in approximate mode)")
	fs.StringVar(&c.ReplicaID, "replica-id", c.ReplicaID, "this replica's name in load sharing, unique among live replicas (1-64 of A-Z a-z 0-9 _ -), and the router_id label of Dynamo's overhead metrics; empty: random")
	fs.BoolVar(&c.NoSnapshots, "no-snapshots", c.NoSnapshots, "keep no snapshots in --data-dir/snapshots: a restart rebuilds the index from the whole event stream")
	fs.DurationVar(&c.SnapshotInterval, "snapshot-interval", c.SnapshotInterval, "write a snapshot of the index this often, and on shutdown; a restart restores the newest and replays the stream after it (0: on shutdown only)")
	fs.IntVar(&c.SnapshotKeep, "snapshot-keep", c.SnapshotKeep, "snapshots kept; older ones are deleted")
	fs.Int64Var(&c.MinFreeDisk, "min-free-disk", c.MinFreeDisk, "bytes free on --data-dir's filesystem below which the daemon starts read-only: it restores its newest snapshot, writes none, and /readyz says so; with the embedded NATS server it exits instead, as its stream could store no event")
	fs.StringVar(&c.BootstrapFrom, "bootstrap-from", c.BootstrapFrom, "URL of a running kvrouterd (http://peer:8090): at start, fetch its newest snapshot and start from it")
	fs.BoolVar(&c.NoKVEvents, "no-kv-events", c.NoKVEvents, "approximate mode, for workers that publish no KV events: a routed request's blocks count as cached on the chosen worker for --approx-ttl; no NATS")
	fs.DurationVar(&c.ApproxTTL, "approx-ttl", c.ApproxTTL, "approximate mode: how long a block stays cached after the last request that used it")
	fs.IntVar(&c.ApproxMaxBlocks, "approx-max-blocks", c.ApproxMaxBlocks, "approximate mode: cap on (block, worker) residencies")
	fs.Float64Var(&c.ApproxPruneTarget, "approx-prune-target", c.ApproxPruneTarget, "approximate mode: past the cap, prune the least recently used (deepest first) down to this fraction of it")
	fs.StringVar(&c.ApproxCachePolicy, "approx-cache-policy", c.ApproxCachePolicy, "approximate mode's retention: ttl (--approx-ttl, --approx-max-blocks) or lru (each rank holds at most the KV capacity it registered, least recently used blocks no request holds evicted first, no TTL; ranks that registered no capacity keep ttl)")
	fs.BoolVar(&c.ClearOnGap, "clear-on-gap", c.ClearOnGap, "when events are lost for good (a worker's event ids skip, or ZMQ batches its replay socket cannot return), drop that rank's blocks before applying the next event: an index that under-reports, never one that lists blocks a lost event removed; off (the default) keeps the blocks and goes on, as Dynamo does")
	fs.DurationVar(&c.WorkerTimeout, "worker-timeout", c.WorkerTimeout, "a worker that sends load reports is removed from routing, its blocks dropped, after this long silent (0: never)")
}

// Check says what is wrong with c, naming the flag to change; nil when it is whole.
func (c *Config) Check() error {
	switch {
	case c.Shards < 1 || c.Shards > 4096:
		return fmt.Errorf("--shards %d: want 1 to 4096", c.Shards)
	case c.BlockSize < 1 || c.BlockSize > 1<<16:
		return fmt.Errorf("--block-size %d: want 1 to 65536", c.BlockSize)
	case !(c.OverlapScoreWeight >= 0) || c.OverlapScoreWeight > 1e9:
		return fmt.Errorf("--overlap-score-weight %v: want a finite number ≥ 0", c.OverlapScoreWeight)
	case !(c.RouterTemperature >= 0) || c.RouterTemperature > 1e9:
		return fmt.Errorf("--router-temperature %v: want a finite number ≥ 0", c.RouterTemperature)
	case c.RouterQueueThreshold.On && (!(c.RouterQueueThreshold.V >= 0) || c.RouterQueueThreshold.V > 1e9):
		return fmt.Errorf("--router-queue-threshold %v: want a finite number ≥ 0", c.RouterQueueThreshold.V)
	case c.RouterPolicyConfig != "" && policyConfigErr(c.RouterPolicyConfig) != nil:
		return fmt.Errorf("--router-policy-config: %w", policyConfigErr(c.RouterPolicyConfig))
	case !validQueuePolicy(c.RouterQueuePolicy):
		return fmt.Errorf("--router-queue-policy %q: want fcfs, wspt or lcfs", c.RouterQueuePolicy)
	case c.RouterQueueMaxRequests < 1 || c.RouterQueueMaxRequests > 1<<20:
		return fmt.Errorf("--router-queue-max-requests %d: want 1 to 1048576", c.RouterQueueMaxRequests)
	case c.SessionAffinityTTL < 0 || c.SessionAffinityTTL > 365*24*time.Hour:
		return fmt.Errorf("--router-session-affinity-ttl %v: want 0 (off) to a year", c.SessionAffinityTTL)
	case c.PredictedTTL < 0 || c.PredictedTTL > time.Hour:
		return fmt.Errorf("--router-predicted-ttl %v: want 0 (off) to an hour", c.PredictedTTL)
	case c.PredictedTTL > 0 && c.NoKVEvents:
		return fmt.Errorf("--router-predicted-ttl %v: predict-on-route needs KV events, and --no-kv-events (approximate mode) reads none", c.PredictedTTL)
	case c.SessionAffinityMode != "hard" && c.SessionAffinityMode != "soft":
		return fmt.Errorf("--router-session-affinity-mode %q: want hard or soft", c.SessionAffinityMode)
	case c.RouterQueueMaxWait <= 0:
		return fmt.Errorf("--router-queue-max-wait %v: want a positive duration", c.RouterQueueMaxWait)
	case c.MaxCandidates < 0 || c.MaxCandidates > 1<<16-1:
		return fmt.Errorf("--max-candidates %d: want 0 (every worker) to 65535", c.MaxCandidates)
	case c.RequestExpiry <= 0:
		return fmt.Errorf("--request-expiry %v: want a positive duration", c.RequestExpiry)
	case c.MaxBlocks < 0 || c.QueueLen < 1 || c.MaxBodyBytes < 1024:
		return fmt.Errorf("--max-blocks, --queue-len, --max-body-bytes: out of range")
	case c.MaxIndexBytes != 0 && c.MaxIndexBytes < 1<<20:
		return fmt.Errorf("--max-index-bytes %d: want 0 (none) or at least 1 MiB", c.MaxIndexBytes)
	case c.HTTPReadBuffer < 4096 || c.HTTPWriteBuffer < 4096 || c.HTTPReadBuffer > 64<<20 || c.HTTPWriteBuffer > 64<<20:
		return fmt.Errorf("--http-read-buffer %d, --http-write-buffer %d: want 4096 to 64 MiB", c.HTTPReadBuffer, c.HTTPWriteBuffer)
	case c.HTTPMaxConns < 1 || c.HTTPMaxConns > 1<<24 || c.HTTPMaxConnsPerIP < 0:
		return fmt.Errorf("--http-max-conns %d, --http-max-conns-per-ip %d: want 1 to 16777216 connections, and 0 (a quarter) or more per address", c.HTTPMaxConns, c.HTTPMaxConnsPerIP)
	case c.HTTPIdleTimeout <= 0:
		return fmt.Errorf("--http-idle-timeout %v: want a positive duration", c.HTTPIdleTimeout)
	case c.TransparentHugePages != "off" && c.TransparentHugePages != "system":
		return fmt.Errorf("--transparent-huge-pages %q: want off or system", c.TransparentHugePages)
	case c.LogFormat != "text" && c.LogFormat != "json":
		return fmt.Errorf("--log-format %q: want text or json", c.LogFormat)
	case c.NATSMaxAge < 0 || c.NATSMaxBytes < 0 || c.NATSReplicas < 1 || c.NATSReplicas > 5:
		return fmt.Errorf("--nats-max-age, --nats-max-bytes, --nats-replicas: out of range")
	case c.NATSStream == "" || strings.ContainsAny(c.NATSStream, " .*>"):
		return fmt.Errorf("--nats-stream %q: want a name without spaces, dots, * or >", c.NATSStream)
	case c.ApproxCachePolicy != "ttl" && c.ApproxCachePolicy != "lru":
		return fmt.Errorf("--approx-cache-policy %q: want ttl or lru", c.ApproxCachePolicy)
	case c.ApproxCachePolicy == "lru" && !c.NoKVEvents:
		return fmt.Errorf("--approx-cache-policy lru: approximate mode's policy, it needs --no-kv-events (Dynamo refuses it with KV events too)")
	case c.ApproxTTL <= 0 || c.ApproxMaxBlocks < 1 || !(c.ApproxPruneTarget > 0 && c.ApproxPruneTarget <= 1):
		return fmt.Errorf("--approx-ttl, --approx-max-blocks, --approx-prune-target: want a positive duration, a positive count, a fraction in (0, 1]")
	case c.FrontendRetries < 0 || c.FrontendRetries > 16:
		return fmt.Errorf("--frontend-retries %d: want 0 to 16", c.FrontendRetries)
	case c.FrontendTimeout < 0:
		return fmt.Errorf("--frontend-timeout %v: must not be negative", c.FrontendTimeout)
	case c.WorkerEjectFailures < 1 || c.WorkerEjectFailures > 1000:
		return fmt.Errorf("--worker-eject-failures %d: want 1 to 1000", c.WorkerEjectFailures)
	case c.WorkerEjectBaseTime <= 0 || c.WorkerEjectMaxTime < c.WorkerEjectBaseTime:
		return fmt.Errorf("--worker-eject-base-time %v, --worker-eject-max-time %v: want a positive base, the max at least the base", c.WorkerEjectBaseTime, c.WorkerEjectMaxTime)
	case c.WorkerEjectMaxPercent < 1 || c.WorkerEjectMaxPercent > 100:
		return fmt.Errorf("--worker-eject-max-percent %d: want 1 to 100", c.WorkerEjectMaxPercent)
	case c.SelectionCacheTTL <= 0 || c.SelectionCacheMaxEntries < 1 || c.SelectionCacheMaxEntries > 1<<24:
		return fmt.Errorf("--selection-cache-ttl %v, --selection-cache-max-entries %d: want a positive duration and 1 to 16777216 entries", c.SelectionCacheTTL, c.SelectionCacheMaxEntries)
	case c.ZMQStaleAfter <= 0:
		return fmt.Errorf("--zmq-stale-after %v: want a positive duration", c.ZMQStaleAfter)
	case c.WorkerTimeout < 0:
		return fmt.Errorf("--worker-timeout %v: want 0 (never) or a positive duration", c.WorkerTimeout)
	case c.SnapshotInterval < 0 || c.SnapshotKeep < 1 || c.SnapshotKeep > 1000:
		return fmt.Errorf("--snapshot-interval %v, --snapshot-keep %d: want a duration ≥ 0 and 1 to 1000 snapshots", c.SnapshotInterval, c.SnapshotKeep)
	case c.BootstrapFrom != "" && !strings.HasPrefix(c.BootstrapFrom, "http://") && !strings.HasPrefix(c.BootstrapFrom, "https://"):
		return fmt.Errorf("--bootstrap-from %q: want http://host:port", c.BootstrapFrom)
	case c.MinFreeDisk < 0:
		return fmt.Errorf("--min-free-disk %d: want 0 (never read-only) or more bytes", c.MinFreeDisk)
	case c.BootstrapFrom != "" && c.NoSnapshots:
		return fmt.Errorf("--bootstrap-from needs snapshots; drop --no-snapshots")
	}
	if c.RouterCost != "auto" {
		if _, err := scoring.ParseCost(c.RouterCost); err != nil {
			return fmt.Errorf("--router-cost %q: want auto, ttft, v1 or main", c.RouterCost)
		}
	}
	switch {
	case c.LoadAware && c.Agentic:
		return fmt.Errorf("--load-aware and --agentic: give one preset at most")
	case (c.LoadAware || c.Agentic) && c.RouterCost != "auto" && c.RouterCost != "main":
		return fmt.Errorf("--router-cost %s: a preset (--load-aware, --agentic) sets Dynamo main's cost; drop --router-cost or give main", c.RouterCost)
	case c.TTFTSLO < 0 || c.TTFTSLO > 24*time.Hour:
		return fmt.Errorf("--ttft-slo %v: want 0 (off) to a day", c.TTFTSLO)
	case c.TTFTSLO > 0 && !c.RouterQueueThreshold.On:
		return fmt.Errorf("--ttft-slo holds requests in the router queue: give --router-queue-threshold too")
	case !(c.CacheWeight >= 0) || c.CacheWeight > 1e9:
		return fmt.Errorf("--router-cache-weight %v: want a finite number ≥ 0", c.CacheWeight)
	case c.PrefillLoadModel != "none" && c.PrefillLoadModel != "aic":
		return fmt.Errorf("--router-prefill-load-model %q: want none or aic", c.PrefillLoadModel)
	}
	if t := c.terms(); t.Check() != nil {
		err := t.Check()
		return fmt.Errorf("--router-kv-overlap-score-credit, --router-kv-overlap-score-credit-decay, --router-prefill-load-scale, --router-decode-active-request-weight: %w", err)
	}
	if tc := c.tierCredit(); tc.Check() != nil {
		return fmt.Errorf("--router-host-cache-hit-weight %v, --router-disk-cache-hit-weight %v: %w", c.HostCacheHitWeight, c.DiskCacheHitWeight, tc.Check())
	}
	if m, err := scoring.ParseMode(c.RouterMode); err != nil || m == scoring.Default {
		return fmt.Errorf("--router-mode %q: want %s", c.RouterMode, scoring.ModeNames)
	}
	if _, err := c.disagg(); err != nil {
		return err
	}
	if _, err := c.trackingKey(); err != nil {
		return err
	}
	if err := c.checkBusy(); err != nil {
		return err
	}
	if err := CheckPrefix(c.NATSPrefix); err != nil {
		return err
	}
	if err := c.NATS.Check(); err != nil {
		return err
	}
	if err := c.Security.Check(); err != nil {
		return err
	}
	if err := c.ZMQLimits.Check(); err != nil {
		return err
	}
	if c.NATSNoAuth && c.NATSURL != "" {
		return fmt.Errorf("--nats-no-auth is for the embedded server; drop it or --nats-url")
	}
	return CheckLog(c.LogLevel, c.LogFormat)
}

// CheckPrefix checks --nats-subject-prefix.
func CheckPrefix(p string) error {
	if p == "" || strings.ContainsAny(p, " *>") {
		return fmt.Errorf("--nats-subject-prefix %q: want subject tokens without spaces, * or >", p)
	}
	return nil
}

// CheckLog checks --log-level and --log-format.
func CheckLog(level, format string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	if format != "text" && format != "json" {
		return fmt.Errorf("--log-format %q: want text or json", format)
	}
	return nil
}

// NewLogger returns a logger writing to w at level in format, as CheckLog accepts them.
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// SourceList is a flag.Value collecting engine sources; one value may hold several, separated
// by ';' (how the environment variable holds several).
type SourceList struct{ P *[]ingest.EngineSource }

func (l *SourceList) String() string {
	if l.P == nil {
		return ""
	}
	s := make([]string, len(*l.P))
	for i, src := range *l.P {
		s[i] = src.String()
	}
	return strings.Join(s, ";")
}

func (l *SourceList) Set(v string) error {
	for part := range strings.SplitSeq(v, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		src, err := ingest.ParseEngineSource(part)
		if err != nil {
			return err
		}
		*l.P = append(*l.P, src)
	}
	return nil
}

// terms are the weights of Dynamo main's cost. As Dynamo main reads its deprecated overlap score
// weight, a --overlap-score-weight other than its default 1 is the prefill load scale, and 0
// also takes the credit away.
func (c *Config) terms() scoring.Terms {
	t := scoring.Terms{Credit: c.OverlapScoreCredit, CreditDecay: c.OverlapScoreCreditDecay,
		LoadScale: c.PrefillLoadScale, RequestWeight: c.DecodeActiveRequestWeight}
	switch {
	case c.Agentic:
		// Dynamo main's agentic preset (docs/components/router/router-presets.md): over the
		// individual flags, and the deprecated weight cleared.
		t.Credit, t.LoadScale, t.RequestWeight = 2, 4, 64
		return t
	case c.LoadAware:
		// Dynamo's load-aware preset (kv_router_args.py, _LOAD_AWARE_KWARG_OVERRIDES): no
		// overlap credit; the other terms as given.
		t.Credit = 0
	}
	if c.OverlapScoreWeight != 1 {
		t.LoadScale = c.OverlapScoreWeight
		if c.OverlapScoreWeight == 0 {
			t.Credit = 0
		}
	}
	return t
}

// cost is the kv mode's cost formula: --router-cost's, or for auto, kvrouterd's own (ttft)
// unless a preset or one of Dynamo's weights other than its default asks for Dynamo's: the
// overlap score weight for v1, a term of main's for main. A team that tuned Dynamo's router
// keeps what it tuned.
func (c *Config) cost() scoring.CostModel {
	if c.RouterCost != "auto" {
		m, _ := scoring.ParseCost(c.RouterCost)
		return m
	}
	switch {
	case c.LoadAware || c.Agentic || c.OverlapScoreCredit != 1 || c.OverlapScoreCreditDecay != 0 ||
		c.PrefillLoadScale != 1 || c.DecodeActiveRequestWeight != 0:
		return scoring.CostMain
	case c.OverlapScoreWeight != 1:
		return scoring.CostV1
	}
	return scoring.CostTTFT
}

// CostModel returns the kv mode's cost formula and its terms as the router gets them (for
// the simulator, which routes as the daemon's defaults do).
func (c *Config) CostModel() (scoring.CostModel, scoring.Terms) { return c.cost(), c.terms() }

// tierCredit are the lower storage tiers' weights.
func (c *Config) tierCredit() scoring.TierCredit {
	return scoring.TierCredit{Host: c.HostCacheHitWeight, Disk: c.DiskCacheHitWeight}
}

// OptFloat is a number flag that may be left unset: the router queue's threshold is off unless
// given. A plain value.
type OptFloat struct {
	V  float64
	On bool
}

func (o *OptFloat) String() string {
	if o == nil || !o.On {
		return ""
	}
	return strconv.FormatFloat(o.V, 'g', -1, 64)
}

// Set parses a number; "" or "none" leaves the setting off.
func (o *OptFloat) Set(s string) error {
	if s == "" || strings.EqualFold(s, "none") {
		*o = OptFloat{}
		return nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("%q is not a number", s)
	}
	*o = OptFloat{V: v, On: true}
	return nil
}

// queue is the router's queue configuration, nil when the queue is off.
func (c *Config) queue() *router.QueueConfig {
	var classes *router.PolicyConfig
	if c.RouterPolicyConfig != "" {
		classes, _ = router.LoadPolicyConfig(c.RouterPolicyConfig) // Check refused a bad one
	}
	if !c.RouterQueueThreshold.On && classes == nil {
		return nil
	}
	th := c.RouterQueueThreshold.V
	if !c.RouterQueueThreshold.On {
		th = math.Inf(1) // only the policy classes queue, as Dynamo's synthetic class then
	}
	policy, _ := router.ParseQueuePolicy(c.RouterQueuePolicy) // Check refused any other
	return &router.QueueConfig{Threshold: th, Policy: policy, Classes: classes,
		MaxRequests: c.RouterQueueMaxRequests, MaxWait: c.RouterQueueMaxWait, TTFTSLO: c.TTFTSLO}
}

func policyConfigErr(path string) error {
	_, err := router.LoadPolicyConfig(path)
	return err
}

func validQueuePolicy(s string) bool {
	_, err := router.ParseQueuePolicy(s)
	return err == nil
}

// affinity is the router's session affinity configuration, nil when it is off.
func (c *Config) affinity() *router.AffinityConfig {
	if c.SessionAffinityTTL <= 0 {
		return nil
	}
	mode, _ := router.ParseAffinityMode(c.SessionAffinityMode) // Check refused any other
	return &router.AffinityConfig{TTL: c.SessionAffinityTTL, Mode: mode}
}
