package main

import (
	"io"
	"testing"

	"github.com/kvrouterd/kvrouterd/router"
)

// TestBusyThresholdFlags: the busy thresholds are unset unless given, by flag, KVR_ variable or
// Dynamo's DYN_ variable; out-of-range values are refused; new modes parse in Dynamo's
// spellings.
func TestBusyThresholdFlags(t *testing.T) {
	env := func(kv map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
	}
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil || c.BusyThresholds().Configured() || c.OverloadStatus != 529 {
		t.Fatalf("defaults: %+v, %v", c.BusyThresholds(), err)
	}
	c, err = parseConfig([]string{"--active-decode-blocks-threshold", "0.85", "--router-mode", "power-of-two"},
		env(map[string]string{"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD": "1000", "KVR_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC": "0.8",
			"DYN_HTTP_OVERLOAD_STATUS_CODE": "503"}), io.Discard)
	want := router.Thresholds{DecodeBlocks: 0.85, HasDecodeBlocks: true, PrefillTokens: 1000, HasPrefillTokens: true, PrefillFrac: 0.8, HasPrefillFrac: true}
	if err != nil || c.BusyThresholds() != want || c.OverloadStatus != 503 || c.RouterMode != "power-of-two" {
		t.Fatalf("set: %+v %d %q, %v", c.BusyThresholds(), c.OverloadStatus, c.RouterMode, err)
	}
	for _, args := range [][]string{
		{"--active-decode-blocks-threshold", "1.5"},
		{"--active-prefill-tokens-threshold", "-1"},
		{"--active-prefill-tokens-threshold-frac", "-0.1"},
		{"--overload-status", "200"},
		{"--router-mode", "two"},
	} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	if _, err := parseConfig([]string{"--router-mode", "device-aware-weighted"}, env(nil), io.Discard); err != nil {
		t.Fatal(err)
	}
}
