package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/snapshot"
)

// testConfig is a daemon on free loopback ports with its data in a new directory, quiet.
func testConfig(t *testing.T) Config {
	c := Defaults()
	c.HTTPAddr, c.NATSListen, c.DataDir = freeport.TB(t), freeport.TB(t), t.TempDir()
	c.Shards, c.LogLevel, c.ShutdownTimeout = 2, "error", 5*time.Second
	return c
}

// TestStartFailsAndUndoes fails each start step in turn: the step's error names the flag to
// change, and the failed start leaves nothing behind — no goroutine, no open file, no bound
// port — so that a supervisor (or a test) may start again at once.
func TestStartFailsAndUndoes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts embedded NATS servers")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A data directory whose snapshot store another process holds (as a daemon running on it
	// would): a daemon on it must not start.
	held := t.TempDir()
	store, err := snapshot.Open(filepath.Join(held, "snapshots"), snapshot.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	steps := []struct {
		name, flag string
		set        func(c *Config)
		is         error // what the error wraps, if the step has a sentinel
	}{
		{"HTTP port taken", "--http-addr", func(c *Config) { c.HTTPAddr = taken.Addr().String() }, nil},
		{"HTTP address bad", "--http-addr", func(c *Config) { c.HTTPAddr = "256.0.0.1:80" }, nil},
		{"selection port taken", "--selection-addr", func(c *Config) { c.SelectionAddr = taken.Addr().String() }, nil},
		{"admin port taken", "--admin-addr", func(c *Config) { c.Security.AdminAddr = taken.Addr().String() }, nil},
		{"token file missing", "--auth-token-file", func(c *Config) {
			c.Security.AdminAddr, c.Security.AuthTokenFile = freeport.TB(t), filepath.Join(file, "tokens")
		}, nil},
		{"certificate missing", "--tls-cert-file", func(c *Config) { c.Security.TLSCertFile, c.Security.TLSKeyFile = file, file }, nil},
		{"data dir a file", "--data-dir", func(c *Config) { c.DataDir = filepath.Join(file, "data") }, nil},
		{"data dir unwritable", "--data-dir", func(c *Config) { c.DataDir = unwritableDir(t) }, nil},
		{"data dir held by a running daemon", "--data-dir", func(c *Config) { c.DataDir = held }, nil},
		{"bad replica id", "--replica-id", func(c *Config) { c.ReplicaID = "no spaces" }, nil},
		{"bootstrap peer unreachable", "--bootstrap-from", func(c *Config) { c.BootstrapFrom = "http://" + closedAddr(t) }, nil},
		{"embedded NATS port taken", "--nats-listen", func(c *Config) { c.NATSListen = taken.Addr().String() }, ingest.ErrEmbeddedListen},
		{"NATS URL unreachable", "--nats-url", func(c *Config) { c.NATSURL = "nats://" + closedAddr(t) }, ingest.ErrUnreachable},
		{"NATS URL unreachable, without snapshots", "--nats-url", func(c *Config) {
			c.NATSURL, c.NoSnapshots = "nats://"+closedAddr(t), true
		}, ingest.ErrUnreachable},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			c := testConfig(t)
			s.set(&c)
			if err := c.Check(); err != nil {
				t.Fatalf("the configuration is refused before the start: %v", err)
			}
			before := snapshotProcess(t)
			start := time.Now()
			d, err := Start(context.Background(), c, io.Discard)
			took := time.Since(start)
			if err == nil {
				d.Wait(canceled())
				t.Fatal("started")
			}
			if !strings.HasPrefix(err.Error(), s.flag+" ") && !strings.HasPrefix(err.Error(), s.flag+":") {
				t.Fatalf("error %q does not begin with the flag %s", err, s.flag)
			}
			if s.is != nil && !errors.Is(err, s.is) {
				t.Fatalf("error %q does not wrap %q", err, s.is)
			}
			t.Logf("failed in %v: %v", took.Round(time.Millisecond), err)
			before.check(t, c, taken.Addr().String())
		})
	}
}

