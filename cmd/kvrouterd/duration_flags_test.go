package main

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/daemon"
)

// TestDurationWithoutUnit: every duration flag of kvrouterd and of kvrouterd bridge, and its
// environment variable, refuses a number without a unit with the fix ("--snapshot-interval: 30
// has no unit; write 30s"), and takes the same number with its unit, and a bare 0.
func TestDurationWithoutUnit(t *testing.T) {
	noEnv := func(string) (string, bool) { return "", false }
	durations := func(define func(*flag.FlagSet)) []string {
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		define(fs)
		var names []string
		fs.VisitAll(func(f *flag.Flag) {
			if g, ok := f.Value.(flag.Getter); ok {
				if _, ok := g.Get().(time.Duration); ok {
					names = append(names, f.Name)
				}
			}
		})
		return names
	}
	type parser func(args []string, env func(string) (string, bool)) error
	f := func(parse parser, names []string, atLeast int) {
		t.Helper()
		if len(names) < atLeast {
			t.Fatalf("found duration flags %q", names)
		}
		for _, name := range names {
			if err := parse([]string{"--" + name, "30"}, noEnv); err == nil || err.Error() != "--"+name+": 30 has no unit; write 30s" {
				t.Errorf("--%s 30: %v", name, err)
			}
			env := func(k string) (string, bool) { return "1.5", k == envName(name) }
			if err := parse(nil, env); err == nil || err.Error() != envName(name)+`="1.5": 1.5 has no unit; write 1.5s` {
				t.Errorf("%s=1.5: %v", envName(name), err)
			}
			for _, ok := range []string{"30s", "0"} {
				if err := parse([]string{"--" + name, ok}, noEnv); err != nil && err.Error() == "--"+name+": "+ok+" has no unit; write "+ok+"s" {
					t.Errorf("--%s %s refused: %v", name, ok, err)
				}
			}
		}
	}
	daemonFlags := durations(func(fs *flag.FlagSet) { c := daemon.Defaults(); c.Flags(fs) })
	f(func(args []string, env func(string) (string, bool)) error {
		_, err := parseConfig(append([]string{"--no-kv-events"}, args...), env, io.Discard)
		return err
	}, daemonFlags, 10)
	if err := func() error {
		_, err := parseConfig([]string{"--snapshot-interval", "30s", "--request-expiry", "0.5m"}, noEnv, io.Discard)
		return err
	}(); err != nil {
		t.Fatalf("durations with units: %v", err)
	}
	bridgeFlags := durations(func(fs *flag.FlagSet) { z := daemon.DefaultZMQLimits(); z.Flags(fs) })
	f(func(args []string, env func(string) (string, bool)) error {
		_, err := parseBridgeConfig(append([]string{"--zmq", "worker=1,model=m,endpoint=tcp://127.0.0.1:5557"}, args...), env, io.Discard)
		return err
	}, bridgeFlags, 1)
}
