package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestConfigEnvAndFlags(t *testing.T) {
	env := map[string]string{
		"KVR_MOCKER_WORKER_ID":  "3",
		"KVR_MOCKER_SPEEDUP":    "50",
		"KVR_MOCKER_MODEL":      "from-env",
		"KVR_MOCKER_PREFILL_T0": "2.5",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	env["KVR_MOCKER_DIE_AFTER"] = "7"
	c, err := parseConfig([]string{"--model", "llama", "--blocks", "100", "--shutdown-timeout", "2s", "--fail-rate", "0.25"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkerID != 3 || c.Speedup != 50 || c.Model != "llama" || c.Blocks != 100 || c.Timing.P0 != 2.5 ||
		c.ShutdownTimeout != 2*time.Second || c.BlockSize != 16 || c.Timing.D0 != 5.74 || c.FailRate != 0.25 || c.DieAfter != 7 {
		t.Errorf("config %+v", c)
	}

	bad := func(args []string, env map[string]string, want string) {
		t.Helper()
		lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
		if _, err := parseConfig(args, lookup, io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v %v: %v, want %q", args, env, err, want)
		}
	}
	bad([]string{"--speedup", "0"}, nil, "--speedup")
	bad([]string{"--fail-rate", "1.5"}, nil, "--fail-rate: 1.5 is not a fraction in 0…1")
	bad(nil, map[string]string{"KVR_MOCKER_FAIL_RATE": "NaN"}, "--fail-rate: NaN")
	bad([]string{"--die-after", "-1"}, nil, "--die-after: -1 is negative")
	bad(nil, map[string]string{"KVR_MOCKER_DIE_AFTER": "x"}, `KVR_MOCKER_DIE_AFTER="x"`)
	bad([]string{"--nope"}, nil, "flag provided but not defined: -nope")
	bad([]string{"extra"}, nil, `unexpected argument "extra"`)
	bad(nil, map[string]string{"KVR_MOCKER_BLOCKS": "many"}, `KVR_MOCKER_BLOCKS="many"`)

	var help strings.Builder
	if _, err := parseConfig([]string{"--help"}, lookup, &help); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(help.String(), "--register (env KVR_MOCKER_REGISTER") ||
		!strings.Contains(help.String(), "--die-after (env KVR_MOCKER_DIE_AFTER, default \"0\")") {
		t.Errorf("--help: %v\n%s", err, help.String())
	}
}
