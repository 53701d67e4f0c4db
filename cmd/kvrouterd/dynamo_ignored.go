package main

// Dynamo's settings that kvrouterd does not have: accepted, so that a Dynamo command line never
// stops a start, and each given one warned of once, at start, with the reason it changes nothing.

import (
	"flag"
	"strings"

	"github.com/kvrouterd/kvrouterd/daemon"
)

// dynKind is how Dynamo's argument parser takes a flag.
type dynKind int

const (
	dynValue  dynKind = iota // --flag VALUE
	dynBool                  // argparse's BooleanOptionalAction: --flag, --no-flag
	dynSwitch                // store_true, or a short form: --flag alone
)

// dynIgnored is one of Dynamo's flags kvrouterd accepts without effect, with its variable
// (empty: none) and the reason. Entries may share a name (a flag read from two variables).
type dynIgnored struct {
	name, env string
	kind      dynKind
	reason    string
}

// Reasons shared by several settings.
const (
	whyDiscovery = "kvrouterd uses no Dynamo runtime (discovery, request plane, namespaces): workers register over HTTP (/register, /v1/workers) or are found by their events"
	whyFrontend  = "kvrouterd's front door (--frontend-addr) forwards OpenAI requests as they are: it renders no chat template and parses no tool calls or reasoning"
	whyHTTP      = "kvrouterd's OpenAI front door listens on --frontend-addr (off unless given); --http-addr is its router API"
	whyTokenizer = "kvrouterd loads no model or tokenizer: workers tokenize (/tokenize)"
	whyGRPC      = "kvrouterd serves no KServe gRPC API"
	whyAIS       = "kvrouterd has no AISimulate/AIC performance model; --router-prefill-load-model aic decays prefill load by its own rule"
	whyValkey    = "kvrouterd keeps the index in each replica and shares state over its NATS stream, not in Valkey"
	whyPrefill   = "Dynamo's older conditional prefill; kvrouterd has conditional disaggregation (--router-conditional-disagg)"
	whyPolicy    = "kvrouterd has one worker selector, its cost function; named worker-selection instances are not built"
	whyContinue  = "kvrouterd does not keep a disaggregated request on its prefill worker: its route answer has no such outcome, and its requests carry neither max_tokens nor n/best_of, which Dynamo's prefill-continue gates need"
)

