package main

import (
	"io"
	"testing"
	"time"
)

// TestPredictedTTLFlags: predict-on-route is off unless given, by kvrouterd's duration flag,
// Dynamo's --router-predicted-ttl-secs or its DYN_ variable; a negative TTL and approximate mode
// are refused.
func TestPredictedTTLFlags(t *testing.T) {
	env := func(kv map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
	}
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil || c.PredictedTTL != 0 {
		t.Fatalf("default: %v, %v", c.PredictedTTL, err)
	}
	f := func(args []string, vars map[string]string, want time.Duration) {
		t.Helper()
		c, err := parseConfig(args, env(vars), io.Discard)
		if err != nil || c.PredictedTTL != want {
			t.Fatalf("%q %v: %v, %v; want %v", args, vars, c.PredictedTTL, err, want)
		}
	}
	f([]string{"--router-predicted-ttl", "2s"}, nil, 2*time.Second)
	f([]string{"--router-predicted-ttl-secs", "5"}, nil, 5*time.Second)
	f(nil, map[string]string{"DYN_ROUTER_PREDICTED_TTL_SECS": "1.5"}, 1500*time.Millisecond)
	for _, args := range [][]string{
		{"--router-predicted-ttl-secs", "-1"},
		{"--router-predicted-ttl-secs", "5", "--no-kv-events"},
	} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
