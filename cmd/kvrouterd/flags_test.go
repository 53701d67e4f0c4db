package main

import (
	"bytes"
	"errors"
	"flag"
	"runtime"
	"strings"
	"testing"
)

// TestBadFlagOneLine: a mistyped flag is one line naming it and the flag probably meant, with
// nothing else written; --help writes the usage; --shards defaults to GOMAXPROCS, the CPUs the
// process may use.
func TestBadFlagOneLine(t *testing.T) {
	f := func(args []string, want string) {
		t.Helper()
		var out bytes.Buffer
		_, err := parseConfig(args, func(string) (string, bool) { return "", false }, &out)
		if err == nil || err.Error() != want || out.Len() != 0 {
			t.Fatalf("%q: error %v, output %q; want %q and no output", args, err, out.String(), want)
		}
	}
	f([]string{"--shard", "3"}, "unknown flag --shard: did you mean --shards? (--help lists every flag)")
	f([]string{"-htp-addr", ":1"}, "unknown flag --htp-addr: did you mean --http-addr? (--help lists every flag)")
	f([]string{"--completely-unknown"}, "unknown flag --completely-unknown (--help lists every flag)")
	f([]string{"--shards", "x"}, `invalid value "x" for flag -shards: parse error (--help lists every flag)`)

	var out bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, func(string) (string, bool) { return "", false }, &out); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(out.String(), "--zmq-max-message-bytes (env KVR_ZMQ_MAX_MESSAGE_BYTES") {
		t.Fatalf("--help: %v, %.200q", err, out.String())
	}
	out.Reset()
	if _, err := parseBridgeConfig([]string{"--nats-ur", "x"}, func(string) (string, bool) { return "", false }, &out); err == nil ||
		!strings.Contains(err.Error(), "did you mean --nats-url?") || out.Len() != 0 {
		t.Fatalf("bridge: %v, %q", err, out.String())
	}
	if d := defaults(); d.Shards != runtime.GOMAXPROCS(0) {
		t.Fatalf("--shards defaults to %d, GOMAXPROCS is %d", d.Shards, runtime.GOMAXPROCS(0))
	}
}
