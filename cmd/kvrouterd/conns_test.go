package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/server"
)

// daemonFiles is the open-file limit the flooded daemon runs under.
const daemonFiles = 1024

// TestDaemonConnectionFlood runs the binary under an open-file limit of 1,024 and floods it
// with idle connections from 16 loopback addresses, as 20,000 idle connections did a daemon
// that then ran out of files and exited:
//
//   - with the connection limits derived from that file limit, 1,000 connections past the limit:
//     the daemon stays up, a health probe on a fresh connection is answered, a client address
//     past its own limit gets 503, and SIGTERM ends it with status 0 while every connection is
//     held open, without waiting them out as requests in flight;
//   - with --http-max-conns above the file limit, 2,000 connections: accept fails with EMFILE,
//     and the daemon closes idle connections to make room and answers the probe.
func TestDaemonConnectionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	if runtime.GOOS != "linux" {
		t.Skip("needs every 127.0.0.0/8 address on the loopback interface (Linux)")
	}
	limit, perIP := server.DefaultMaxConns(daemonFiles), server.DefaultMaxConns(daemonFiles)/4
	need := uint64(max(limit+1000+perIP, 2000) + 512)
	var files syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &files); err != nil || files.Max < daemonFiles || files.Cur < need {
		t.Skipf("the test needs %d files of its own and may give the daemon %d: limit %+v, %v", need, daemonFiles, files, err)
	}
	// The shell lowers the soft and hard limits, so that Go's start-up raise of the soft limit
	// to the hard one leaves 1,024.
	wrapper := filepath.Join(t.TempDir(), "kvrouterd-nofile")
	script := fmt.Sprintf("#!/bin/sh\nulimit -n %d || exit 111\nexec '%s' \"$@\"\n", daemonFiles, buildDaemon(t))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, args ...string) *floodClient {
		d := startDaemon(t, wrapper, append([]string{"--data-dir", t.TempDir(), "--nats-listen", freeport.TB(t),
			"--shutdown-timeout", "20s"}, args...)...)
		_, port, _ := net.SplitHostPort(d.addr)
		f := &floodClient{t: t, d: d, port: port, probe: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}).DialContext,
		}}}
		t.Cleanup(f.close)
		return f
	}

	t.Run("derived limits", func(t *testing.T) {
		f := start(t)
		// The kernel completes every handshake and queues the connections for accept, in
		// order; the daemon takes them as idle connections that never send a byte. The probe
		// comes on a fresh connection from another address, after every one of them.
		f.flood(limit + 1000)
		if body := f.get("/healthz"); body != "ok\n" {
			t.Fatalf("/healthz: %q", body)
		}
		m := f.get("/metrics")
		if got := metricValue(t, m, `kvrouterd_http_connections_max{scope="total"}`); got != float64(limit) {
			t.Fatalf("connection limit %v, want %d (derived from %d files)", got, limit, daemonFiles)
		}
		if got := metricValue(t, m, "kvrouterd_http_connections_open"); got > float64(limit) {
			t.Fatalf("%v connections open, over the limit %d", got, limit)
		}
		if got := metricValue(t, m, "kvrouterd_http_connections_evicted_total"); got < 1000 {
			t.Fatalf("%v idle connections closed for new ones, want at least the 1,000 past the limit", got)
		}
		if got := metricValue(t, m, "kvrouterd_http_accept_errors_total"); got != 0 {
			t.Fatalf("%v accepts ran out of files under the derived limit", got)
		}

		// One address past its own limit: the connections beyond it are answered 503 and closed.
		for range perIP {
			f.dial(200)
		}
		for range 10 {
			c := f.dial(200)
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "HTTP/1.1 503 ") {
				t.Fatalf("connection %d from 127.0.0.200: %q %v; want a 503", perIP+1, line, err)
			}
		}
		m = f.get("/metrics")
		if got := metricValue(t, m, `kvrouterd_http_connections_refused_total{reason="per_ip"}`); got != 10 {
			t.Fatalf("%v connections refused for their address, want 10", got)
		}
		if got := metricValue(t, m, `kvrouterd_http_connections_refused_total{reason="limit"}`); got != 0 {
			t.Fatalf("%v connections refused at the total limit with idle ones to close", got)
		}
		if body := f.get("/healthz"); body != "ok\n" {
			t.Fatalf("/healthz: %q", body)
		}
		logs := f.stop()
		// Refusals and evictions are logged a line at a time, not a line per connection.
		if n := strings.Count(logs, "idle HTTP connection closed"); n == 0 || n > 100 {
			t.Fatalf("%d log lines for 1,000 evictions", n)
		}
		if n := strings.Count(logs, "reason=unreadable"); n > 0 {
			t.Fatalf("%d idle connections logged as unreadable requests", n)
		}
	})

	t.Run("limit over the file limit", func(t *testing.T) {
		f := start(t, "--http-max-conns", "4000")
		f.flood(2000)
		if body := f.get("/healthz"); body != "ok\n" {
			t.Fatalf("/healthz: %q", body)
		}
		m := f.get("/metrics")
		if got := metricValue(t, m, "kvrouterd_http_accept_errors_total"); got == 0 {
			t.Fatalf("no accept ran out of files with 2,000 connections and %d files", daemonFiles)
		}
		if got := metricValue(t, m, "kvrouterd_http_connections_evicted_total"); got == 0 {
			t.Fatal("no idle connection closed to free a file")
		}
		if logs := f.stop(); !strings.Contains(logs, "the process is out of files") {
			t.Fatalf("no warning of the file limit in the log:\n%.4000s", logs)
		}
	})
}

