package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// TestDaemonAdminForbidden: with --auth-token-file, the admin listener answers no token and an
// unknown one 401 with a challenge, a read token 403 (a token it knows, without the right), and
// a write token 200, as every other listener of the daemon.
func TestDaemonAdminForbidden(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const readToken, writeToken = "read-token-0123456789abcdef", "write-token-0123456789abcdef"
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("read "+readToken+"\n"+writeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adm := freeport.TB(t)
	d := startDaemon(t, buildDaemon(t), "--data-dir", dir, "--nats-listen", "127.0.0.1:0",
		"--auth-token-file", tokens, "--admin-addr", adm)
	defer d.cmd.Process.Kill()
	for _, c := range []struct {
		token     string
		status    int
		challenge bool
	}{{"", 401, true}, {"unknown-token-0123456789abcdef", 401, true}, {readToken, 403, false}, {writeToken, 200, false}} {
		req, _ := http.NewRequest("GET", "http://"+adm+"/debug/pprof/", nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || (resp.Header.Get("WWW-Authenticate") != "") != c.challenge {
			t.Errorf("token %q: %s, WWW-Authenticate %q, %q; want %d, challenge %v", c.token, resp.Status,
				resp.Header.Get("WWW-Authenticate"), b, c.status, c.challenge)
		}
		if c.status == 403 && !strings.Contains(string(b), "write token") {
			t.Errorf("403 says %q; want it to name the write token needed", b)
		}
	}
}
