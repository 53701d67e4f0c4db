package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestDaemonPeerRecovery: a kvrouterd started with --peers seeds its index from the first peer
// whose /dump answers, as a Dynamo indexer does at start: a dump written by a kvrouterd with
// --keep-block-tree (Dynamo's form: local hashes, parent-first) rebuilds the same index in a
// fresh daemon, through its own stream; the tree survives a restart (snapshots hold it). The
// peers are listed in /peers. --log-file logs to a
// file, and /reopen_logs opens the path again after a rotation moved it.
func TestDaemonPeerRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildDaemon(t)
	call := func(addr, method, path, body string, want int) string {
		t.Helper()
		return daemonCall(t, addr, method, path, body, want)
	}
	aDir := t.TempDir()
	a := startDaemon(t, bin, "--data-dir", aDir, "--keep-block-tree", "--nats-listen", "127.0.0.1:0")
	defer a.cmd.Process.Kill()
	call(a.addr, "POST", "/register", `{"instance_id":7,"model_name":"m","block_size":4,"dp_rank":0}`, 201)
	call(a.addr, "POST", "/register", `{"instance_id":8,"model_name":"m","block_size":4,"routing_group":"g2"}`, 201)
	call(a.addr, "POST", "/v1/events", `{"worker_id":7,"events":[
		{"type":"stored","event_id":1,"block_hashes":[10,11],"token_ids":[1,2,3,4,5,6,7,8],"block_size":4},
		{"type":"stored","event_id":2,"block_hashes":[12],"parent_hash":10,"token_ids":[9,9,9,9],"block_size":4},
		{"type":"stored","event_id":3,"block_hashes":[13],"token_ids":[1,2,3,4],"block_size":4,"cache_salt":"tenant-a"}]}`, 200)
	call(a.addr, "POST", "/v1/events", `{"worker_id":8,"events":[
		{"type":"stored","event_id":1,"block_hashes":[20],"token_ids":[1,2,3,4],"block_size":4}]}`, 200)
	dumpA := call(a.addr, "GET", "/dump", "", 200)
	if !strings.Contains(dumpA, `"m:default":{"block_size":4,"events":[`) || !strings.Contains(dumpA, `"parent_hash":10`) {
		t.Fatalf("a's dump: %s", dumpA)
	}

	// The tree survives a restart: a's snapshot holds it.
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("a's exit: %v\n%s", err, a.log())
	}
	a = startDaemon(t, bin, "--data-dir", aDir, "--keep-block-tree", "--nats-listen", "127.0.0.1:0")
	defer a.cmd.Process.Kill()
	if again := call(a.addr, "GET", "/dump", "", 200); again != dumpA {
		t.Fatalf("a's dump after a restart:\n%s\nwant\n%s", again, dumpA)
	}

	logPath := filepath.Join(t.TempDir(), "kvrouterd.log")
	b := startDaemon(t, bin, "--data-dir", t.TempDir(), "--keep-block-tree", "--nats-listen", "127.0.0.1:0",
		"--indexer-peers", "http://127.0.0.1:1,http://"+a.addr, "--log-file", logPath)
	defer b.cmd.Process.Kill()
	if dumpB := call(b.addr, "GET", "/dump", "", 200); dumpB != dumpA {
		t.Errorf("b's dump after recovery:\n%s\nwant a's:\n%s", dumpB, dumpA)
	}
	for _, q := range []string{
		`{"model_name":"m","token_ids":[1,2,3,4,5,6,7,8]}`,
		`{"model_name":"m","token_ids":[1,2,3,4,9,9,9,9]}`,
		`{"model_name":"m","token_ids":[1,2,3,4],"cache_salt":"tenant-a"}`,
		`{"model_name":"m","routing_group":"g2","token_ids":[1,2,3,4]}`,
	} {
		qa, qb := call(a.addr, "POST", "/query", q, 200), call(b.addr, "POST", "/query", q, 200)
		if qa != qb || !strings.Contains(qa, `"longest_matched"`) {
			t.Errorf("query %s: b %s, a %s", q, qb, qa)
		}
	}
	if peers := call(b.addr, "GET", "/peers", "", 200); peers != `["http://127.0.0.1:1","http://`+a.addr+`"]`+"\n" {
		t.Errorf("b's peers: %s", peers)
	}
	// The log went to the file, recovery included; a rotation moves it, /reopen_logs opens
	// the path again.
	if logged, err := os.ReadFile(logPath); err != nil || !strings.Contains(string(logged), "recovered the index from a peer") {
		t.Errorf("log file: %v\n%s", err, logged)
	}
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	call(b.addr, "POST", "/reopen_logs", "", 200)
	if _, err := os.Stat(logPath); err != nil {
		t.Errorf("after /reopen_logs: %v", err)
	}
}

// daemonCall sends method path with a JSON body to the daemon at addr, fails the test unless
// the answer's status is want, and returns the answer's body.
func daemonCall(t *testing.T, addr, method, path, body string, want int) string {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	got, _ := io.ReadAll(hr.Body)
	if hr.StatusCode != want {
		t.Fatalf("%s %s on %s: %d %s, want %d", method, path, addr, hr.StatusCode, got, want)
	}
	return string(got)
}
