package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/internal/tlscert"
)

// writePair writes a new self-signed pair for 127.0.0.1 and returns a pool trusting it; mod
// moves the files' modification time, so that a rewrite shows within the file system's
// time granularity.
func writePair(t *testing.T, certFile, keyFile string, mod time.Time) *x509.CertPool {
	t.Helper()
	cp, kp, err := tlscert.SelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string][]byte{certFile: cp, keyFile: kp} {
		writeFile(t, f, string(b), mod)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp)
	return pool
}

func writeFile(t *testing.T, path, text string, mod time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil {
		t.Fatal(err)
	}
}

// TestSecurity starts a daemon with --auth-token-file, --tls-cert-file/--tls-key-file, the
// front door and --admin-addr: every listener speaks TLS, a mutating request without a token
// gets 401 and with one 2xx, health stays open, pprof needs a write token, and a rewritten
// token file and a renewed certificate take effect without a restart.
func TestSecurity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded NATS server")
	}
	dir := t.TempDir()
	tokens, certFile, keyFile := filepath.Join(dir, "tokens"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	now := time.Now()
	const oldToken, readToken, newToken = "old-0123456789abcdef", "read-0123456789abcdef", "new-0123456789abcdef"
	writeFile(t, tokens, oldToken+"\nread "+readToken+"\n", now)
	pool := writePair(t, certFile, keyFile, now)
	c := testConfig(t)
	c.FrontendAddr, c.Security.AdminAddr = freeport.TB(t), freeport.TB(t)
	c.Security.AuthTokenFile, c.Security.TLSCertFile, c.Security.TLSKeyFile = tokens, certFile, keyFile
	c.Security.ReloadInterval = 20 * time.Millisecond
	d, err := Start(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Wait(canceled())
	client := func(pool *x509.CertPool) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	hc := client(pool)
	call := func(method, url, token, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	api := "https://" + d.Addr().String()
	register := func(id int) string { return fmt.Sprintf(`{"worker_id":%d,"model":"m","dp_ranks":[0]}`, id) }
	f := func(method, url, token, body string, want int) {
		t.Helper()
		if got := call(method, url, token, body); got != want {
			t.Errorf("%s %s with token %q: %d, want %d", method, url, token, got, want)
		}
	}
	f("GET", api+"/healthz", "", "", 200)
	f("GET", api+"/metrics", "", "", 200)
	f("POST", api+"/v1/workers", "", register(1), 401)
	f("POST", api+"/v1/workers", readToken, register(1), 403)
	f("POST", api+"/v1/workers", oldToken, register(1), 201)
	f("GET", api+"/v1/workers", readToken, "", 200)
	f("POST", "https://"+d.FrontendAddr().String()+"/v1/chat/completions", "", `{"model":"m","messages":[]}`, 401)
	f("GET", "https://"+d.FrontendAddr().String()+"/health", "", "", 200)
	// pprof on its own listener, behind a write token (plain HTTP: it is for loopback).
	adm := "http://" + d.AdminAddr().String() + "/debug/pprof/"
	for token, want := range map[string]int{"": 401, "an-unknown-token-0123456789": 401, readToken: 403, oldToken: 200} {
		req, _ := http.NewRequest("GET", adm, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("pprof with token %q: %d, want %d", token, resp.StatusCode, want)
		}
	}
	// Plain HTTP to the TLS listener is no way in.
	if resp, err := http.Get("http://" + d.Addr().String() + "/v1/workers"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP served on the TLS listener")
		}
	}

	// A rewritten token file: the new token in force, the old one out, without a restart.
	writeFile(t, tokens, newToken+"\n", now.Add(2*time.Second))
	eventually(t, "the rewritten token file in force", func() bool {
		return call("POST", api+"/v1/workers", newToken, register(2)) == 201
	})
	f("POST", api+"/v1/workers", oldToken, register(3), 401)

	// A renewed certificate: served from the next handshake on.
	newPool := writePair(t, certFile, keyFile, now.Add(4*time.Second))
	hc = client(newPool)
	hc.Transport.(*http.Transport).DisableKeepAlives = true
	eventually(t, "the renewed certificate served", func() bool {
		conn, err := tls.Dial("tcp", d.Addr().String(), &tls.Config{RootCAs: newPool})
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	f("GET", api+"/v1/workers", newToken, "", 200)
}

// eventually polls cond until it holds, failing the test after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// TestEmbeddedNATSLoopbackByDefault: the embedded NATS server, whose users can inject events,
// listens on this host only unless told otherwise.
func TestEmbeddedNATSLoopbackByDefault(t *testing.T) {
	host, _, err := net.SplitHostPort(Defaults().NATSListen)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Fatalf("--nats-listen defaults to %q: want a loopback address", Defaults().NATSListen)
	}
	if a := Defaults().Security.AdminAddr; a != "" {
		t.Fatalf("--admin-addr defaults to %q: want off", a)
	}
}

func TestSecurityFlags(t *testing.T) {
	f := func(set func(*Security), want string) {
		t.Helper()
		s := DefaultSecurity()
		set(&s)
		err := s.Check()
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("Check: %v, want %q", err, want)
		}
	}
	f(func(s *Security) {}, "")
	f(func(s *Security) { s.TLSCertFile = "x" }, "--tls-cert-file and --tls-key-file go together")
	f(func(s *Security) { s.ControlRate = -1 }, "--control-rate-limit")
	f(func(s *Security) { s.ReloadInterval = 0 }, "--auth-reload-interval")
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	writeFile(t, short, "abc\n", time.Now())
	s := DefaultSecurity()
	s.AuthTokenFile = short
	if _, err := s.load(); err == nil || !strings.Contains(err.Error(), "--auth-token-file") || !strings.Contains(err.Error(), "at least 16") {
		t.Errorf("a short token: %v, want the flag and the rule named", err)
	}
	s = DefaultSecurity()
	s.TLSCertFile, s.TLSKeyFile = short, short
	if _, err := s.load(); err == nil || !strings.Contains(err.Error(), "--tls-cert-file") {
		t.Errorf("a bad certificate: %v, want the flag named", err)
	}
}

// TestSnapshotTimestampMetric: kvrouterd_snapshot_last_timestamp_seconds is 0 before any
// snapshot and, once one is written, when it was taken, so that time() minus it is its age.
func TestSnapshotTimestampMetric(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded NATS server")
	}
	c := testConfig(t)
	c.SnapshotInterval = 50 * time.Millisecond
	start := time.Now()
	d, err := Start(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Wait(canceled())
	value := func() float64 {
		resp, err := http.Get("http://" + d.Addr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "kvrouterd_snapshot_last_timestamp_seconds "); ok {
				var f float64
				if _, err := fmt.Sscan(v, &f); err != nil {
					t.Fatalf("%q: %v", l, err)
				}
				return f
			}
		}
		t.Fatalf("no kvrouterd_snapshot_last_timestamp_seconds in /metrics")
		return 0
	}
	var got float64
	eventually(t, "a snapshot's time in the metric", func() bool { got = value(); return got > 0 })
	if at := time.Unix(0, int64(got*1e9)); at.Before(start.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("snapshot taken at %v, want between the start %v and now", at, start)
	}
}
