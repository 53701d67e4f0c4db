package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// TestDynamoFlags: Dynamo's router flags and DYN_ variables set the kvrouterd flags that mean
// the same, with Dynamo's reading of booleans; kvrouterd's variables win over Dynamo's and flags
// over both; --help lists both names.
func TestDynamoFlags(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c, err := parseConfig([]string{"--kv-cache-block-size", "32", "--router-kv-overlap-score-weight", "0.5",
		"--no-router-track-prefill-tokens", "--router-temperature", "0.25", "--no-router-replica-sync"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.BlockSize != 32 || c.OverlapScoreWeight != 0.5 || c.TrackPrefillTokens || c.RouterTemperature != 0.25 || c.ShareLoad {
		t.Fatalf("Dynamo's flags: %+v", c)
	}
	c, err = parseConfig([]string{"--kv-overlap-score-weight=2", "--router-ttl-secs", "30.5"}, env(map[string]string{
		"DYN_ROUTER_MODE": "round-robin", "DYN_ROUTER_TRACK_PREFILL_TOKENS": "no", "DYN_ROUTER_USE_KV_EVENTS": "Off",
		"DYN_KV_CACHE_BLOCK_SIZE": "64", "DYN_ROUTER_REPLICA_SYNC": "yes",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.RouterMode != "round-robin" || c.TrackPrefillTokens || !c.NoKVEvents || c.BlockSize != 64 || c.OverlapScoreWeight != 2 ||
		c.ApproxTTL != 30500*time.Millisecond || !c.ShareLoad {
		t.Fatalf("Dynamo's variables: %+v", c)
	}
	// kvrouterd's variable over Dynamo's, the flag over both.
	c, err = parseConfig([]string{"--block-size", "8"}, env(map[string]string{
		"DYN_ROUTER_MODE": "random", "KVR_ROUTER_MODE": "least_loaded", "DYN_KV_CACHE_BLOCK_SIZE": "64",
	}), io.Discard)
	if err != nil || c.RouterMode != "least_loaded" || c.BlockSize != 8 {
		t.Fatalf("precedence: %+v %v", c, err)
	}
	if _, err := parseConfig(nil, env(map[string]string{"DYN_KV_CACHE_BLOCK_SIZE": "big"}), io.Discard); err == nil || !strings.Contains(err.Error(), "DYN_KV_CACHE_BLOCK_SIZE") {
		t.Fatalf("a bad Dynamo variable: %v, want it named", err)
	}
	for _, m := range []string{"power-of-two", "device-aware-weighted"} {
		if c, err := parseConfig(nil, env(map[string]string{"DYN_ROUTER_MODE": m}), io.Discard); err != nil || c.RouterMode != m {
			t.Fatalf("Dynamo's mode %s: %v", m, err)
		}
	}
	if _, err := parseConfig([]string{"--router-mode", "power-of-three"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "--router-mode") {
		t.Fatalf("an unknown mode: %v, want --router-mode refused", err)
	}
	var help bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, env(nil), &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"--kv-cache-block-size (env DYN_KV_CACHE_BLOCK_SIZE)", "Dynamo's name for --block-size",
		"--router-mode (env KVR_ROUTER_MODE, DYN_ROUTER_MODE", "--no-router-kv-events (no variable)"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

// TestDynamoDisaggFlags: Dynamo's disaggregation settings by their variables and negations.
func TestDynamoDisaggFlags(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c, err := parseConfig(nil, env(map[string]string{"DYN_ENFORCE_DISAGG": "true", "DYN_ROUTER_CONDITIONAL_DISAGG": "1",
		"DYN_ROUTER_CONDITIONAL_DISAGG_CONFIG": `{"policy":"prefill_load","prefill_busy_threshold":0.25}`}), io.Discard)
	if err != nil || !c.EnforceDisagg || !c.ConditionalDisagg || !strings.Contains(c.ConditionalDisaggConfig, "prefill_load") {
		t.Fatalf("variables: %+v %v", c, err)
	}
	c, err = parseConfig([]string{"--no-enforce-disagg", "--no-router-conditional-disagg"}, env(map[string]string{"DYN_ENFORCE_DISAGG": "true"}), io.Discard)
	if err != nil || c.EnforceDisagg || c.ConditionalDisagg {
		t.Fatalf("negations: %+v %v", c, err)
	}
}
