package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestDaemonTrackingKeys runs two replicas sharing load over one NATS, with
// --router-tracking-hash keyed-xxh3-v1: a request routed by the first is booked on the second
// too, and the second counts its blocks as shared with the same prompt only when both replicas
// have the same key and key id. Under another key the booking still counts in the worker's
// load, but none of its blocks is one the second can name.
func TestDaemonTrackingKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary four times")
	}
	dir := t.TempDir()
	keyFile := func(name string, b byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte{b}, 32), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k1, k2 := keyFile("k1", 0x11), keyFile("k2", 0x22)
	ns, _, _ := testStream(t)
	bin := buildDaemon(t)
	prompt := make([]uint32, 64) // 4 blocks of 16
	for i := range prompt {
		prompt[i] = uint32(500 + i)
	}

	// shared starts replicas a and b with the given keys, books the prompt through a, and
	// returns the decode blocks b's match of the same prompt counts on the chosen worker: the
	// worker's active blocks plus the prompt's, less those already active there.
	run := 0
	shared := func(keyA, keyB string) uint32 {
		t.Helper()
		run++ // each pair on a stream and subjects of its own
		start := func(id, key string) *proc {
			return startDaemon(t, bin, "--nats-url", ns.ClientURL(), "--data-dir", t.TempDir(), "--no-snapshots",
				"--nats-stream", fmt.Sprint("tracking", run), "--nats-subject-prefix", fmt.Sprint("tracking", run), "--replica-id", id,
				"--router-tracking-hash", "keyed-xxh3-v1", "--router-tracking-key-file", key, "--router-tracking-key-id", "2026-01")
		}
		stop := func(d *proc) { d.cmd.Process.Kill(); d.cmd.Wait() }
		a := start("a", keyA)
		defer stop(a)
		b := start("b", keyB)
		defer stop(b)
		active := func(d *proc, worker uint64) int64 {
			body, err := httpGet(d.addr)("/v1/workers")
			if err != nil {
				t.Fatal(err)
			}
			var ws struct {
				Workers []router.WorkerInfo `json:"workers"`
			}
			if err := json.Unmarshal(body, &ws); err != nil {
				t.Fatal(err)
			}
			for _, w := range ws.Workers {
				if w.ID == worker {
					return w.ActiveBlocks
				}
			}
			return -1
		}
		waitFor := func(what string, cond func() bool) {
			t.Helper()
			deadline := time.Now().Add(15 * time.Second)
			for !cond() {
				if time.Now().After(deadline) {
					t.Fatalf("%s:\n%s", what, b.log())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		daemonCall(t, a.addr, "POST", "/register", `{"instance_id": 7, "model_name": "m", "block_size": 16}`, 201)
		waitFor("b never learned of a's registration", func() bool { return active(b, 7) == 0 })
		ca := client.New(client.Config{Addr: a.addr, Timeout: 5 * time.Second})
		var resp wire.RouteResponse
		if err := ca.Route(&wire.RouteRequest{RequestID: "tenant-1", Model: "m", Tokens: prompt}, &resp); err != nil {
			t.Fatal(err)
		}
		waitFor("b never saw a's booking", func() bool { return active(b, 7) == 4 })
		cb := client.New(client.Config{Addr: b.addr, Timeout: 5 * time.Second})
		if err := cb.Match(&wire.RouteRequest{Model: "m", Tokens: prompt}, &resp); err != nil {
			t.Fatal(err)
		}
		if len(resp.Candidates) != 1 || resp.Candidates[0].Worker != 7 {
			t.Fatalf("b's match: %+v", resp.Candidates)
		}
		return resp.Candidates[0].ActiveBlocks
	}
	if got := shared(k1, k1); got != 4 {
		t.Errorf("same key: b counts %d decode blocks, want 4 (a's 4 blocks shared with the prompt's)", got)
	}
	if got := shared(k1, k2); got != 8 {
		t.Errorf("another key: b counts %d decode blocks, want 8 (none of a's 4 blocks shared)", got)
	}
}