// dynamoIgnored are the flags and variables of Dynamo's frontend (frontend_args.py) and router
// (router_args.py, kv_router_args.py, ais_perf_args.py) that kvrouterd has no setting for.
var dynamoIgnored = func() []dynIgnored {
	d := []dynIgnored{
		// The frontend's own.
		{"interactive", "DYN_INTERACTIVE", dynBool, "kvrouterd has no interactive chat"},
		{"i", "", dynSwitch, "kvrouterd has no interactive chat"},
		{"namespace", "DYN_NAMESPACE", dynValue, whyDiscovery},
		{"namespace-prefix", "DYN_NAMESPACE_PREFIX", dynValue, whyDiscovery},
		{"discovery-backend", "DYN_DISCOVERY_BACKEND", dynValue, whyDiscovery},
		{"request-plane", "DYN_REQUEST_PLANE", dynValue, whyDiscovery},
		{"event-plane", "DYN_EVENT_PLANE", dynValue, "kvrouterd reads both event planes at once: ZMQ from the endpoints workers register (or --zmq), NATS from its stream (--nats-url)"},
		{"http-host", "DYN_HTTP_HOST", dynValue, whyHTTP},
		{"http-port", "DYN_HTTP_PORT", dynValue, whyHTTP},
		{"serve-indexer", "DYN_SERVE_INDEXER", dynBool, "kvrouterd always serves its index over HTTP (/query, /query_by_hash, /dump)"},
		{"migration-max-seq-len", "DYN_MIGRATION_MAX_SEQ_LEN", dynValue, "the front door retries a request only before its first byte (--frontend-retries), so it keeps no tokens to migrate"},
		{"model-name", "DYN_MODEL_NAME", dynValue, "models are named by the workers that register them"},
		{"model-path", "DYN_MODEL_PATH", dynValue, whyTokenizer},
		{"metrics-prefix", "DYN_METRICS_PREFIX", dynValue, "kvrouterd's metric names are fixed (kvrouterd_*, and Dynamo's own names where it serves Dynamo's series)"},
		{"kserve-grpc-server", "DYN_KSERVE_GRPC_SERVER", dynBool, whyGRPC},
		{"grpc-metrics-port", "DYN_GRPC_METRICS_PORT", dynValue, whyGRPC},
		{"dump-config-to", "DYN_DUMP_CONFIG_TO", dynValue, "kvrouterd's configuration is its flags and variables, which --help prints"},
		{"enable-anthropic-api", "DYN_ENABLE_ANTHROPIC_API", dynBool, "kvrouterd's front door serves OpenAI's API only"},
		{"strip-anthropic-preamble", "DYN_STRIP_ANTHROPIC_PREAMBLE", dynBool, "kvrouterd's front door serves OpenAI's API only"},
		{"enable-streaming-tool-dispatch", "DYN_ENABLE_STREAMING_TOOL_DISPATCH", dynBool, whyFrontend},
		{"enable-streaming-reasoning-dispatch", "DYN_ENABLE_STREAMING_REASONING_DISPATCH", dynBool, whyFrontend},
		{"exclude-tools-when-tool-choice-none", "DYN_EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE", dynBool, whyFrontend},
		{"dyn-chat-processor", "DYN_CHAT_PROCESSOR", dynValue, whyFrontend},
		{"dyn-debug-perf", "DYN_DEBUG_PERF", dynBool, whyFrontend},
		{"dyn-preprocess-workers", "DYN_PREPROCESS_WORKERS", dynValue, whyFrontend},
		{"tokenizer", "DYN_TOKENIZER", dynValue, whyTokenizer},
		{"trust-remote-code", "DYN_TRUST_REMOTE_CODE", dynBool, whyTokenizer},
		{"router-prune-target-ratio", "DYN_ROUTER_PRUNE_TARGET_RATIO", dynValue, "approximate mode evicts by its own rule at --approx-max-blocks"},
		{"router-max-pending-per-worker", "DYN_ROUTER_MAX_PENDING_PER_WORKER", dynValue, "kvrouterd bounds its queue in total, --router-queue-max-requests"},
		{"router-dp-stale-selection-secs", "DYN_ROUTER_DP_STALE_SELECTION_SECS", dynValue, "kvrouterd has no starvation preference; equal costs are broken at random"},
		// The router's (router_args.py).
		{"router-min-initial-workers", "DYN_ROUTER_MIN_INITIAL_WORKERS", dynValue, "kvrouterd serves at once and routes among the workers registered so far; nothing waits for a number of workers"},
		{"admission-control", "DYN_ADMISSION_CONTROL", dynValue, "each busy threshold applies whenever it is set, as on Dynamo main, which ignores this setting too"},
		// The KV router's (kv_router_args.py).
		{"router-track-active-blocks", "DYN_ROUTER_TRACK_ACTIVE_BLOCKS", dynBool, "kvrouterd always tracks active blocks: its cost needs them"},
		{"router-prefill-policy", "DYN_ROUTER_PREFILL_POLICY", dynValue, whyPolicy},
		{"router-decode-policy", "DYN_ROUTER_DECODE_POLICY", dynValue, whyPolicy},
		{"use-remote-indexer", "DYN_USE_REMOTE_INDEXER", dynBool, "kvrouterd keeps its own index; it queries none on the workers"},
		{"enable-session-prefix-index", "DYN_ENABLE_SESSION_PREFIX_INDEX", dynBool, "nothing consumes Dynamo's session prefix index yet; kvrouterd keeps none"},
		{"shared-cache-multiplier", "DYN_SHARED_CACHE_MULTIPLIER", dynValue, "kvrouterd queries no external shared cache (Mooncake); external-tier blocks in events count at --router-disk-cache-hit-weight"},
		{"shared-cache-type", "DYN_SHARED_CACHE_TYPE", dynValue, "kvrouterd queries no external shared cache (Mooncake); external-tier blocks in events count at --router-disk-cache-hit-weight"},
		{"router-snapshot-threshold", "DYN_ROUTER_SNAPSHOT_THRESHOLD", dynValue, "kvrouterd snapshots its index by time, --snapshot-interval"},
		{"router-reset-states", "DYN_ROUTER_RESET_STATES", dynBool, "kvrouterd never purges its stream at start; to start empty, give an empty --data-dir and a new --nats-stream"},
		{"router-durable-kv-events", "DYN_ROUTER_DURABLE_KV_EVENTS", dynBool, "kvrouterd's event stream is always durable (NATS JetStream), beside the engines' ZMQ sockets"},
		{"router-conditional-prefill", "DYN_ROUTER_CONDITIONAL_PREFILL", dynBool, whyPrefill},
		{"router-conditional-prefill-bypass-below-tokens", "DYN_ROUTER_CONDITIONAL_PREFILL_BYPASS_BELOW_TOKENS", dynValue, whyPrefill},
		{"router-conditional-prefill-policy", "DYN_ROUTER_CONDITIONAL_PREFILL_POLICY", dynValue, whyPrefill},
		{"router-conditional-prefill-max-new-tokens", "DYN_ROUTER_CONDITIONAL_PREFILL_MAX_NEW_TOKENS", dynValue, whyPrefill},
		{"router-prefill-continue", "", dynBool, whyContinue},
		{"router-prefill-continue-config", "", dynValue, whyContinue},
		{"router-valkey-config", "DYN_ROUTER_VALKEY_CONFIG", dynValue, whyValkey},
		{"router-valkey-urls", "DYN_ROUTER_VALKEY_URLS", dynValue, whyValkey},
		{"router-valkey-worker-events", "DYN_ROUTER_VALKEY_WORKER_EVENTS", dynBool, whyValkey},
		{"router-valkey-authoritative-admission", "DYN_ROUTER_VALKEY_AUTHORITATIVE_ADMISSION", dynBool, whyValkey},
		{"router-valkey-admission-lease-ms", "DYN_ROUTER_VALKEY_ADMISSION_LEASE_MS", dynValue, whyValkey},
		{"router-valkey-index-scope", "DYN_ROUTER_VALKEY_INDEX_SCOPE", dynValue, whyValkey},
		{"router-valkey-connection-pool-size", "DYN_ROUTER_VALKEY_CONNECTION_POOL_SIZE", dynValue, whyValkey},
		{"router-valkey-required-replica-acks", "DYN_ROUTER_VALKEY_REQUIRED_REPLICA_ACKS", dynValue, whyValkey},
		{"router-valkey-sentinel-urls", "DYN_ROUTER_VALKEY_SENTINEL_URLS", dynValue, whyValkey},
		{"router-valkey-sentinel-master-name", "DYN_ROUTER_VALKEY_SENTINEL_MASTER_NAME", dynValue, whyValkey},
		{"router-valkey-sentinel-quorum", "DYN_ROUTER_VALKEY_SENTINEL_QUORUM", dynValue, whyValkey},
		{"router-valkey-allow-insecure-plaintext", "DYN_ROUTER_VALKEY_ALLOW_INSECURE_PLAINTEXT", dynBool, whyValkey},
		{"router-valkey-allow-degraded-writes", "DYN_ROUTER_VALKEY_ALLOW_DEGRADED_WRITES", dynBool, whyValkey},
		// AISimulate's perf model (ais_perf_args.py): --ais-* and the legacy --aic-*, each
		// read from DYN_AIS_* or DYN_AIC_*.
		{"ais-perf-config", "DYN_AIS_PERF_CONFIG", dynValue, whyAIS},
		{"ais-perf-config", "DYN_AIC_PERF_CONFIG", dynValue, whyAIS},
	}
	for _, f := range []string{"backend", "system", "backend-version", "tp-size", "model-path", "moe-tp-size",
		"moe-ep-size", "attention-dp-size", "nextn", "nextn-accept-rates", "mtp-seed"} {
		v := strings.ToUpper(strings.ReplaceAll(f, "-", "_"))
		d = append(d, dynIgnored{"ais-" + f, "DYN_AIS_" + v, dynValue, whyAIS}, dynIgnored{"aic-" + f, "DYN_AIC_" + v, dynValue, whyAIS})
	}
	return d
}()

