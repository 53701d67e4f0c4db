package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/daemon"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// TestBadFlagOneLine: a mistyped flag is one line naming it (with two dashes) and the flag
// probably meant, with nothing else written; --help writes the usage; --shards defaults to GOMAXPROCS, the CPUs the
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
	f([]string{"--shards", "x"}, `invalid value "x" for flag --shards: parse error (--help lists every flag)`)
	f([]string{"--http-addr"}, "flag needs an argument: --http-addr (--help lists every flag)")

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
	if d := daemon.Defaults(); d.Shards != runtime.GOMAXPROCS(0) {
		t.Fatalf("--shards defaults to %d, GOMAXPROCS is %d", d.Shards, runtime.GOMAXPROCS(0))
	}
}

// TestStartFailsFast: a start step that cannot succeed ends the process at once with one line
// naming the flag to change: an HTTP address or embedded NATS address taken (a second daemon on
// the host), a data directory that is a file. A clean shutdown logs no warning.
// TestHelpArgument: `kvrouterd help` is --help, `kvrouterd help bridge` bridge's; other
// arguments are left alone.
func TestHelpArgument(t *testing.T) {
	t.Cleanup(func() { helpTopic = "" }) // help TOPIC sets it
	f := func(args, want string) {
		t.Helper()
		if got := strings.Join(helpArgs(strings.Fields(args)), " "); got != want {
			t.Errorf("helpArgs(%q) = %q, want %q", args, got, want)
		}
	}
	f("help", "--help")
	f("help routing", "--help")
	if helpTopic != "routing" {
		t.Errorf("help routing: topic %q", helpTopic)
	}
	f("help bridge", "bridge --help")
	f("help probe", "probe --help")
	f("bridge --zmq x", "bridge --zmq x")
	f("", "")
}

func TestStartFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildDaemon(t)
	natsAddr, dir := freeport.TB(t), t.TempDir()
	d := startDaemon(t, bin, "--nats-listen", natsAddr, "--data-dir", dir)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--http-addr", d.addr, "--nats-listen", freeport.TB(t), "--data-dir", t.TempDir()}, "--http-addr " + d.addr + ": "},
		{[]string{"--http-addr", freeport.TB(t), "--nats-listen", natsAddr, "--data-dir", t.TempDir()}, "--nats-listen " + natsAddr + ": "},
		{[]string{"--http-addr", freeport.TB(t), "--nats-listen", freeport.TB(t), "--data-dir", file}, "--data-dir " + file + ": "},
	} {
		cmd := exec.Command(bin, c.args...)
		var out bytes.Buffer
		cmd.Stderr = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if err == nil || len(lines) != 1 || !strings.HasPrefix(lines[0], "kvrouterd: "+c.flag) {
				t.Fatalf("%v: exit %v, stderr %q; want a failure in one line naming %q", c.args, err, out.String(), c.flag)
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v: still running: %s", c.args, out.String())
		}
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	for _, l := range strings.Split(d.log(), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Fatalf("a clean start and shutdown logged %q:\n%s", l, d.log())
		}
	}
}
