package main

// Dynamo's router flags and DYN_ variables, accepted for kvrouterd's own where they mean the same.

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// dynFlag is one of Dynamo's router settings that a kvrouterd flag means: its flag name (empty
// when kvrouterd's flag has the same name), the kvrouterd flag it sets, its environment
// variable, and how its value reads as the target's: the opposite boolean, seconds, or
// milliseconds.
type dynFlag struct {
	name, target, env   string
	negate, seconds, ms bool
}

// dynamoFlags are Dynamo's names (the frontend's arguments, frontend_args.py, and the router's
// it shares, router_args.py and kv_router_args.py) for the settings kvrouterd has. The
// settings kvrouterd does not have are dynamoIgnored's (dynamo_ignored.go): accepted, warned of.
// testdata/dynamo_flags.txt lists them all, with the Dynamo commits they were read at.
var dynamoFlags = []dynFlag{
	{name: "", target: "router-mode", env: "DYN_ROUTER_MODE"},
	{name: "kv-cache-block-size", target: "block-size", env: "DYN_KV_CACHE_BLOCK_SIZE"},
	{name: "router-block-size", target: "block-size", env: "DYN_ROUTER_BLOCK_SIZE"},
	{name: "", target: "router-temperature", env: "DYN_ROUTER_TEMPERATURE"},
	{name: "router-kv-overlap-score-weight", target: "overlap-score-weight", env: "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT"},
	{name: "kv-overlap-score-weight", target: "overlap-score-weight", env: "DYN_OVERLAP_SCORE_WEIGHT"},
	{name: "router-track-prefill-tokens", target: "track-prefill-tokens", env: "DYN_ROUTER_TRACK_PREFILL_TOKENS"},
	{name: "no-router-track-prefill-tokens", target: "track-prefill-tokens", negate: true},
	{name: "", target: "router-kv-overlap-score-credit", env: "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT"},
	{name: "", target: "router-kv-overlap-score-credit-decay", env: "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY"},
	{name: "", target: "router-prefill-load-scale", env: "DYN_ROUTER_PREFILL_LOAD_SCALE"},
	{name: "", target: "router-decode-active-request-weight", env: "DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT"},
	{name: "", target: "load-aware", env: "DYN_ROUTER_LOAD_AWARE"},
	{name: "no-load-aware", target: "load-aware", negate: true},
	{name: "", target: "agentic", env: "DYN_ROUTER_AGENTIC"},
	{name: "", target: "router-prefill-load-model", env: "DYN_ROUTER_PREFILL_LOAD_MODEL"},
	{name: "", target: "router-host-cache-hit-weight", env: "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT"},
	{name: "", target: "router-disk-cache-hit-weight", env: "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT"},
	{name: "router-assume-kv-reuse", target: "no-router-assume-kv-reuse", negate: true, env: "DYN_ROUTER_ASSUME_KV_REUSE"},
	{name: "assume-kv-reuse", target: "no-router-assume-kv-reuse", negate: true},
	{name: "", target: "router-track-output-blocks", env: "DYN_ROUTER_TRACK_OUTPUT_BLOCKS"},
	// Keyed tracking hashes: the identities active blocks are booked under.
	{name: "", target: "router-tracking-hash", env: "DYN_ROUTER_TRACKING_HASH"},
	{name: "", target: "router-tracking-key-file", env: "DYN_ROUTER_TRACKING_KEY_FILE"},
	{name: "", target: "router-tracking-key-id", env: "DYN_ROUTER_TRACKING_KEY_ID"},
	{name: "track-output-blocks", target: "router-track-output-blocks"},
	{name: "no-router-track-output-blocks", target: "router-track-output-blocks", negate: true},
	{name: "router-kv-events", target: "no-kv-events", negate: true, env: "DYN_ROUTER_USE_KV_EVENTS"},
	{name: "no-router-kv-events", target: "no-kv-events"},
	{name: "kv-events", target: "no-kv-events", negate: true},
	{name: "router-replica-sync", target: "share-load", env: "DYN_ROUTER_REPLICA_SYNC"},
	{name: "no-router-replica-sync", target: "share-load", negate: true},
	{name: "router-ttl-secs", target: "approx-ttl", seconds: true, env: "DYN_ROUTER_TTL_SECS"},
	// Approximate mode's tree bound (an older frontend's flag): blocks before pruning.
	{name: "router-max-tree-size", target: "approx-max-blocks", env: "DYN_ROUTER_MAX_TREE_SIZE"},
	// Dynamo's KV-indexer worker threads are kvrouterd's event-application shards.
	{name: "router-event-threads", target: "shards", env: "DYN_ROUTER_EVENT_THREADS"},
	// Approximate mode's retention, ttl or lru.
	{name: "router-approximate-cache-policy", target: "approx-cache-policy", env: "DYN_ROUTER_APPROXIMATE_CACHE_POLICY"},
	{name: "", target: "active-decode-blocks-threshold", env: "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD"},
	{name: "", target: "active-prefill-tokens-threshold", env: "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD"},
	{name: "", target: "active-prefill-tokens-threshold-frac", env: "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC"},
	// The frontend's status for a request refused as every worker is overloaded.
	{name: "", target: "overload-status", env: "DYN_HTTP_OVERLOAD_STATUS_CODE"},
	{name: "", target: "router-queue-threshold", env: "DYN_ROUTER_QUEUE_THRESHOLD"},
	{name: "", target: "router-queue-policy", env: "DYN_ROUTER_QUEUE_POLICY"},
	{name: "", target: "router-policy-config", env: "DYN_ROUTER_POLICY_CONFIG"},
	{name: "router-max-queue-wait-ms", target: "router-queue-max-wait", ms: true, env: "DYN_ROUTER_MAX_QUEUE_WAIT_MS"},
	{name: "router-session-affinity-ttl-secs", target: "router-session-affinity-ttl", seconds: true, env: "DYN_ROUTER_SESSION_AFFINITY_TTL_SECS"},
	{name: "session-affinity-ttl-secs", target: "router-session-affinity-ttl", seconds: true},
	{name: "", target: "router-session-affinity-mode", env: "DYN_ROUTER_SESSION_AFFINITY_MODE"},
	{name: "router-predicted-ttl-secs", target: "router-predicted-ttl", seconds: true, env: "DYN_ROUTER_PREDICTED_TTL_SECS"},
	// Disaggregated prefill/decode: the frontend's --enforce-disagg, the router's conditional
	// disaggregation (kv_router_args.py).
	{name: "", target: "enforce-disagg", env: "DYN_ENFORCE_DISAGG"},
	{name: "no-enforce-disagg", target: "enforce-disagg", negate: true},
	// An older frontend's opposite: disaggregation enforced unless --decode-fallback.
	{name: "decode-fallback", target: "enforce-disagg", negate: true, env: "DYN_DECODE_FALLBACK"},
	{name: "no-decode-fallback", target: "enforce-disagg"},
	{name: "", target: "router-conditional-disagg", env: "DYN_ROUTER_CONDITIONAL_DISAGG"},
	{name: "no-router-conditional-disagg", target: "router-conditional-disagg", negate: true},
	{name: "", target: "router-conditional-disagg-config", env: "DYN_ROUTER_CONDITIONAL_DISAGG_CONFIG"},
	{name: "", target: "router-conditional-disagg-policy", env: "DYN_ROUTER_CONDITIONAL_DISAGG_POLICY"},
	{name: "", target: "router-conditional-disagg-prefill-busy-threshold", env: "DYN_ROUTER_CONDITIONAL_DISAGG_PREFILL_BUSY_THRESHOLD"},
	{name: "", target: "router-conditional-disagg-decode-busy-threshold", env: "DYN_ROUTER_CONDITIONAL_DISAGG_DECODE_BUSY_THRESHOLD"},
	// The frontend's migration limit: other workers a request is sent to after one fails.
	{name: "migration-limit", target: "frontend-retries", env: "DYN_MIGRATION_LIMIT"},
	// The frontend's HTTPS certificate and key, which kvrouterd's serve its API, the selection
	// service and the front door with.
	{name: "tls-cert-path", target: "tls-cert-file", env: "DYN_TLS_CERT_PATH"},
	{name: "tls-key-path", target: "tls-key-file", env: "DYN_TLS_KEY_PATH"},
	// Dynamo indexer's switch of its listener-control test endpoints.
	{name: "", target: "kv-indexer-test-endpoints", env: "DYN_KV_INDEXER_TEST_ENDPOINTS"},
	// The standalone indexer's --peers is kvrouterd's; the selection service calls it so.
	{name: "indexer-peers", target: "peers"},
	// The selection service's (python -m dynamo.select_service); --selection-cache-max-entries
	// has the same name in both.
	{name: "selection-cache-ttl-secs", target: "selection-cache-ttl", seconds: true},
}

