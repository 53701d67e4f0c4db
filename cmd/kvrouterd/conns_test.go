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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/server"
)

// daemonFiles is the open-file limit the flooded daemon runs under.
const daemonFiles = 1024

// TestDaemonConnectionFlood runs the binary under an open-file limit of 1,024 with its default
// connection limits (derived from that file limit), and opens 1,000 idle connections more than
// the limit, from 16 loopback addresses: the daemon does not run out of files and exit, a
// health probe on a fresh connection is answered, a client address past its own limit gets 503,
// and SIGTERM still ends the daemon with status 0 while every connection is held open.
func TestDaemonConnectionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	if runtime.GOOS != "linux" {
		t.Skip("needs every 127.0.0.0/8 address on the loopback interface (Linux)")
	}
	limit, perIP := server.DefaultMaxConns(daemonFiles), server.DefaultMaxConns(daemonFiles)/4
	flood := limit + 1000
	var files syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &files); err != nil || files.Max < daemonFiles || files.Cur < uint64(flood+perIP+512) {
		t.Skipf("the test needs %d files of its own and may give the daemon %d: limit %+v, %v", flood+perIP+512, daemonFiles, files, err)
	}
	// The shell lowers the soft and hard limits, so that Go's start-up raise of the soft limit
	// to the hard one leaves 1,024.
	wrapper := filepath.Join(t.TempDir(), "kvrouterd-nofile")
	script := fmt.Sprintf("#!/bin/sh\nulimit -n %d || exit 111\nexec '%s' \"$@\"\n", daemonFiles, buildDaemon(t))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, wrapper, "--data-dir", t.TempDir(), "--nats-listen", freeAddr(t), "--shutdown-timeout", "20s")
	defer d.cmd.Process.Kill()
	_, port, _ := net.SplitHostPort(d.addr)

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	dial := func(from byte) net.Conn {
		t.Helper()
		dl := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, from)}}
		c, err := dl.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			t.Fatalf("connection %d from 127.0.0.%d: %v\n%s", len(held), from, err, d.log())
		}
		held = append(held, c)
		return c
	}
	// The kernel completes every handshake and queues the connections for accept, in order;
	// the daemon takes them as idle connections that never send a byte.
	for i := range flood {
		dial(byte(2 + i%16))
	}

	// A probe on a fresh connection, from another address, opened after every one of them.
	probe := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}).DialContext,
	}}
	get := func(path string) string {
		t.Helper()
		resp, err := probe.Get("http://" + d.addr + path)
		if err != nil {
			t.Fatalf("GET %s with %d idle connections open: %v\n%.4000s", path, flood, err, d.log())
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %q %v", path, resp.Status, body, err)
		}
		return string(body)
	}
	if body := get("/healthz"); body != "ok\n" {
		t.Fatalf("/healthz: %q", body)
	}
	m := get("/metrics")
	if got := metricValue(t, m, "kvrouterd_http_connections_max{scope=\"total\"}"); got != float64(limit) {
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
		dial(200)
	}
	for range 10 {
		c := dial(200)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 503 ") {
			t.Fatalf("connection %d from 127.0.0.200: %q %v; want a 503", perIP+1, line, err)
		}
	}
	m = get("/metrics")
	if got := metricValue(t, m, "kvrouterd_http_connections_refused_total{reason=\"per_ip\"}"); got != 10 {
		t.Fatalf("%v connections refused for their address, want 10", got)
	}
	if got := metricValue(t, m, "kvrouterd_http_connections_refused_total{reason=\"limit\"}"); got != 0 {
		t.Fatalf("%v connections refused at the total limit with idle ones to close", got)
	}
	if body := get("/healthz"); body != "ok\n" {
		t.Fatalf("/healthz: %q", body)
	}

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%.4000s", err, d.log())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit 60 s after SIGTERM\n%.4000s", d.log())
	}
	logs := d.log()
	// Connections that never sent a request are closed, not waited for as requests in flight
	// until the shutdown timeout.
	if !strings.Contains(logs, "msg=stopped") || strings.Contains(logs, "requests still in flight") {
		t.Fatalf("no graceful stop in the log:\n%.4000s", logs)
	}
	// Refusals and evictions are logged a line at a time, not a line per connection.
	if n := strings.Count(logs, "idle HTTP connection closed"); n == 0 || n > 100 {
		t.Fatalf("%d log lines for 1,000 evictions", n)
	}
	if n := strings.Count(logs, "reason=unreadable"); n > 0 {
		t.Fatalf("%d idle connections logged as unreadable requests", n)
	}
}

// metricValue is the value of the sample named name (with its labels) in a Prometheus text page.
func metricValue(t *testing.T, page, name string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}
