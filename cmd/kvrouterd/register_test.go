package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestDaemonRegistrationLimits runs the daemon, sends it registrations the snapshot format
// cannot hold, which it refuses naming the field, then one of 200,000 ranks followed at once by
// SIGTERM: the daemon exits, and its shutdown snapshot, which every earlier registration would
// have made fail, is written and restored by the next run with every accepted worker.
func TestDaemonRegistrationLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin, dir, natsAddr := buildDaemon(t), t.TempDir(), freeport.TB(t)
	args := func() []string { return []string{"--nats-listen", natsAddr, "--data-dir", dir} }
	d := startDaemon(t, bin, args()...)
	defer d.cmd.Process.Kill()
	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+d.addr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v\n%s", path, err, d.log())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	long := strings.Repeat("x", wire.MaxString+1)
	half := strings.Repeat("h", wire.MaxString/2)
	for _, c := range []struct{ path, body, field string }{
		{"/v1/workers", `{"worker_id":9,"model":"` + long + `"}`, "model"},
		{"/v1/workers", `{"worker_id":9,"model":"m","endpoint":"` + long + `"}`, "endpoint"},
		{"/v1/workers", `{"worker_id":9,"model":"m","replay_endpoint":"` + long + `"}`, "replay_endpoint"},
		{"/register", `{"instance_id":9,"model_name":"` + half + `","routing_group":"` + half + `","block_size":16}`, "routing_group"},
	} {
		if code, msg := post(c.path, c.body); code != 400 || !strings.Contains(msg, `"field":"`+c.field+`"`) {
			t.Fatalf("POST %s %.80s: %d %.300s, want 400 naming %q", c.path, c.body, code, msg, c.field)
		}
	}
	// A worker discovered from its events: one whose subject names a model too long is refused.
	pub, err := ingest.NewPublisher(natsAs(t, natsAddr, dir, "publisher.auth"), "")
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, 16)
	eb := wire.EngineBatch{Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 16, Hashes: []uint64{5}, Tokens: toks}}}
	payload := wire.AppendEngineBatch(nil, &eb, wire.EngineForm{MapBatch: true, MapEvents: true})
	for _, m := range []struct {
		model  string
		worker uint64
	}{{long, 7}, {"m", 8}} {
		if _, err := pub.Engine(t.Context(), m.model, m.worker, -1, 0, payload); err != nil {
			t.Fatal(err)
		}
	}
	// Both batches handled: worker 8 discovered, worker 7's batch counted as refused (the
	// metric, not the log, whose repeated warnings are rate-limited).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("worker 8 never discovered from its events, or worker 7's never refused:\n%s", d.log())
		}
		if strings.Contains(daemonGet(t, d.addr, "/v1/workers"), `"worker_id":8,`) &&
			sample(t, scrape(d.addr), `kvrouterd_stream_rejected_total{reason="invalid"}`) == 1 {
			break
		}
	}
	if strings.Contains(daemonGet(t, d.addr, "/v1/workers"), `"worker_id":7,`) {
		t.Fatalf("events naming a model of %d bytes registered their worker:\n%.3000s", len(long), d.log())
	}

	ranks := func(id, n int) string {
		var b strings.Builder
		fmt.Fprintf(&b, `{"worker_id":%d,"model":"m","dp_ranks":[`, id)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(i))
		}
		b.WriteString("]}")
		return b.String()
	}
	if code, msg := post("/v1/workers", ranks(1, wire.MaxSnapshotRanks)); code != 201 {
		t.Fatalf("%d ranks: %d %s", wire.MaxSnapshotRanks, code, msg)
	}
	if code, msg := post("/register", `{"instance_id":2,"model_name":"m","routing_group":"t","block_size":16,"dp_rank":3}`); code != 201 {
		t.Fatalf("/register: %d %s", code, msg)
	}

	// 200,000 ranks, and SIGTERM as soon as the request is written.
	conn, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	big := ranks(3, 200_000)
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := fmt.Fprintf(conn, "POST /v1/workers HTTP/1.1\r\nHost: kvrouterd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(big), big); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Shutdown finishes the request in flight: refused at the cap. (Had the signal come before
	// the server read it, the connection closes unanswered.)
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
		msg, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !strings.Contains(string(msg), `"field":"dp_ranks"`) {
			t.Fatalf("200,000 ranks: %d %.300s, want 400 naming dp_ranks", resp.StatusCode, msg)
		}
	} else {
		t.Logf("200,000 ranks: no answer (%v): the signal came first", err)
	}
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, d.log())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit 30 s after SIGTERM\n%s", d.log())
	}
	logs := d.log()
	if strings.Contains(logs, "snapshot failed") || !strings.Contains(logs, "snapshot written") {
		t.Fatalf("the shutdown snapshot was not written:\n%s", logs)
	}

	// The next run restores every accepted worker, and nothing refused.
	d = startDaemon(t, bin, args()...)
	defer d.cmd.Process.Kill()
	if !strings.Contains(d.log(), "restored snapshot") {
		t.Fatalf("no snapshot restored:\n%s", d.log())
	}
	var list struct {
		Workers []struct {
			ID    uint64 `json:"worker_id"`
			Rank  uint32 `json:"dp_rank"`
			Model string `json:"model"`
		} `json:"workers"`
	}
	body := daemonGet(t, d.addr, "/v1/workers")
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("%v: %.300s", err, body)
	}
	perWorker := map[string]int{}
	for _, w := range list.Workers {
		perWorker[fmt.Sprintf("%d %s", w.ID, w.Model)]++
	}
	want := map[string]int{"1 m": wire.MaxSnapshotRanks, "2 m@t": 1, "8 m": 1}
	if fmt.Sprint(perWorker) != fmt.Sprint(want) {
		t.Fatalf("restored ranks per worker %v, want %v", perWorker, want)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("second run's exit: %v\n%s", err, d.log())
	}
}

// daemonGet sends GET path to the daemon at addr and returns the body.
func daemonGet(t *testing.T, addr, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %.300s", path, resp.Status, b)
	}
	return string(b)
}