// aliasValue is a Dynamo flag's value: setting it sets its target's.
type aliasValue struct {
	d      dynFlag
	target flag.Value
}

func (a aliasValue) String() string { return "" }

func (a aliasValue) IsBoolFlag() bool {
	b, ok := a.target.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (a aliasValue) Set(v string) error {
	switch {
	case a.IsBoolFlag() && a.d.negate:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		v = strconv.FormatBool(!b)
	case a.d.seconds:
		s, err := strconv.ParseFloat(v, 64)
		if err != nil || !(s > 0) || s > 1e9 {
			return fmt.Errorf("%q: want a number of seconds > 0", v)
		}
		v = time.Duration(s * float64(time.Second)).String()
	case a.d.ms:
		ms, err := strconv.ParseFloat(v, 64)
		if err != nil || !(ms > 0) || ms > 1e12 {
			return fmt.Errorf("%q: want a number of milliseconds > 0", v)
		}
		v = time.Duration(ms * float64(time.Millisecond)).String()
	}
	return a.target.Set(v)
}

// defineDynamoFlags defines Dynamo's flag names on fs, whose kvrouterd flags are defined, and
// returns the flags' Dynamo variables by flag name, for the usage.
func defineDynamoFlags(fs *flag.FlagSet) map[string][]string {
	envs := map[string][]string{}
	for _, d := range dynamoFlags {
		t := fs.Lookup(d.target)
		if t == nil {
			panic("kvrouterd: Dynamo flag for a flag not defined: " + d.target)
		}
		name := d.target
		if d.name != "" {
			name = d.name
			fs.Var(aliasValue{d, t.Value}, d.name, "Dynamo's name for --"+d.target+dynNote(d))
		}
		if d.env != "" {
			envs[name] = append(envs[name], d.env)
		}
	}
	return envs
}

func dynNote(d dynFlag) string {
	switch {
	case d.negate:
		return " (the opposite)"
	case d.seconds:
		return " (in seconds)"
	case d.ms:
		return " (in milliseconds)"
	}
	return ""
}

// dynamoEnv sets fs's flags from Dynamo's variables in env, before kvrouterd's own (KVR_) and
// the flags, which win. A boolean variable is true for true, 1, yes or on (any case) and false
// otherwise, as Dynamo reads it.
func dynamoEnv(fs *flag.FlagSet, env func(string) (string, bool)) error {
	for _, d := range dynamoFlags {
		v, ok := env(d.env)
		if d.env == "" || !ok {
			continue
		}
		a := aliasValue{d, fs.Lookup(d.target).Value}
		if a.IsBoolFlag() {
			v = strconv.FormatBool(dynTrue(v))
		}
		if err := a.Set(v); err != nil {
			return fmt.Errorf("%s=%q: %v", d.env, v, err)
		}
	}
	return nil
}

// dynTrue reads a boolean variable as Dynamo does: true for true, 1, yes or on (any case), false
// for anything else.
func dynTrue(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true", "1", "yes", "on":
		return true
	}
	return false
}
