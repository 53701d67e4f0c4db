package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// stClient talks to a slot tracker served on a real socket, as Dynamo's tests do (JSON bodies,
// Content-Type application/json).
type stClient struct {
	t    *testing.T
	base string
}

func newSlotTrackerClient(t *testing.T, h *harness) stClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.s.ServeSlotTracker(ln) }()
	return stClient{t: t, base: "http://" + ln.Addr().String()}
}

func (c stClient) do(method, path, body string) (int, string) {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// post checks the status and returns the body.
func (c stClient) post(path, body string, want int) string {
	c.t.Helper()
	code, got := c.do("POST", path, body)
	if code != want {
		c.t.Fatalf("POST %s %s: %d %s, want %d", path, body, code, got, want)
	}
	return got
}

// loads returns GET /loads?model_name=m by (worker, rank).
func (c stClient) loads(model string) map[[2]uint64]stLoad {
	c.t.Helper()
	code, body := c.do("GET", "/loads?model_name="+model, "")
	if code != 200 {
		c.t.Fatalf("loads: %d %s", code, body)
	}
	var list []stLoad
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		c.t.Fatalf("loads %s: %v", body, err)
	}
	out := map[[2]uint64]stLoad{}
	for _, l := range list {
		out[[2]uint64{l.WorkerID, uint64(l.DPRank)}] = l
	}
	return out
}

