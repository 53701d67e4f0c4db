package main

import (
	"io"
	"strings"
	"testing"
)

// TestDynamoApproxCachePolicy: --router-approximate-cache-policy (and its variable) picks
// approximate mode's retention; lru needs --no-kv-events, as in Dynamo, which refuses it with
// KV events; anything but ttl or lru is refused.
func TestDynamoApproxCachePolicy(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c, err := parseConfig([]string{"--no-router-kv-events", "--router-approximate-cache-policy", "lru"}, env(nil), io.Discard)
	if err != nil || c.ApproxCachePolicy != "lru" {
		t.Fatalf("the flag: %q, %v", c.ApproxCachePolicy, err)
	}
	c, err = parseConfig(nil, env(map[string]string{"DYN_ROUTER_USE_KV_EVENTS": "false", "DYN_ROUTER_APPROXIMATE_CACHE_POLICY": "lru"}), io.Discard)
	if err != nil || c.ApproxCachePolicy != "lru" {
		t.Fatalf("the variable: %q, %v", c.ApproxCachePolicy, err)
	}
	if c, err := parseConfig(nil, env(nil), io.Discard); err != nil || c.ApproxCachePolicy != "ttl" {
		t.Fatalf("the default: %q, %v; want ttl", c.ApproxCachePolicy, err)
	}
	if _, err := parseConfig([]string{"--router-approximate-cache-policy", "lru"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "--no-kv-events") {
		t.Fatalf("lru with KV events: %v, want a refusal naming --no-kv-events", err)
	}
	if _, err := parseConfig([]string{"--no-kv-events", "--router-approximate-cache-policy", "lfu"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "ttl or lru") {
		t.Fatalf("an unknown policy: %v", err)
	}
}
