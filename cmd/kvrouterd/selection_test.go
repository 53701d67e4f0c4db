package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestSelectionConfig: the selection service's flags, their variables and defaults, and
// Dynamo's name for the cache TTL.
func TestSelectionConfig(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	d, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil || d.SelectionAddr != "" || d.SelectionCacheTTL != 120*time.Second || d.SelectionCacheMaxEntries != 4096 {
		t.Fatalf("defaults: off, Dynamo's 120 s and 4096: %q %v %d %v", d.SelectionAddr, d.SelectionCacheTTL, d.SelectionCacheMaxEntries, err)
	}
	c, err := parseConfig([]string{"--selection-cache-ttl-secs", "30"}, env(map[string]string{
		"KVR_SELECTION_ADDR": ":8092", "KVR_SELECTION_CACHE_MAX_ENTRIES": "10"}), io.Discard)
	if err != nil || c.SelectionAddr != ":8092" || c.SelectionCacheTTL != 30*time.Second || c.SelectionCacheMaxEntries != 10 {
		t.Fatalf("KVR_SELECTION_ADDR, KVR_SELECTION_CACHE_MAX_ENTRIES, --selection-cache-ttl-secs: %+v %v", c, err)
	}
	for _, args := range [][]string{{"--selection-cache-ttl", "0s"}, {"--selection-cache-max-entries", "0"}} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Fatalf("%v: %v, want it refused naming the flag", args, err)
		}
	}
}