// TestStartAndStopUndoes: a daemon started and shut down leaves nothing running either, its last
// snapshot written and its ports free for the next, the selection service's too.
func TestStartAndStopUndoes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded NATS server")
	}
	c := testConfig(t)
	c.SnapshotInterval, c.SelectionAddr = 0, freeport.TB(t)
	before := snapshotProcess(t)
	var log bytes.Buffer
	c.LogLevel = "info"
	d, err := Start(context.Background(), c, &log)
	if err != nil {
		t.Fatal(err)
	}
	if off, known := thpOff(); known && !off {
		t.Fatal("--transparent-huge-pages off (the default): the process's flag is not set")
	}
	resp, err := http.Get("http://" + d.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %s", resp.Status)
	}
	if resp, err = http.Get("http://" + d.SelectionAddr().String() + "/health"); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the selection service's /health: %s", resp.Status)
	}
	if err := d.Wait(canceled()); err != nil {
		t.Fatal(err)
	}
	before.check(t, c)
	if !strings.Contains(log.String(), `msg="snapshot written"`) {
		t.Fatalf("no snapshot at shutdown:\n%s", log.String())
	}
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Fatalf("a clean start and shutdown logged %q", l)
		}
	}
}

// process is what a test process holds: goroutines and open files.
type process struct {
	goroutines, files int
}

// snapshotProcess counts what the process holds now and turns the garbage collector off until
// the test ends: a finalizer would close a file or listener the daemon forgot, and hide the leak.
func snapshotProcess(t *testing.T) process {
	t.Helper()
	old := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	settle()
	return process{goroutines(), openFiles(t)}
}

// check fails t if, within a few seconds (goroutines that were told to stop may take a moment
// to return), the process holds more goroutines or files than p, or c's ports are bound, save
// those the test holds itself (keep).
func (p process) check(t *testing.T, c Config, keep ...string) {
	t.Helper()
	var g, f int
	for range 100 {
		settle()
		if g, f = goroutines(), openFiles(t); g <= p.goroutines && f <= p.files {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g > p.goroutines {
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Fatalf("%d goroutines left running (%d before):\n%s", g-p.goroutines, p.goroutines, b.String())
	}
	if f > p.files {
		t.Fatalf("%d files left open (%d before): %s", f-p.files, p.files, fds(t))
	}
	for _, addr := range []string{c.HTTPAddr, c.NATSListen, c.SelectionAddr} {
		if !strings.HasPrefix(addr, "127.0.0.1:") || slices.Contains(keep, addr) {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s still bound: %v", addr, err)
		}
		ln.Close()
	}
}

// goroutines counts the process's goroutines, less those of stopped fasthttp servers that
// finish their last idle-worker sweep's sleep (up to 10 s) before they return.
func goroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	g := 0
	for _, st := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(st, "fasthttp.(*workerPool).Start.func2") {
			g++
		}
	}
	return g
}

// settle lets goroutines that were told to stop run.
func settle() { runtime.Gosched() }

// openFiles is the number of the process's open file descriptors (Linux); 0 elsewhere.
func openFiles(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(es)
}

// fds lists what the process's file descriptors point at.
func fds(t *testing.T) string {
	es, _ := os.ReadDir("/proc/self/fd")
	var s []string
	for _, e := range es {
		l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		s = append(s, e.Name()+"→"+l)
	}
	return strings.Join(s, " ")
}

// unwritableDir is a directory the process cannot write in: read-only by mode, or, for root,
// a read-only tmpfs; where neither can be had, a path beneath a file.
func unwritableDir(t *testing.T) string {
	dir := t.TempDir()
	if os.Geteuid() != 0 {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(dir, 0o755) })
		return dir
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", dir).CombinedOutput(); err == nil {
		t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
		return dir
	} else {
		t.Logf("no read-only tmpfs (%v: %s); a path beneath a file instead", err, out)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(file, "data")
}

// canceled is a context already done: Wait shuts down at once.
func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// closedAddr is a loopback address nothing listens on: connections to it are refused.
func closedAddr(t *testing.T) string { return freeport.TB(t) }