// ignoredSet gathers the ignored settings given, one per flag name; a later one (the command
// line, after the variables) names what set it.
type ignoredSet struct {
	list []daemon.IgnoredSetting
	at   map[string]int
}

func (s *ignoredSet) add(d dynIgnored, setBy string) {
	if s.at == nil {
		s.at = map[string]int{}
	}
	name := "--" + d.name
	if d.name == "i" {
		name = "-i (--interactive)"
	}
	if i, ok := s.at[name]; ok {
		s.list[i].SetBy = setBy
		return
	}
	s.at[name] = len(s.list)
	s.list = append(s.list, daemon.IgnoredSetting{Name: name, SetBy: setBy, Reason: d.reason})
}

// ignoredValue is an ignored flag's value: anything, remembered in set. A dynBool flag's
// --no- twin is one too.
type ignoredValue struct {
	d    dynIgnored
	flag string // the name given, --no-x for x's twin
	set  *ignoredSet
}

func (v ignoredValue) String() string   { return "" }
func (v ignoredValue) IsBoolFlag() bool { return v.d.kind != dynValue }
func (v ignoredValue) Set(string) error {
	dash := "--"
	if len(v.flag) == 1 {
		dash = "-"
	}
	v.set.add(v.d, dash+v.flag)
	return nil
}

// defineIgnored defines the ignored flags on fs, each taking any value (booleans none), and
// returns their variables by flag name, for the usage.
func defineIgnored(fs *flag.FlagSet, set *ignoredSet) map[string][]string {
	envs := map[string][]string{}
	for _, d := range dynamoIgnored {
		if d.env != "" {
			envs[d.name] = append(envs[d.name], d.env)
		}
		if fs.Lookup(d.name) != nil {
			continue // a second variable of one flag
		}
		use := "Dynamo's; accepted, no effect: " + d.reason
		fs.Var(ignoredValue{d, d.name, set}, d.name, use)
		if d.kind == dynBool {
			fs.Var(ignoredValue{d, "no-" + d.name, set}, "no-"+d.name, "Dynamo's; accepted, no effect")
		}
	}
	return envs
}

// ignoredEnv notes the ignored settings env gives.
func ignoredEnv(env func(string) (string, bool), set *ignoredSet) {
	for _, d := range dynamoIgnored {
		if _, ok := env(d.env); d.env != "" && ok {
			set.add(d, d.env)
		}
	}
}
