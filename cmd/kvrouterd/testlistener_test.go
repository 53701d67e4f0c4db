package main

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// TestDaemonTestListener plays Dynamo's listener-control test endpoints against the daemon and
// a fake engine registered by /register: a pause keeps the rank's blocks; a batch published
// while paused is replayed from the engine's replay socket after the resume; pausing a paused
// rank, resuming an active one, an unknown instance or rank are refused with Dynamo's statuses
// and messages. Without the switch the endpoints do not exist.
func TestDaemonTestListener(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildDaemon(t)
	args := []string{"--nats-listen", freeport.TB(t), "--data-dir", t.TempDir(), "--no-snapshots", "--block-size", strconv.Itoa(rankBlock)}
	d := startDaemon(t, bin, append(args, "--kv-indexer-test-endpoints")...)
	defer func() { d.cmd.Process.Kill(); d.cmd.Wait() }()
	post := func(d *proc, path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+d.addr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	expect := func(d *proc, path, body string, status int, want string) {
		t.Helper()
		if code, got := post(d, path, body); code != status || !strings.Contains(got, want) {
			t.Errorf("%s %s: %d %s, want %d with %q", path, body, code, got, status, want)
		}
	}

	rc := &rankCase{name: "register", form: enginetest.VLLMArray, register: true, replay: true, worker: 7,
		eng: enginetest.Start(t, enginetest.Options{Replay: true})}
	rk := rc.eng.Rank(0)
	if code, body := post(d, "/register", rk.Registration(rc.worker, "m", rankBlock)); code != http.StatusCreated {
		t.Fatalf("/register: %d %s", code, body)
	}
	x := newRankRun(t, d, rc)
	x.publish(0, x.stored(-1, 0, 1))
	x.expect("before the pause", 2, 0)

	const rank0 = `{"instance_id": 7, "dp_rank": 0}`
	expect(d, "/test/pause_listener", rank0, http.StatusOK, `{"status":"ok"}`)
	expect(d, "/test/pause_listener", `{"instance_id": 7}`, http.StatusConflict, "instance 7 dp_rank 0 cannot be paused from status paused")
	// Dynamo's status for the rank and for the instance, whose only rank it is; kvrouterd's state.
	if code, body := httpGetStatus(t, d.addr, "/workers"); code != http.StatusOK || !strings.Contains(body, `"status":"paused","state":"paused"`) ||
		!strings.Contains(body, `"source":"zmq","status":"paused"`) || strings.Contains(body, `"status":"active"`) {
		t.Errorf("/workers while paused: %d %s", code, body)
	}
	if n := sample(t, scrape(d.addr), `dynamo_kvindexer_listeners{status="paused"}`); n != 1 {
		t.Errorf(`dynamo_kvindexer_listeners{status="paused"} = %v, want 1`, n)
	}
	x.expect("paused: the blocks stay", 2, 0)
	// Published while nobody reads the socket: only the replay socket has it.
	rk.Publish(rk.Batch(x.stored(1, 2)...), rc.form.EngineForm)
	x.want++

	expect(d, "/test/resume_listener", rank0, http.StatusOK, `{"status":"ok"}`)
	c := client.New(client.Config{Addr: d.addr})
	rk.PublishUntil(rk.Batch(), rc.form.EngineForm, func() bool { return cachedRanks(t, c, rc.worker)[0] == 3 })
	x.expect("resumed: the batch missed is replayed", 3, 0)
	// A gap the replay repaired: the batch was not read live, so the pause did stop the reading.
	x.expectZMQ("kvrouterd_zmq_gaps_total", 0, 1, "outcome", "recovered")
	expect(d, "/test/resume_listener", rank0, http.StatusConflict, "instance 7 dp_rank 0 cannot be resumed from status")

	expect(d, "/test/pause_listener", `{"instance_id": 99}`, http.StatusNotFound, `"error":"instance 99 not found"`)
	expect(d, "/test/resume_listener", `{"instance_id": 7, "dp_rank": 5}`, http.StatusNotFound, `"error":"instance 7 dp_rank 5 not found"`)
	expect(d, "/test/pause_listener", `{"dp_rank": 0}`, http.StatusUnprocessableEntity, "missing field `instance_id`")

	off := startDaemon(t, bin, "--nats-listen", freeport.TB(t), "--data-dir", t.TempDir(), "--no-snapshots")
	defer func() { off.cmd.Process.Kill(); off.cmd.Wait() }()
	expect(off, "/test/pause_listener", rank0, http.StatusNotFound, "no endpoint")
}

// httpGetStatus GETs path of the daemon at addr.
func httpGetStatus(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
