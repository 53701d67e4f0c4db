package main

import (
	"io"
	"testing"
	"time"
)

// TestLoadModelFlags: the load model's flags, their KVR_ variables, Dynamo's names and
// variables, and the checks of their values.
func TestLoadModelFlags(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.RouterCost != "auto" || c.OverlapScoreCredit != 1 || c.PrefillLoadScale != 1 || c.OverlapScoreCreditDecay != 0 ||
		c.DecodeActiveRequestWeight != 0 || c.NoAssumeKVReuse || c.TrackOutputBlocks {
		t.Fatalf("defaults: %+v", c)
	}
	c, err = parseConfig([]string{"--router-cost", "main", "--router-kv-overlap-score-credit", "0.5",
		"--router-kv-overlap-score-credit-decay", "2", "--router-prefill-load-scale", "1.5",
		"--router-decode-active-request-weight", "0.25", "--router-assume-kv-reuse=false", "--track-output-blocks"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.RouterCost != "main" || c.OverlapScoreCredit != 0.5 || c.OverlapScoreCreditDecay != 2 || c.PrefillLoadScale != 1.5 ||
		c.DecodeActiveRequestWeight != 0.25 || !c.NoAssumeKVReuse || !c.TrackOutputBlocks {
		t.Fatalf("flags: %+v", c)
	}
	c, err = parseConfig(nil, env(map[string]string{"KVR_NO_ROUTER_ASSUME_KV_REUSE": "true", "KVR_ROUTER_COST": "main",
		"DYN_ROUTER_TRACK_OUTPUT_BLOCKS": "1", "DYN_ROUTER_PREFILL_LOAD_SCALE": "3"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.NoAssumeKVReuse || c.RouterCost != "main" || !c.TrackOutputBlocks || c.PrefillLoadScale != 3 {
		t.Fatalf("variables: %+v", c)
	}
	if c, err = parseConfig(nil, env(map[string]string{"DYN_ROUTER_LOAD_AWARE": "true", "DYN_ROUTER_PREFILL_LOAD_MODEL": "aic"}), io.Discard); err != nil || !c.LoadAware || c.PrefillLoadModel != "aic" {
		t.Fatalf("Dynamo's preset variables: %v %+v", err, c)
	}
	if c, err = parseConfig([]string{"--agentic"}, env(nil), io.Discard); err != nil || !c.Agentic {
		t.Fatalf("--agentic: %v", err)
	}
	if c, err = parseConfig([]string{"--ttft-slo", "800ms", "--router-queue-threshold", "2"}, env(nil), io.Discard); err != nil || c.TTFTSLO != 800*time.Millisecond {
		t.Fatalf("--ttft-slo: %v %v", err, c.TTFTSLO)
	}
	if c, err = parseConfig([]string{"--no-router-assume-kv-reuse", "--router-assume-kv-reuse"}, env(nil), io.Discard); err != nil || c.NoAssumeKVReuse {
		t.Fatalf("Dynamo's positive form after ours: %v %+v", err, c.NoAssumeKVReuse)
	}
	for _, bad := range [][]string{{"--router-cost", "v2"}, {"--router-kv-overlap-score-credit", "-0.5"},
		{"--router-prefill-load-scale", "-1"}, {"--router-kv-overlap-score-credit-decay", "-1"},
		{"--load-aware", "--agentic"}, {"--agentic", "--router-cost", "v1"}, {"--router-cache-weight", "-1"},
		{"--router-prefill-load-model", "ais"}, {"--ttft-slo", "1s"}, {"--ttft-slo", "-1s", "--router-queue-threshold", "2"}} {
		if _, err := parseConfig(bad, env(nil), io.Discard); err == nil {
			t.Errorf("%v taken", bad)
		}
	}
}

// TestTierCreditFlags: the lower tiers' weights, their defaults (Dynamo's), their KVR_ and
// DYN_ variables (kvrouterd's winning), and their checks.
func TestTierCreditFlags(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	f := func(args []string, vars map[string]string, host, disk float64) {
		t.Helper()
		c, err := parseConfig(args, env(vars), io.Discard)
		if err != nil {
			t.Fatalf("%v %v: %v", args, vars, err)
		}
		if c.HostCacheHitWeight != host || c.DiskCacheHitWeight != disk {
			t.Fatalf("%v %v: host %v disk %v, want %v %v", args, vars, c.HostCacheHitWeight, c.DiskCacheHitWeight, host, disk)
		}
	}
	f(nil, nil, 0.75, 0.25)
	f([]string{"--router-host-cache-hit-weight", "0.5", "--router-disk-cache-hit-weight", "0"}, nil, 0.5, 0)
	f(nil, map[string]string{"DYN_ROUTER_HOST_CACHE_HIT_WEIGHT": "0.9", "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT": "0.1"}, 0.9, 0.1)
	f(nil, map[string]string{"DYN_ROUTER_HOST_CACHE_HIT_WEIGHT": "0.9", "KVR_ROUTER_HOST_CACHE_HIT_WEIGHT": "0.6"}, 0.6, 0.25)
	f([]string{"--router-host-cache-hit-weight", "0.2"}, map[string]string{"KVR_ROUTER_HOST_CACHE_HIT_WEIGHT": "0.6"}, 0.2, 0.25)
	for _, bad := range [][]string{{"--router-host-cache-hit-weight", "-0.1"}, {"--router-disk-cache-hit-weight", "NaN"},
		{"--router-disk-cache-hit-weight", "+Inf"}} {
		if _, err := parseConfig(bad, env(nil), io.Discard); err == nil {
			t.Errorf("%v taken", bad)
		}
	}
}