// TestDaemonSelection runs the daemon with --selection-addr and drives Dynamo's selection
// service through real sockets: a worker of two data-parallel ranks registered into its catalog
// with a PUB socket per rank, whose events reach the index; a request selected and reserved
// where its prefix is cached; a reservation replayed from /select; the native API's bookings
// and the selection service's in one load; each reservation's life to its end; the worker
// deleted; and a clean exit on SIGTERM.
func TestDaemonSelection(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	sel := freeport.TB(t)
	// Dynamo's v1 cost, whose choices the reservations below are written for: the default cost
	// would send the second 2-token prefill to the idle rank rather than queue it.
	d := startDaemon(t, buildDaemon(t), "--nats-listen", freeport.TB(t), "--data-dir", t.TempDir(), "--selection-addr", sel, "--router-cost", "v1")
	defer func() { d.cmd.Process.Kill() }()
	call := func(method, path, body string, code int) string {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+sel+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", method, path, err, d.log())
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != code {
			t.Fatalf("%s %s %.300s: %s %s, want %d", method, path, body, resp.Status, out, code)
		}
		return string(out)
	}
	call("GET", "/health", "", 200)
	call("GET", "/ready", "", 503)

	eng := enginetest.Start(t, enginetest.Options{Ranks: 2})
	worker := fmt.Sprintf(`{"worker_id":7,"model_name":"m","endpoint":"http://engine-7:8000","block_size":4,"data_parallel_size":2,
		"kv_events_endpoints":{"0":%q,"1":%q},"max_num_batched_tokens":4096,"taints":[]}`, eng.Rank(0).Endpoint(), eng.Rank(1).Endpoint())
	if out := call("POST", "/workers", worker, 201); !strings.Contains(out, `"lifecycle":"schedulable"`) {
		t.Fatalf("POST /workers: %s", out)
	}
	call("GET", "/ready", "", 200)
	// Rank 1 caches the prompt's first two blocks, read from its own socket.
	cached := func() bool {
		v, _ := sampleText(scrape(d.addr), `kvrouterd_worker_load{dp_rank="1",kind="cached_blocks",model="m",worker="7"}`)
		return v == "2"
	}
	r1 := eng.Rank(1)
	r1.PublishUntil(r1.Batch(kvevent.Event{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{1, 2}, Tokens: tokenRun(0, 8)}),
		enginetest.VLLMArray.EngineForm, cached)

	// Select and reserve: rank 1, for its 8 cached tokens.
	var got struct {
		Worker  uint64 `json:"worker_id"`
		Rank    uint32 `json:"dp_rank"`
		Overlap struct {
			GPU int `json:"gpu"`
		} `json:"overlap"`
		Effective int    `json:"effective_prefill_tokens"`
		Endpoint  string `json:"endpoint"`
	}
	prompt, _ := json.Marshal(tokenRun(0, 10))
	out := call("POST", "/select_and_reserve", `{"selection_id":"r-1","model_name":"m","token_ids":`+string(prompt)+`,"unknown":true}`, 200)
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Worker != 7 || got.Rank != 1 || got.Overlap.GPU != 8 || got.Effective != 2 || got.Endpoint != "http://engine-7:8000" {
		t.Fatalf("/select_and_reserve: %s", out)
	}
	// Selected, then reserved from the cache of /select.
	call("POST", "/select", `{"selection_id":"r-2","model_name":"m","token_ids":`+string(prompt)+`}`, 200)
	call("POST", "/reservations", `{"selection_id":"r-2","model_name":"m"}`, 201)
	// A booking of the native API, on rank 0.
	c := client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second})
	var resp wire.RouteResponse
	if err := c.Route(&wire.RouteRequest{RequestID: "native", Model: "m", Tokens: tokenRun(100, 12), HasPinned: true, PinnedWorker: 7}, &resp); err != nil {
		t.Fatal(err)
	}
	// loads is /loads of model m by rank: prefill tokens, decode blocks, requests.
	loads := func() map[uint32][3]int64 {
		t.Helper()
		var ms []struct {
			Loads []struct {
				Rank     uint32 `json:"dp_rank"`
				Prefill  int64  `json:"potential_prefill_tokens"`
				Decode   int64  `json:"potential_decode_blocks"`
				Requests int64  `json:"active_requests"`
			} `json:"loads"`
		}
		if err := json.Unmarshal([]byte(call("GET", "/loads?model_name=m", "", 200)), &ms); err != nil || len(ms) != 1 {
			t.Fatalf("/loads: %v %+v", err, ms)
		}
		out := map[uint32][3]int64{}
		for _, l := range ms[0].Loads {
			out[l.Rank] = [3]int64{l.Prefill, l.Decode, l.Requests}
		}
		return out
	}
	if l := loads(); l[1] != [3]int64{2 + 2, 2, 2} || l[0] != [3]int64{12, 3, 1} {
		t.Fatalf("/loads with two reservations on rank 1 and a native booking on rank 0: %v", l)
	}
	if v := metricValue(t, scrape(d.addr), `kvrouterd_worker_load{dp_rank="1",kind="active_requests",model="m",worker="7"}`); v != 2 {
		t.Fatalf("the native metrics see %v requests on rank 1, want the 2 reservations", v)
	}

	// Each booking's life to its end, through both APIs.
	call("POST", "/reservations/r-1/prefill_complete", "", 200)
	call("POST", "/reservations/r-1/output_block", `{"decay_fraction":0.25}`, 200)
	call("DELETE", "/reservations/r-1", "", 200)
	call("DELETE", "/reservations/r-2", "", 200)
	call("DELETE", "/reservations/r-2", "", 404)
	if err := c.Complete("native"); err != nil {
		t.Fatal(err)
	}
	if l := loads(); l[0] != [3]int64{} || l[1] != [3]int64{} {
		t.Fatalf("/loads once every booking ended: %v", l)
	}
	if page := scrape(d.addr); !strings.Contains(page, `kvrouterd_selection_requests_total{code="200",method="POST",route="/select_and_reserve"} 1`) {
		t.Fatal("the selection service's requests are not counted in /metrics")
	}

	// The worker deleted: out of the catalog and of the index's workers.
	if out := call("DELETE", "/workers/7", "", 200); !strings.Contains(out, `"lifecycle":"unschedulable"`) {
		t.Fatalf("DELETE /workers/7: %s", out)
	}
	call("GET", "/ready", "", 503)
	if ws := daemonGet(t, d.addr, "/workers"); strings.Contains(ws, `"instance_id":7`) {
		t.Fatalf("the indexer's /workers still lists worker 7: %s", ws)
	}

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := exited(t, d); err != nil {
		t.Fatalf("exit: %v\n%s", err, d.log())
	}
}
