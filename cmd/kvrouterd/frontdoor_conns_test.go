package main

import (
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

// TestDaemonFrontDoorFlood floods the front door's listener, under an open-file limit of 1,024,
// with 1,100 idle connections, which made its accept fail with EMFILE and ended the daemon
// with status 1:
//
//   - with the connection limits derived from the file limit, which the front door shares with
//     the API: idle connections are closed to admit new ones, no accept runs out of files, and
//     the front door and the API answer on fresh connections;
//   - with --http-max-conns above the file limit, 2,000 connections: accept fails with EMFILE,
//     the front door's listener closes idle connections to make room, and both answer.
//
// Either way the daemon ends with status 0 on SIGTERM, every connection held.
func TestDaemonFrontDoorFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	if runtime.GOOS != "linux" {
		t.Skip("needs every 127.0.0.0/8 address on the loopback interface (Linux)")
	}
	limit := server.DefaultMaxConns(daemonFiles)
	need := uint64(2000 + 512)
	var files syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &files); err != nil || files.Max < daemonFiles || files.Cur < need {
		t.Skipf("the test needs %d files of its own and may give the daemon %d: limit %+v, %v", need, daemonFiles, files, err)
	}
	wrapper := filepath.Join(t.TempDir(), "kvrouterd-nofile")
	script := fmt.Sprintf("#!/bin/sh\nulimit -n %d || exit 111\nexec '%s' \"$@\"\n", daemonFiles, buildDaemon(t))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, args ...string) (*floodClient, string) {
		front := freeport.TB(t)
		d := startDaemon(t, wrapper, append([]string{"--data-dir", t.TempDir(), "--nats-listen", freeport.TB(t),
			"--shutdown-timeout", "20s", "--frontend-addr", front}, args...)...)
		_, port, _ := net.SplitHostPort(front)
		f := &floodClient{t: t, d: d, port: port, probe: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}).DialContext,
		}}}
		t.Cleanup(f.close)
		return f, front
	}
	// frontHealth is the front door's /health on a fresh connection, which must answer 200.
	frontHealth := func(t *testing.T, f *floodClient, front string) {
		t.Helper()
		resp, err := f.probe.Get("http://" + front + "/health")
		if err != nil {
			t.Fatalf("front door /health with %d connections held: %v\n%.4000s", len(f.held), err, f.d.log())
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("front door /health: %s", resp.Status)
		}
	}

	t.Run("derived limits", func(t *testing.T) {
		f, front := start(t)
		f.flood(1100)
		frontHealth(t, f, front)
		if body := f.get("/healthz"); body != "ok\n" {
			t.Fatalf("/healthz: %q", body)
		}
		m := f.get("/metrics")
		if got := metricValue(t, m, "kvrouterd_http_connections_open"); got > float64(limit) {
			t.Fatalf("%v connections open, over the limit %d", got, limit)
		}
		if got := metricValue(t, m, `kvrouterd_http_listener_connections_evicted_total{listener="frontdoor"}`); got < 1100-float64(limit) {
			t.Fatalf("%v idle front-door connections closed for new ones, want at least the %d past the limit", got, 1100-limit)
		}
		if got := metricValue(t, m, `kvrouterd_http_listener_connections_accepted_total{listener="frontdoor"}`); got < 1100 {
			t.Fatalf("%v front-door connections admitted, want the 1,100 and the probe", got)
		}
		if got := metricValue(t, m, "kvrouterd_http_accept_errors_total"); got != 0 {
			t.Fatalf("%v accepts ran out of files under the derived limit", got)
		}
		if logs := f.stop(); !strings.Contains(logs, "listener=frontdoor") {
			t.Fatalf("no eviction of the front door's connections in the log:\n%.4000s", logs)
		}
	})

	t.Run("limit over the file limit", func(t *testing.T) {
		f, front := start(t, "--http-max-conns", "4000")
		f.flood(2000)
		frontHealth(t, f, front)
		if body := f.get("/healthz"); body != "ok\n" {
			t.Fatalf("/healthz: %q", body)
		}
		m := f.get("/metrics")
		if got := metricValue(t, m, `kvrouterd_http_listener_accept_errors_total{listener="frontdoor"}`); got == 0 {
			t.Fatalf("no front-door accept ran out of files with 2,000 connections and %d files", daemonFiles)
		}
		if got := metricValue(t, m, `kvrouterd_http_listener_connections_evicted_total{listener="frontdoor"}`); got == 0 {
			t.Fatal("no idle front-door connection closed to free a file")
		}
		if logs := f.stop(); !strings.Contains(logs, "the process is out of files") {
			t.Fatalf("no warning of the file limit in the log:\n%.4000s", logs)
		}
	})
}