// floodClient holds idle connections open to a daemon and probes it on fresh ones.
type floodClient struct {
	t     *testing.T
	d     *proc
	port  string
	held  []net.Conn
	probe *http.Client
}

// dial opens a connection from 127.0.0.from and holds it.
func (f *floodClient) dial(from byte) net.Conn {
	f.t.Helper()
	dl := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, from)}}
	c, err := dl.Dial("tcp", net.JoinHostPort("127.0.0.1", f.port))
	if err != nil {
		f.t.Fatalf("connection %d from 127.0.0.%d: %v\n%.4000s", len(f.held), from, err, f.d.log())
	}
	f.held = append(f.held, c)
	return c
}

// flood opens n connections from 127.0.0.2 to 127.0.0.17 in turn.
func (f *floodClient) flood(n int) {
	for i := range n {
		f.dial(byte(2 + i%16))
	}
}

// get is a GET on a fresh connection from 127.0.0.1, which must answer 200.
func (f *floodClient) get(path string) string {
	f.t.Helper()
	resp, err := f.probe.Get("http://" + f.d.addr + path)
	if err != nil {
		f.t.Fatalf("GET %s with %d connections held: %v\n%.4000s", path, len(f.held), err, f.d.log())
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		f.t.Fatalf("GET %s: %s %q %v", path, resp.Status, body, err)
	}
	return string(body)
}

// stop sends SIGTERM with every connection still held, requires a graceful exit with status 0,
// and returns the log.
func (f *floodClient) stop() string {
	f.t.Helper()
	if err := f.d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		f.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			f.t.Fatalf("exit after SIGTERM: %v\n%.4000s", err, f.d.log())
		}
	case <-time.After(60 * time.Second):
		f.t.Fatalf("no exit 60 s after SIGTERM\n%.4000s", f.d.log())
	}
	logs := f.d.log()
	// Connections that never sent a request are closed, not waited for as requests in flight
	// until the shutdown timeout.
	if !strings.Contains(logs, "msg=stopped") || strings.Contains(logs, "requests still in flight") {
		f.t.Fatalf("no graceful stop in the log:\n%.4000s", logs)
	}
	return logs
}

func (f *floodClient) close() {
	for _, c := range f.held {
		c.Close()
	}
	f.d.cmd.Process.Kill()
}