func wantJSONError(t *testing.T, body, contains string) {
	t.Helper()
	var e struct {
		Error *string `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil || !strings.Contains(*e.Error, contains) {
		t.Errorf("want an error containing %q, got %s", contains, body)
	}
}

// TestSlotTrackerSharedPrefix is Dynamo's test_shared_prefix_accounting_and_unregister
// (tests/router/test_standalone_slot_tracker.py) against kvrouterd: the same bodies, statuses
// and counts, and the loads are the Router's own (a /v1/route booking shows in them too).
func TestSlotTrackerSharedPrefix(t *testing.T) {
	h := newHarness(t)
	c := newSlotTrackerClient(t, h)
	for _, reg := range []string{
		`{"worker_id":7,"model_name":"llama-3-8b","block_size":16,"dp_start":0,"dp_size":2}`,
		`{"worker_id":8,"model_name":"llama-3-8b","block_size":16,"dp_start":0,"dp_size":1}`,
	} {
		if got := c.post("/register", reg, 201); got != `{"status":"ok"}` {
			t.Fatalf("register: %s", got)
		}
	}
	for _, add := range []string{
		`{"model_name":"llama-3-8b","request_id":"req-a","worker_id":7,"dp_rank":0,"sequence_hashes":[11,-22,33]}`,
		`{"model_name":"llama-3-8b","request_id":"req-b","worker_id":7,"dp_rank":0,"sequence_hashes":[11,-22,44]}`,
		`{"model_name":"llama-3-8b","request_id":"req-c","worker_id":7,"dp_rank":1,"sequence_hashes":[11,-22,55]}`,
	} {
		c.post("/add", add, 201)
	}
	l := c.loads("llama-3-8b")
	if l[[2]uint64{7, 0}].ActiveBlocks != 4 || l[[2]uint64{7, 1}].ActiveBlocks != 3 || l[[2]uint64{8, 0}].ActiveBlocks != 0 {
		t.Fatalf("loads: %+v", l)
	}
	// The Router books them as its own requests: its worker listing says so.
	for _, w := range h.r.Workers() {
		if w.ID == 7 && w.Rank == 0 && (w.ActiveBlocks != 4 || w.ActiveRequests != 2) {
			t.Errorf("the router's load of 7/0: %+v", w)
		}
	}
	got := c.post("/potential_loads", `{"model_name":"llama-3-8b","sequence_hashes":[11,-22,33,66]}`, 200)
	var pot []selPotentialLoad
	if err := json.Unmarshal([]byte(got), &pot); err != nil {
		t.Fatal(err)
	}
	byRank := map[[2]uint64]int64{}
	for _, p := range pot {
		byRank[[2]uint64{p.WorkerID, uint64(p.DPRank)}] = p.PotentialDecodeBlocks
	}
	if want := map[[2]uint64]int64{{7, 0}: 5, {7, 1}: 5, {8, 0}: 4}; len(byRank) != 3 || byRank[[2]uint64{7, 0}] != 5 || byRank[[2]uint64{7, 1}] != 5 || byRank[[2]uint64{8, 0}] != 4 {
		t.Fatalf("potential_decode_blocks %v, want %v (%s)", byRank, want, got)
	}
	c.post("/free", `{"model_name":"llama-3-8b","request_id":"req-b"}`, 200)
	if l := c.loads("llama-3-8b"); l[[2]uint64{7, 0}].ActiveBlocks != 3 {
		t.Fatalf("after free: %+v", l)
	}
	c.post("/unregister", `{"worker_id":7,"model_name":"llama-3-8b"}`, 200)
	if _, body := c.do("GET", "/loads?model_name=llama-3-8b", ""); body != `[{"model_name":"llama-3-8b","routing_group":"default","worker_id":8,"dp_rank":0,"active_prefill_tokens":0,"active_decode_blocks":0}]` {
		t.Fatalf("loads after unregister: %s", body)
	}
	stale := c.post("/add", `{"model_name":"llama-3-8b","request_id":"stale-selection","worker_id":7,"dp_rank":0,"sequence_hashes":[]}`, 404)
	wantJSONError(t, stale, "Worker WorkerWithDpRank { worker_id: 7, dp_rank: 0 } not found")
	if _, ok := h.r.WorkerModel(7); ok {
		t.Error("worker 7, registered by the slot tracker, is still the router's after /unregister")
	}
}

// TestSlotTrackerPrefillLifecycle is Dynamo's test_prefill_lifecycle_updates_both_load_dimensions.
func TestSlotTrackerPrefillLifecycle(t *testing.T) {
	h := newHarness(t)
	c := newSlotTrackerClient(t, h)
	c.post("/register", `{"worker_id":4,"model_name":"llama-3-8b","block_size":16,"dp_start":0,"dp_size":1}`, 201)
	c.post("/add", `{"model_name":"llama-3-8b","request_id":"req-a","worker_id":4,"dp_rank":0,"sequence_hashes":[1,2],"new_isl_tokens":48}`, 201)
	c.post("/add", `{"model_name":"llama-3-8b","request_id":"req-b","worker_id":4,"dp_rank":0,"sequence_hashes":[1,3],"new_isl_tokens":16}`, 201)
	want := stLoad{Model: "llama-3-8b", Group: "default", WorkerID: 4, ActivePrefill: 64, ActiveBlocks: 3}
	if got := c.loads("llama-3-8b")[[2]uint64{4, 0}]; got != want {
		t.Fatalf("loads %+v, want %+v", got, want)
	}
	for range 2 {
		c.post("/prefill_complete", `{"model_name":"llama-3-8b","request_id":"req-a"}`, 200)
	}
	if got := c.loads("llama-3-8b")[[2]uint64{4, 0}]; got.ActivePrefill != 16 || got.ActiveBlocks != 3 {
		t.Fatalf("after prefill_complete: %+v", got)
	}
	c.post("/free", `{"model_name":"llama-3-8b","request_id":"req-b"}`, 200)
	if got := c.loads("llama-3-8b")[[2]uint64{4, 0}]; got.ActivePrefill != 0 || got.ActiveBlocks != 2 {
		t.Fatalf("after free: %+v", got)
	}
	for range 2 {
		c.post("/free", `{"model_name":"llama-3-8b","request_id":"req-a"}`, 200)
	}
	if got := c.loads("llama-3-8b")[[2]uint64{4, 0}]; got.ActiveBlocks != 0 {
		t.Fatalf("after the last free: %+v", got)
	}
	wantJSONError(t, c.post("/prefill_complete", `{"model_name":"llama-3-8b","request_id":"nope"}`, 404), "Request nope not found")
	// Dynamo's registry tests: a duplicate request id is 409, an unknown rank 404.
	c.post("/add", `{"model_name":"llama-3-8b","request_id":"dup","worker_id":4,"dp_rank":0,"sequence_hashes":[9]}`, 201)
	wantJSONError(t, c.post("/add", `{"model_name":"llama-3-8b","request_id":"dup","worker_id":4,"dp_rank":0,"sequence_hashes":[9]}`, 409),
		"Request dup already exists (assigned to worker WorkerWithDpRank { worker_id: 4, dp_rank: 0 })")
	wantJSONError(t, c.post("/add", `{"model_name":"llama-3-8b","request_id":"r","worker_id":4,"dp_rank":1,"sequence_hashes":[9]}`, 404),
		"Worker WorkerWithDpRank { worker_id: 4, dp_rank: 1 } not found")
}

// TestSlotTrackerReregister is Dynamo's test_unregister_then_register_starts_fresh.
func TestSlotTrackerReregister(t *testing.T) {
	h := newHarness(t)
	c := newSlotTrackerClient(t, h)
	reg := `{"worker_id":9,"model_name":"llama-3-8b","block_size":16,"dp_start":0,"dp_size":2}`
	c.post("/register", reg, 201)
	c.post("/add", `{"model_name":"llama-3-8b","request_id":"reused-request-id","worker_id":9,"dp_rank":0,"sequence_hashes":[101,102]}`, 201)
	c.post("/unregister", `{"worker_id":9,"model_name":"llama-3-8b"}`, 200)
	if got := c.loads("llama-3-8b"); len(got) != 0 {
		t.Fatalf("loads after unregister: %+v", got)
	}
	wantJSONError(t, c.post("/potential_loads", `{"model_name":"llama-3-8b","sequence_hashes":[101]}`, 404),
		"no slot tracker for model=llama-3-8b routing_group=default")
	// Dynamo re-registers at block size 32 here. kvrouterd's index of a model keeps its block
	// size once made, so another one is refused (docs/dynamo.md, "Slot tracker"); the fresh
	// start at other ranks is the same.
	wantJSONError(t, c.post("/register", `{"worker_id":9,"model_name":"llama-3-8b","block_size":32,"dp_start":2,"dp_size":2}`, 409),
		`model "llama-3-8b" has block size 16, not 32`)
	c.post("/register", `{"worker_id":9,"model_name":"llama-3-8b","block_size":16,"dp_start":2,"dp_size":2}`, 201)
	c.post("/add", `{"model_name":"llama-3-8b","request_id":"reused-request-id","worker_id":9,"dp_rank":2,"sequence_hashes":[201]}`, 201)
	l := c.loads("llama-3-8b")
	if l[[2]uint64{9, 2}].ActiveBlocks != 1 || l[[2]uint64{9, 3}].ActiveBlocks != 0 || len(l) != 2 {
		t.Fatalf("loads: %+v", l)
	}
}

// TestSlotTrackerRefusals: Dynamo's statuses and messages for bad registrations and bodies, the
// JSON error of an unknown route and method, /health's empty 200, /workers sorted, and signed
// hashes taken bit for bit (Dynamo's server.rs tests).
func TestSlotTrackerRefusals(t *testing.T) {
	h := newHarness(t)
	c := newSlotTrackerClient(t, h)
	for _, x := range []struct {
		body string
		code int
		msg  string
	}{
		{`{`, 400, "Failed to parse the request body as JSON"},
		{`{"worker_id":1,"model_name":"m","block_size":16,"dp_start":0}`, 422, "missing field `dp_size`"},
		{`{"worker_id":1,"model_name":"m","block_size":0,"dp_start":0,"dp_size":1}`, 400, "block_size must be greater than 0"},
		{`{"worker_id":1,"model_name":"m","block_size":16,"dp_start":0,"dp_size":0}`, 400, "dp_size must be greater than 0"},
		{`{"worker_id":1,"model_name":"m","block_size":16,"dp_start":4294967295,"dp_size":2}`, 400, "dp range overflows u32: start=4294967295 size=2"},
		{`{"worker_id":1,"model_name":"m","block_size":16,"dp_start":0,"dp_size":1}`, 201, ""},
		{`{"worker_id":1,"model_name":"m","block_size":16,"dp_start":3,"dp_size":1}`, 409, "worker 1 already registered for model=m routing_group=default"},
		{`{"worker_id":2,"model_name":"m","block_size":32,"dp_start":0,"dp_size":1}`, 409, "block_size mismatch for model=m routing_group=default: existing=16, requested=32"},
		{`{"worker_id":2,"model_name":"m","routing_group":"g","block_size":16,"dp_start":0,"dp_size":1}`, 201, ""},
	} {
		got := c.post("/register", x.body, x.code)
		if x.msg != "" {
			wantJSONError(t, got, x.msg)
		}
	}
	if code, body := c.do("POST", "/register", "x"); code != 400 {
		t.Errorf("a body that is not JSON: %d %s", code, body)
	}
	req, _ := http.NewRequest("POST", c.base+"/add", bytes.NewReader([]byte(`{}`)))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 415 {
		t.Errorf("no Content-Type: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	wantJSONError(t, c.post("/unregister", `{"worker_id":3,"model_name":"m"}`, 404), "worker 3 not found for model=m routing_group=default")
	wantJSONError(t, c.post("/free", `{"model_name":"x","request_id":"r"}`, 404), "no slot tracker for model=x routing_group=default")
	if code, body := c.do("GET", "/missing", ""); code != 404 || body != `{"error":"route not found"}` {
		t.Errorf("unknown route: %d %s", code, body)
	}
	if code, body := c.do("GET", "/register", ""); code != 405 || body != `{"error":"method not allowed"}` {
		t.Errorf("wrong method: %d %s", code, body)
	}
	if code, body := c.do("GET", "/health", ""); code != 200 || body != "" {
		t.Errorf("health: %d %q", code, body)
	}
	if _, body := c.do("GET", "/workers", ""); body != `[{"worker_id":1,"model_name":"m","routing_group":"default","block_size":16,"dp_start":0,"dp_size":1},`+
		`{"worker_id":2,"model_name":"m","routing_group":"g","block_size":16,"dp_start":0,"dp_size":1}]` {
		t.Errorf("workers: %s", body)
	}
	if _, body := c.do("GET", "/workers?routing_group=g", ""); !strings.Contains(body, `"worker_id":2`) || strings.Contains(body, `"worker_id":1`) {
		t.Errorf("workers of group g: %s", body)
	}
	// Signed hashes are the u64 they stand for: -1 and 18446744073709551615 are one block.
	c.post("/add", `{"model_name":"m","request_id":"req","worker_id":1,"dp_rank":0,"sequence_hashes":[-1],"new_isl_tokens":4}`, 201)
	got := c.post("/potential_loads", `{"model_name":"m","sequence_hashes":[-1],"new_isl_tokens":0}`, 200)
	if !strings.Contains(got, `"potential_prefill_tokens":4,"potential_decode_blocks":1`) {
		t.Errorf("potential_loads: %s", got)
	}
	if code, body := c.do("GET", "/replica_sync/peers", ""); code != 200 || body != "[]" {
		t.Errorf("replica_sync/peers: %d %s", code, body)
	}
}

// TestSlotTrackerAdoptsWorker: a worker the Router has already (here registered by the indexer
// API, with KV events) is adopted, the slot tracker's requests count in the Router's scoring,
// and its /unregister leaves the worker routable with its cached blocks.
func TestSlotTrackerAdoptsWorker(t *testing.T) {
	h := newHarness(t)
	c := newSlotTrackerClient(t, h)
	if code, resp := h.post("/register", "", []byte(`{"instance_id":5,"model_name":"m","block_size":4}`)); code != 201 {
		t.Fatalf("indexer register: %d %s", code, resp)
	}
	if res, err := h.c.Events(&wire.EventBatch{Worker: 5, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{1}, Tokens: tokens(0, 4)}}}); err != nil || res.OK != 1 {
		t.Fatalf("events: %+v %v", res, err)
	}
	c.post("/register", `{"worker_id":5,"model_name":"m","block_size":4,"dp_start":0,"dp_size":2}`, 201)
	if !h.r.HasRank(5, 1) {
		t.Fatal("rank 1 not added to the router's worker")
	}
	c.post("/add", `{"model_name":"m","request_id":"a","worker_id":5,"dp_rank":0,"sequence_hashes":[7,8,9],"new_isl_tokens":12}`, 201)
	for _, w := range h.r.Workers() {
		if w.ID == 5 && w.Rank == 0 && (w.ActiveBlocks != 3 || w.ActivePrefill != 12) {
			t.Errorf("router load: %+v", w)
		}
	}
	c.post("/unregister", `{"worker_id":5,"model_name":"m"}`, 200)
	if !h.r.HasRank(5, 0) || h.r.HasRank(5, 1) {
		t.Error("want rank 0 kept and the added rank 1 gone")
	}
	for _, w := range h.r.Workers() {
		if w.ID == 5 && (w.ActiveBlocks != 0 || w.CachedBlocks != 1) {
			t.Errorf("after unregister: %+v", w)
		}
	}
}
