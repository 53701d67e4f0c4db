package server

import (
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// selHarness is a harness whose Server also serves the selection service, on a listener of
// its own.
type selHarness struct {
	*harness
	sc *fasthttp.Client
}

func newSelHarness(t *testing.T) *selHarness {
	t.Helper()
	h := newHarness(t)
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = h.s.ServeSelection(ln) }()
	return &selHarness{harness: h, sc: &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}}
}

// do sends a request to the selection listener, with a JSON content type when body is not
// empty, and returns the status and body.
func (h *selHarness) do(method, path, body string) (int, string) {
	h.t.Helper()
	ct := ""
	if body != "" {
		ct = "application/json"
	}
	return h.doCT(method, path, ct, body)
}

func (h *selHarness) doCT(method, path, ct, body string) (int, string) {
	h.t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://selection" + path)
	req.Header.SetMethod(method)
	if ct != "" {
		req.Header.SetContentType(ct)
	}
	req.SetBodyString(body)
	if err := h.sc.DoTimeout(req, resp, 5*time.Second); err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode(), string(resp.Body())
}

// want sends a request and checks its status and that its body holds each of wants.
func (h *selHarness) want(method, path, body string, code int, wants ...string) string {
	h.t.Helper()
	got, out := h.do(method, path, body)
	if got != code {
		h.t.Fatalf("%s %s %.200s: %d %s, want %d", method, path, body, got, out, code)
	}
	for _, w := range wants {
		if !strings.Contains(out, w) {
			h.t.Fatalf("%s %s %.200s: %d %s, want it to hold %s", method, path, body, got, out, w)
		}
	}
	return out
}

// wantError checks a refusal: status and exactly Dynamo's {"error": msg}.
func (h *selHarness) wantError(method, path, body string, code int, msg string) {
	h.t.Helper()
	got, out := h.do(method, path, body)
	var e map[string]any
	if err := json.Unmarshal([]byte(out), &e); err != nil || got != code || len(e) != 1 || e["error"] != msg {
		h.t.Fatalf("%s %s %.200s: %d %s, want %d {\"error\":%q}", method, path, body, got, out, code, msg)
	}
}

// decode sends a request that must answer code, and decodes its JSON body into v.
func (h *selHarness) decode(method, path, body string, code int, v any) {
	h.t.Helper()
	out := h.want(method, path, body, code)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		h.t.Fatalf("%s %s: %v: %s", method, path, err, out)
	}
}

type load struct {
	Worker   uint64 `json:"worker_id"`
	Rank     uint32 `json:"dp_rank"`
	Prefill  int64  `json:"potential_prefill_tokens"`
	Decode   int64  `json:"potential_decode_blocks"`
	Requests int64  `json:"active_requests"`
}

// loads returns /loads of model "model" by (worker, rank).
func (h *selHarness) loads() map[[2]uint64]load {
	h.t.Helper()
	var out []struct {
		Model, Group string
		Loads        []load `json:"loads"`
		Pending      *int   `json:"pending_count"`
		PendingISL   *int   `json:"pending_isl_tokens"`
	}
	h.decode("GET", "/loads?model_name=model&routing_group=default", "", 200, &out)
	if len(out) != 1 || out[0].Pending == nil || out[0].PendingISL == nil {
		h.t.Fatalf("/loads: %+v", out)
	}
	m := map[[2]uint64]load{}
	for _, l := range out[0].Loads {
		m[[2]uint64{l.Worker, uint64(l.Rank)}] = l
	}
	return m
}

func (h *selHarness) wantLoad(worker uint64, rank uint32, prefill, decode, requests int64) {
	h.t.Helper()
	got := h.loads()[[2]uint64{worker, uint64(rank)}]
	if got.Prefill != prefill || got.Decode != decode || got.Requests != requests {
		h.t.Fatalf("/loads worker %d rank %d: %+v, want prefill %d, decode %d, requests %d", worker, rank, got, prefill, decode, requests)
	}
}

// storeModel stores toks's full blocks of 16 tokens on worker's rank of model "model".
func (h *selHarness) storeModel(worker uint64, rank uint32, id uint64, toks []uint32) {
	h.t.Helper()
	hashes := make([]uint64, len(toks)/16)
	for i := range hashes {
		hashes[i] = worker<<32 | uint64(rank)<<16 | uint64(i)
	}
	ev := kvevent.Event{Kind: kvevent.Stored, ID: id, Rank: rank, Hashes: hashes, Tokens: toks[:16*len(hashes)], BlockSize: 16}
	if res, err := h.c.Events(&wire.EventBatch{Worker: worker, Model: "model", Events: []kvevent.Event{ev}}); err != nil || res.OK != 1 {
		h.t.Fatalf("events of worker %d: %+v %v", worker, res, err)
	}
}

// rankEndpoints returns the router's ranks of worker id: their endpoints, and the model.
func rankEndpoints(r *router.Router, id uint64) (map[uint32]string, string) {
	out, model := map[uint32]string{}, ""
	for _, w := range r.Workers() {
		if w.ID == id {
			out[w.Rank], model = w.Endpoint+" "+w.Replay, w.Model
		}
	}
	return out, model
}

// Dynamo's WorkerRequest with every member (lib/kv-router services/selection types.rs), and one
// it does not have.
const worker1 = `{"worker_id":1,"model_name":"model","routing_group":"default","endpoint":"http://worker:8000",
	"kv_events_endpoint":"tcp://worker:5557","kv_events_endpoints":{},"replay_endpoint":"tcp://worker:5558","block_size":16,
	"data_parallel_start_rank":0,"data_parallel_size":1,"max_num_batched_tokens":8192,"total_kv_blocks":1000,
	"stable_routing_id":"worker-1","is_eagle":false,"taints":["a100"],"topology_domains":{"zone":"a"},
	"kv_transfer_domain":"nvl-1","kv_transfer_enforcement":"preferred","kv_transfer_preferred_weight":0.5,
	"router_hint_worker_type":"decode","router_hint_source_control_endpoints":{"0":"tcp://worker:5600"},
	"kv_event_source_mode":"framework_v1","tenant_id":"ignored","future_field":{"x":1}}`

// worker2 has two data-parallel ranks, each publishing on a socket of its own.
const worker2 = `{"worker_id":2,"model_name":"model","endpoint":"http://worker2:8000","block_size":16,
	"data_parallel_size":2,"kv_events_endpoints":{"0":"tcp://worker2:6000","1":"tcp://worker2:7100"}}`

// TestSelectionLifecycle drives Dynamo's selection service through a request's whole life with
// Dynamo's bodies, every member included and unknown ones too: workers into the catalog, /ready,
// /select and its reservation replayed, /select_and_reserve, /loads, prefill_complete,
// output_block, the reservation freed, and /loads back to zero; and one booking model under the
// native API's and this one's: each sees the other's bookings.
func TestSelectionLifecycle(t *testing.T) {
	h := newSelHarness(t)
	h.want("GET", "/ready", "", 503, `"ready":false`, `"schedulable_workers":0`, `"workers":[]`)
	h.wantError("POST", "/select", `{"model_name":"model","token_ids":[1,2,3]}`, 503, "no schedulable workers are available")

	var rec map[string]any
	h.decode("POST", "/workers", worker1, 201, &rec)
	want := map[string]any{
		"worker_id": 1.0, "model_name": "model", "routing_group": "default", "lifecycle": "schedulable",
		"endpoint": "http://worker:8000", "kv_events_endpoint": "tcp://worker:5557", "replay_endpoint": "tcp://worker:5558",
		"block_size": 16.0, "data_parallel_start_rank": 0.0, "data_parallel_size": 1.0, "max_num_batched_tokens": 8192.0,
		"total_kv_blocks": 1000.0, "stable_routing_id": "worker-1", "is_eagle": false, "taints": []any{"a100"},
		"topology_domains": map[string]any{"zone": "a"}, "kv_transfer_domain": "nvl-1", "kv_transfer_enforcement": "preferred",
		"kv_transfer_preferred_weight": 0.5, "router_hint_worker_type": "decode",
		"router_hint_source_control_endpoints": map[string]any{"0": "tcp://worker:5600"}, "kv_event_source_mode": "framework_v1",
	}
	if !reflect.DeepEqual(rec, want) {
		t.Fatalf("POST /workers: %v\nwant %v", rec, want)
	}
	if eps, model := rankEndpoints(h.r, 1); model != "model" || !reflect.DeepEqual(eps, map[uint32]string{0: "tcp://worker:5557 tcp://worker:5558"}) {
		t.Fatalf("worker 1 in the router: %v, model %q", eps, model)
	}
	h.want("POST", "/workers", worker2, 201, `"lifecycle":"schedulable"`)
	if eps, _ := rankEndpoints(h.r, 2); !reflect.DeepEqual(eps, map[uint32]string{0: "tcp://worker2:6000 ", 1: "tcp://worker2:7100 "}) {
		t.Fatalf("worker 2's ranks in the router: %v", eps)
	}
	// Incomplete: answered 201 with the record all the same, null members present.
	h.decode("POST", "/workers", `{"worker_id":3,"model_name":"model"}`, 201, &rec)
	if rec["lifecycle"] != "incomplete" || rec["endpoint"] != nil || !reflect.DeepEqual(rec["not_schedulable_reasons"],
		[]any{"endpoint is required", "block_size must be greater than 0", "kv_events endpoint is required for dp_rank 0"}) {
		t.Fatalf("an incomplete worker: %v", rec)
	}
	if _, ok := rec["block_size"]; !ok {
		t.Fatalf("an unset member is left out, not null: %v", rec)
	}
	if _, model := rankEndpoints(h.r, 3); model != "" {
		t.Fatal("an incomplete worker is in the router")
	}
	var ready struct {
		Ready   bool `json:"ready"`
		N       int  `json:"schedulable_workers"`
		Workers []struct {
			ID        uint64 `json:"worker_id"`
			Lifecycle string `json:"lifecycle"`
		} `json:"workers"`
	}
	h.decode("GET", "/ready", "", 200, &ready)
	if !ready.Ready || ready.N != 2 || len(ready.Workers) != 3 || ready.Workers[0].ID != 1 || ready.Workers[2].Lifecycle != "incomplete" {
		t.Fatalf("/ready: %+v", ready)
	}

	// Worker 1 holds the prompt's first 4 blocks; the prompt is 70 tokens (4 blocks and 6).
	toks := tokens(0, 70)
	h.storeModel(1, 0, 1, toks)
	prompt, _ := json.Marshal(toks)
	var sel map[string]any
	h.decode("POST", "/select", `{"model_name":"model","routing_group":"default","selection_id":"sel-1","token_ids":`+string(prompt)+`,
		"mm_routing_info":null,"block_mm_infos":null,"lora_name":null,"cache_salt":null,"is_eagle":false,
		"router_config_override":{"track_prefill_tokens":true,"assume_kv_reuse":true},"expected_output_tokens":128,
		"priority_jump":0.0,"strict_priority":0,"session_id":"s-1","session_context":{"session_id":"s-1","session_final":false,"input_trigger":"tool_result","parent_session_id":null},
		"affinity_target":null,"pinned_worker":null,"allowed_worker_ids":[1,2],
		"routing_constraints":{"required_taints":["a100"],"preferred_taints":{"a100":1.0}},"advisory":true,"tenant_id":"ignored"}`, 200, &sel)
	wantSel := map[string]any{
		"selection_id": "sel-1", "model_name": "model", "routing_group": "default", "worker_id": 1.0, "dp_rank": 0.0,
		"endpoint": "http://worker:8000", "block_size": 16.0,
		"overlap":                  map[string]any{"longest_matched": 64.0, "gpu": 64.0, "dp": map[string]any{"0": 64.0}, "cpu": 64.0, "disk": 64.0},
		"effective_prefill_tokens": 6.0, "potential_decode_blocks": 4.0,
		"worker_load": map[string]any{"active_prefill_tokens": 0.0, "prefill_token_capacity": 8192.0, "total_kv_blocks": 1000.0},
	}
	if !reflect.DeepEqual(sel, wantSel) {
		t.Fatalf("/select: %v\nwant %v", sel, wantSel)
	}
	h.wantLoad(1, 0, 0, 0, 0) // /select books nothing

	// The reservation of what /select chose, replayed from its cache.
	h.want("POST", "/reservations", `{"selection_id":"sel-1","model_name":"model"}`, 201,
		`{"selection_id":"sel-1","model_name":"model","routing_group":"default","worker_id":1,"dp_rank":0,"endpoint":"http://worker:8000"}`)
	h.wantLoad(1, 0, 6, 4, 1)
	// A second replay: the entry is used (Dynamo's docs: "a repeat replay returns 404").
	h.wantError("POST", "/reservations", `{"selection_id":"sel-1","model_name":"model"}`, 404, "no pending selection sel-1 for model=model routing_group=default (expired, already used, or never selected)")

	// Select and reserve in one call, with Dynamo's example's selection id.
	out := h.want("POST", "/select_and_reserve", `{"selection_id":"select-123","model_name":"model","routing_group":"default",
		"token_ids":`+string(prompt)+`,"router_config_override":null,"priority_jump":1.5,"advisory":true}`, 200)
	var booked struct {
		Seqs []int64 `json:"sequence_hashes"`
	}
	if err := json.Unmarshal([]byte(out), &booked); err != nil {
		t.Fatal(err)
	}
	sel = nil
	if err := json.Unmarshal([]byte(out), &sel); err != nil {
		t.Fatal(err)
	}
	if sel["selection_id"] != "select-123" || sel["worker_id"] != 1.0 || sel["isl_tokens"] != 70.0 || sel["track_prefill_tokens"] != true ||
		sel["worker_load"] != nil || sel["effective_prefill_tokens"] != 6.0 {
		t.Fatalf("/select_and_reserve: %v", sel)
	}
	var hasher radix.Hasher
	seqs := hasher.AppendSequence(nil, toks, 16, radix.BaseSeed)
	if !slices.Equal(booked.Seqs, signed(seqs)) {
		t.Fatalf("sequence_hashes %v, want Dynamo's chain %v as i64", booked.Seqs, seqs)
	}
	h.wantLoad(1, 0, 12, 4, 2) // both bookings' uncached 6 tokens; their 4 blocks shared

	// One booking model: the native router sees the selection service's bookings, and the
	// selection service the native API's.
	var resp wire.RouteResponse
	if err := h.c.Match(&wire.RouteRequest{Model: "model", Tokens: toks}, &resp); err != nil {
		t.Fatal(err)
	}
	if c := resp.Candidates[0]; c.Worker != 1 || c.PrefillTokens != 12+6 {
		t.Fatalf("/v1/match after two reservations: worker 1 %+v, want 12 tokens booked + 6", c)
	}
	if err := h.c.Route(&wire.RouteRequest{RequestID: "native-1", Model: "model", Tokens: tokens(1000, 40), HasPinned: true, PinnedWorker: 2, PinnedRank: 1}, &resp); err != nil {
		t.Fatal(err)
	}
	h.wantLoad(2, 1, 40, 2, 1)
	h.wantError("POST", "/select_and_reserve", `{"selection_id":"native-1","model_name":"model","token_ids":[1]}`, 409,
		"selection native-1 is already reserved or being reserved")

	// The reservation's life: prefill done, output blocks, freed.
	h.want("POST", "/reservations/select-123/prefill_complete", "", 200, `{"status":"ok"}`)
	h.wantLoad(1, 0, 6, 4, 2)
	h.want("POST", "/reservations/select-123/output_block", `{"decay_fraction":0.5}`, 200, `{"status":"ok"}`)
	h.want("POST", "/reservations/select-123/output_block", `{}`, 200, `{"status":"ok"}`)
	h.want("POST", "/reservations/select-123/output_block", `{"decay_fraction":null}`, 200, `{"status":"ok"}`)
	// Three output blocks of its own (the prompt's 4 are shared with sel-1), the first weighed
	// 0.5 when it was added: 4 + 3 − 0.5 = 6.5, rounded half away from zero as Dynamo does: 7.
	h.wantLoad(1, 0, 6, 7, 2)
	h.wantError("POST", "/reservations/select-123/output_block", `{"decay_fraction":1.5}`, 400, "decay_fraction must be between 0.0 and 1.0")
	h.wantError("POST", "/reservations/select-123/output_block", `{"decay_fraction":-0.1}`, 400, "decay_fraction must be between 0.0 and 1.0")
	if code, _ := h.doCT("POST", "/reservations/select-123/output_block", "", `{}`); code != 415 {
		t.Fatalf("output_block without a JSON content type: %d, want 415", code)
	}
	h.wantError("POST", "/reservations/nope/output_block", `{}`, 404, "reservation nope not found")
	h.wantError("POST", "/reservations/nope/prefill_complete", "", 404, "reservation nope not found")
	h.want("DELETE", "/reservations/select-123", "", 200, `{"status":"ok"}`)
	h.wantError("DELETE", "/reservations/select-123", "", 404, "reservation select-123 not found")
	h.wantError("POST", "/reservations/select-123/prefill_complete", "", 404, "reservation select-123 not found")
	h.wantLoad(1, 0, 6, 4, 1)

	// The other two freed, one through each API: every load back to zero.
	h.want("DELETE", "/reservations/sel-1", "", 200)
	if code, body := h.post("/v1/requests/native-1/complete", "", nil); code != 204 {
		t.Fatalf("complete native-1: %d %s", code, body)
	}
	for k, l := range h.loads() {
		if l.Prefill != 0 || l.Decode != 0 || l.Requests != 0 {
			t.Fatalf("/loads after every reservation was freed: %v %+v", k, l)
		}
	}
	if n := h.r.Stats().ActiveRequests; n != 0 {
		t.Fatalf("%d requests still booked", n)
	}
}

// TestSelectionReservations: POST /reservations in both forms — the replay of a /select, and a
// booking on a named worker — with their refusals, and how the explicit form decides what it
// books.
func TestSelectionReservations(t *testing.T) {
	h := newSelHarness(t)
	h.want("POST", "/workers", worker1, 201, `"schedulable"`)
	h.want("POST", "/workers", worker2, 201, `"schedulable"`)
	toks := tokens(0, 70)
	h.storeModel(1, 0, 1, toks)
	prompt, _ := json.Marshal(toks)

	// Dynamo's example, as an explicit booking: sequence hashes and a length, nothing cached
	// known, the whole prompt to prefill.
	h.want("POST", "/reservations", `{"selection_id":"select-123","sequence_hashes":[21,22],"isl_tokens":512,"track_prefill_tokens":true,
		"model_name":"model","routing_group":"default","worker_id":1,"dp_rank":0,"expected_output_tokens":64,"router_config_override":null}`, 201,
		`{"selection_id":"select-123","model_name":"model","routing_group":"default","worker_id":1,"dp_rank":0,"endpoint":"http://worker:8000"}`)
	h.wantLoad(1, 0, 512, 2, 1)
	h.wantError("POST", "/reservations", `{"selection_id":"select-123","sequence_hashes":[1],"isl_tokens":5,"model_name":"model","worker_id":2}`, 409,
		"selection select-123 is already reserved or being reserved")
	// Tokens: the worker's cached prefix counts; effective_prefill_tokens replaces it.
	h.want("POST", "/reservations", `{"selection_id":"e1","model_name":"model","worker_id":1,"token_ids":`+string(prompt)+`}`, 201)
	h.wantLoad(1, 0, 512+6, 2+4, 2)
	h.want("POST", "/reservations", `{"selection_id":"e2","model_name":"model","worker_id":2,"dp_rank":1,"token_ids":`+string(prompt)+`,"effective_prefill_tokens":30}`, 201)
	h.wantLoad(2, 1, 30, 4, 1)
	h.wantError("POST", "/reservations", `{"selection_id":"e3","model_name":"model","worker_id":2,"token_ids":`+string(prompt)+`,"effective_prefill_tokens":71}`, 400,
		"effective_prefill_tokens (71) must not exceed isl_tokens (70)")
	// Checked before the worker is looked up, as Dynamo does.
	h.wantError("POST", "/reservations", `{"selection_id":"e3","model_name":"model","worker_id":99,"token_ids":`+string(prompt)+`,"effective_prefill_tokens":71}`, 400,
		"effective_prefill_tokens (71) must not exceed isl_tokens (70)")
	// Not tracked: by the request, or by the override when the request does not say.
	h.want("POST", "/reservations", `{"selection_id":"e4","model_name":"model","worker_id":2,"token_ids":`+string(prompt)+`,"track_prefill_tokens":false,"effective_prefill_tokens":30}`, 201)
	h.want("POST", "/reservations", `{"selection_id":"e5","model_name":"model","worker_id":2,"block_hashes":[1,2],"sequence_hashes":[1,2],"isl_tokens":40,
		"router_config_override":{"track_prefill_tokens":false}}`, 201)
	h.wantLoad(2, 0, 0, 4+2, 2)
	h.wantError("POST", "/reservations", `{"selection_id":"e6","model_name":"model","worker_id":9,"token_ids":[1]}`, 404,
		"schedulable worker 9 not found for model=model routing_group=default")
	h.wantError("POST", "/reservations", `{"selection_id":"e6","model_name":"model","worker_id":1,"dp_rank":1,"token_ids":[1]}`, 404,
		"schedulable worker 1 not found for model=model routing_group=default")
	h.wantError("POST", "/reservations", `{"selection_id":"e6","model_name":"model","worker_id":1,"isl_tokens":4}`, 400,
		"sequence_hashes is required without token_ids")
	h.wantError("POST", "/reservations", `{"model_name":"model","worker_id":1,"token_ids":[1]}`, 422,
		"Failed to deserialize the JSON body into the target type: missing field `selection_id`")

	// Replay: refused without a /select, or once its worker is not schedulable any more; an
	// explicit booking discards what /select remembered.
	h.wantError("POST", "/reservations", `{"selection_id":"never","model_name":"model"}`, 404,
		"no pending selection never for model=model routing_group=default (expired, already used, or never selected)")
	h.want("POST", "/select", `{"selection_id":"r1","model_name":"model","token_ids":`+string(prompt)+`}`, 200)
	h.want("POST", "/reservations", `{"selection_id":"r1","model_name":"model","worker_id":2,"token_ids":[5,6]}`, 201, `"worker_id":2`)
	h.want("DELETE", "/reservations/r1", "", 200)
	h.wantError("POST", "/reservations", `{"selection_id":"r1","model_name":"model"}`, 404,
		"no pending selection r1 for model=model routing_group=default (expired, already used, or never selected)")
	h.want("POST", "/select", `{"selection_id":"r2","model_name":"model","token_ids":`+string(prompt)+`,"pinned_worker":{"worker_id":1,"dp_rank":0}}`, 200, `"worker_id":1`)
	h.wantError("POST", "/reservations", `{"selection_id":"r2","model_name":"model","routing_group":"other"}`, 503,
		"no schedulable workers for model=model routing_group=other")
	h.want("DELETE", "/workers/1", "", 200, `"lifecycle":"unschedulable"`)
	h.wantError("POST", "/reservations", `{"selection_id":"r2","model_name":"model"}`, 404,
		"schedulable worker 1 (dp_rank 0) not found for model=model routing_group=default")
	// What worker 1 had booked left with it; worker 2's bookings stay.
	if l := h.loads(); len(l) != 2 || l[[2]uint64{2, 0}].Requests != 2 || l[[2]uint64{2, 1}].Requests != 1 {
		t.Fatalf("/loads after worker 1 left: %+v", l)
	}
}

// TestSelectionErrors: each refusal of Dynamo's selection service that applies to kvrouterd,
// with its status and message, in Dynamo's error shape.
func TestSelectionErrors(t *testing.T) {
	h := newSelHarness(t)
	h.want("POST", "/workers", worker1, 201)

	// Routes.
	for _, p := range []string{"/nope", "/select/", "/reservations/a/b", "/workers/1/x", "/metrics", "/v1/route"} {
		h.wantError("GET", p, "", 404, "route not found")
	}
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/select", "POST"}, {"PUT", "/workers", "GET,POST"}, {"POST", "/reservations/x", "DELETE"},
		{"GET", "/reservations/x/prefill_complete", "POST"}, {"GET", "/workers/1", "PATCH,DELETE"}, {"POST", "/loads", "GET"},
	} {
		h.wantError(c.method, c.path, "", 405, "method not allowed")
	}

	// Bodies: axum's Json rejections, wrapped.
	if code, out := h.doCT("POST", "/select", "text/plain", `{}`); code != 415 || out != `{"error":"Expected request with `+"`Content-Type: application/json`"+`"}`+"\n" {
		t.Fatalf("a body of another type: %d %s", code, out)
	}
	if code, _ := h.doCT("POST", "/select", "application/json; charset=utf-8", `{"model_name":"none","token_ids":[1]}`); code != 503 {
		t.Fatalf("application/json with a charset: %d, want it taken", code)
	}
	for _, c := range []struct {
		path, body, prefix string
		code               int
	}{
		{"/select", `{"model_name":`, "Failed to parse the request body as JSON: ", 400},
		{"/select", ``, "Failed to parse the request body as JSON: ", 400},
		{"/workers", `{"model_name":"model"}`, "Failed to deserialize the JSON body into the target type: missing field `worker_id`", 422},
		{"/workers", `{"worker_id":"1"}`, "Failed to deserialize the JSON body into the target type: ", 422},
		{"/workers", `{"worker_id":-1}`, "Failed to deserialize the JSON body into the target type: ", 422},
		{"/workers", `{"worker_id":5,"model_name":null}`, "Failed to deserialize the JSON body into the target type: model_name", 422},
		{"/workers", `{"worker_id":5,"kv_transfer_enforcement":"maybe"}`, "Failed to deserialize the JSON body into the target type: kv_transfer_enforcement: unknown variant `maybe`", 422},
		{"/select", `{"model_name":"model","block_hashes":[9223372036854775808]}`, "Failed to deserialize the JSON body into the target type: ", 422},
		{"/select", `{"model_name":"model","token_ids":[1],"pinned_worker":{"worker_id":1}}`, "Failed to deserialize the JSON body into the target type: ", 422},
		{"/replica_sync/register_peer", `{}`, "Failed to deserialize the JSON body into the target type: missing field `endpoint`", 422},
		// session_context is Dynamo's SelectionSessionContext: an enum's unknown value, a
		// missing session_id or a wrong type is serde's 422 on both routes.
		{"/select", `{"model_name":"model","token_ids":[1],"session_context":{"session_id":"s","input_trigger":"bogus"}}`,
			"Failed to deserialize the JSON body into the target type: session_context.input_trigger: unknown variant `bogus`, expected one of `user_message`, `tool_result`, `other`", 422},
		{"/select_and_reserve", `{"model_name":"model","selection_id":"x","token_ids":[1],"session_context":{"session_id":"s","input_trigger":"bogus"}}`,
			"Failed to deserialize the JSON body into the target type: session_context.input_trigger: unknown variant `bogus`", 422},
		{"/select", `{"model_name":"model","token_ids":[1],"session_context":{"input_trigger":"other"}}`,
			"Failed to deserialize the JSON body into the target type: session_context: missing field `session_id`", 422},
		{"/select", `{"model_name":"model","token_ids":[1],"session_context":{"session_id":"s","session_final":"yes"}}`,
			"Failed to deserialize the JSON body into the target type: ", 422},
	} {
		code, out := h.doCT("POST", c.path, "application/json", c.body)
		var e map[string]string
		if json.Unmarshal([]byte(out), &e) != nil || code != c.code || !strings.HasPrefix(e["error"], c.prefix) {
			t.Fatalf("POST %s %s: %d %s, want %d %q…", c.path, c.body, code, out, c.code, c.prefix)
		}
	}
	if ws := h.s.sel.records("", ""); len(ws) != 1 {
		t.Fatalf("refused upserts changed the catalog: %+v", ws)
	}

	// Prompts.
	sel := func(members string) string { return `{"model_name":"model",` + members + `}` }
	h.wantError("POST", "/select", sel(`"lora_name":"x"`), 400, "block_hashes is required without token_ids")
	h.wantError("POST", "/select", sel(`"block_hashes":[1]`), 400, "sequence_hashes is required without token_ids")
	h.wantError("POST", "/select", sel(`"block_hashes":[1],"sequence_hashes":[1]`), 400, "isl_tokens is required without token_ids")
	h.wantError("POST", "/select", sel(`"block_hashes":[1],"sequence_hashes":[1],"isl_tokens":0`), 400, "isl_tokens must be greater than 0")
	h.wantError("POST", "/select", sel(`"block_hashes":[1,2],"sequence_hashes":[1],"isl_tokens":32`), 400, "block_hashes length 2 must match sequence_hashes length 1")
	h.wantError("POST", "/select", sel(`"token_ids":[]`), 400, "isl_tokens must be greater than 0")
	h.want("POST", "/select", sel(`"block_hashes":[-3803038269031200164],"sequence_hashes":[1],"isl_tokens":20`), 200, `"worker_id":1`)

	// Partitions and eligibility.
	h.wantError("POST", "/select", `{"model_name":"other","token_ids":[1]}`, 503, "no schedulable workers for model=other routing_group=default")
	h.wantError("POST", "/select", `{"model_name":"model","routing_group":"b","token_ids":[1]}`, 503, "no schedulable workers for model=model routing_group=b")
	h.wantError("POST", "/select", sel(`"token_ids":[1],"allowed_worker_ids":[7]`), 503, "all eligible workers were rejected by policy filters")
	h.wantError("POST", "/select", sel(`"token_ids":[1],"routing_constraints":{"required_taints":["h100"]}`), 503, "all eligible workers were rejected by policy filters")
	h.wantError("POST", "/select", sel(`"token_ids":[1],"allowed_worker_ids":[7],"pinned_worker":{"worker_id":1,"dp_rank":0}`), 400, "pinned worker 1 is not in allowed worker set")
	h.wantError("POST", "/select", sel(`"token_ids":[1],"pinned_worker":{"worker_id":1,"dp_rank":3}`), 404, "schedulable worker 1 (dp_rank 3) not found for model=model routing_group=default")
	h.want("POST", "/select", sel(`"token_ids":[1],"pinned_worker":{"worker_id":1,"dp_rank":0}`), 200, `"worker_id":1`)
	h.want("POST", "/select_and_reserve", sel(`"token_ids":[1],"router_config_override":{"router_temperature":0.5,"overlap_score_weight":2}`), 200, `"selection_id":"`)
	h.wantError("POST", "/select", sel(`"token_ids":[1],"router_config_override":{"router_temperature":-1}`), 400, `field "router_temperature": -1 is not a finite number ≥ 0`)

	// Workers.
	h.wantError("PATCH", "/workers/abc", `{}`, 400, "Invalid URL: Cannot parse `abc` to a `u64`")
	h.wantError("PATCH", "/workers/99", `{}`, 404, "worker 99 not found")
	h.wantError("DELETE", "/workers/99", "", 404, "worker 99 not found")

	// Replica sync: kvrouterd's replicas share bookings over NATS, never Dynamo's way.
	h.wantError("POST", "/replica_sync/register_peer", `{"endpoint":"tcp://peer:5000"}`, 409, "replica sync is disabled")
	h.wantError("POST", "/replica_sync/deregister_peer", `{"endpoint":"tcp://peer:5000"}`, 409, "replica sync is disabled")
	h.want("GET", "/replica_sync/peers", "", 200, "[]")

	// /health, and /dump as the indexer's.
	h.want("GET", "/health", "", 200, `{"status":"ok"}`)
	h.storeModel(1, 0, 1, tokens(0, 32))
	_, dump := h.do("GET", "/dump", "")
	if code, idx := h.get("/dump"); code != 200 || idx != dump || !strings.Contains(dump, `"model:default"`) {
		t.Fatalf("/dump: %s\nthe indexer's: %d %s", dump, code, idx)
	}

	// Reconciliation refusals: the worker is incomplete, with Dynamo's reasons.
	reasons := func(body string, want ...string) {
		t.Helper()
		var rec struct {
			Lifecycle string   `json:"lifecycle"`
			Reasons   []string `json:"not_schedulable_reasons"`
		}
		h.decode("POST", "/workers", body, 201, &rec)
		if rec.Lifecycle != "incomplete" || !slices.Equal(rec.Reasons, want) {
			t.Fatalf("POST /workers %s: %+v, want incomplete for %q", body, rec, want)
		}
	}
	w := func(members string) string {
		return `{"worker_id":4,"model_name":"model","endpoint":"http://w4:8000","block_size":16,` + members + `}`
	}
	reasons(w(`"kv_events_endpoint":"tcp://w4:1","block_size":32`), "reconciliation failed: block_size mismatch for model=model routing_group=default: existing=16 requested=32")
	reasons(w(`"kv_events_endpoint":"tcp://w4:1","is_eagle":true`), "reconciliation failed: is_eagle mismatch for model=model routing_group=default: existing=false requested=true")
	reasons(w(`"kv_events_endpoint":"tcp://w4"`), "reconciliation failed: invalid kv_events endpoint for worker 4 dp_rank 0: invalid ZMQ endpoint `tcp://w4`: missing TCP port")
	reasons(w(`"kv_events_endpoint":"tcp://w4:1","replay_endpoint":"w4:2"`), "reconciliation failed: invalid replay endpoint for worker 4: invalid ZMQ endpoint `w4:2`: missing scheme")
	reasons(w(`"kv_events_endpoints":{"0":"tcp://w4:1","1":"tcp://w4:2"},"data_parallel_size":2,"replay_endpoint":"tcp://w4:3"`), "replay_endpoint is supported only for data_parallel_size 1")
	reasons(w(`"kv_events_endpoints":{"4":"tcp://w4:1"},"data_parallel_start_rank":4,"data_parallel_size":2`), "kv_events endpoint is required for dp_rank 5")
	reasons(w(`"data_parallel_size":0`), "data_parallel_size must be greater than 0")
	reasons(w(`"kv_events_endpoint":"tcp://w4:1","block_size":0`), "block_size must be greater than 0")
	if _, model := rankEndpoints(h.r, 4); model != "" {
		t.Fatal("a worker its reconciliation refused is in the router")
	}
}

// TestSelectionWorkerChanges: PATCH merges into the record and re-registers only the ranks that
// changed (a rank kept keeps its blocks); an upsert moves a worker between partitions or makes
// it incomplete, taking it out of the router; DELETE answers the unschedulable record and takes
// the worker out of the router and the catalog.
func TestSelectionWorkerChanges(t *testing.T) {
	h := newSelHarness(t)
	h.want("POST", "/workers", worker1, 201)
	h.want("POST", "/workers", worker2, 201)
	h.want("POST", "/workers", `{"worker_id":3,"model_name":"model"}`, 201, `"incomplete"`)
	h.storeModel(2, 0, 1, tokens(0, 32))
	h.storeModel(2, 1, 2, tokens(500, 32))

	// Complete worker 3 by parts.
	h.want("PATCH", "/workers/3", `{"endpoint":"http://w3:8000","block_size":16}`, 200, `"incomplete"`, `"kv_events endpoint is required for dp_rank 0"`)
	h.want("PATCH", "/workers/3", `{"kv_events_endpoint":"tcp://w3:5557","taints":null,"unknown":1}`, 200, `"schedulable"`, `"endpoint":"http://w3:8000"`, `"taints":[]`)
	if eps, _ := rankEndpoints(h.r, 3); eps[0] != "tcp://w3:5557 " {
		t.Fatalf("worker 3 in the router: %v", eps)
	}

	// Worker 2's rank 1 moves to another socket: rank 0 keeps its blocks, rank 1 starts over.
	h.want("PATCH", "/workers/2", `{"kv_events_endpoints":{"0":"tcp://worker2:6000","1":"tcp://worker2:7200"},"total_kv_blocks":64}`, 200,
		`"schedulable"`, `"total_kv_blocks":64`, `7200"`)
	cached := func() map[uint32]int64 {
		out := map[uint32]int64{}
		for _, w := range h.r.Workers() {
			if w.ID == 2 {
				out[w.Rank] = w.CachedBlocks
			}
		}
		return out
	}
	if eps, _ := rankEndpoints(h.r, 2); eps[1] != "tcp://worker2:7200 " || eps[0] != "tcp://worker2:6000 " {
		t.Fatalf("worker 2's ranks after the patch: %v", eps)
	}
	if c := cached(); c[0] != 2 || c[1] != 0 {
		t.Fatalf("worker 2's cached blocks after rank 1 moved: %v, want rank 0's kept", c)
	}
	// One rank fewer.
	h.want("PATCH", "/workers/2", `{"data_parallel_size":1,"kv_events_endpoints":{"0":"tcp://worker2:6000"}}`, 200, `"schedulable"`)
	if c := cached(); len(c) != 1 || c[0] != 2 {
		t.Fatalf("worker 2 down to rank 0: %v", c)
	}

	// An upsert moves worker 1 to routing group b: its own partition, isolated.
	h.want("POST", "/workers", strings.Replace(worker1, `"routing_group":"default"`, `"routing_group":"b"`, 1), 201, `"routing_group":"b"`, `"schedulable"`)
	if _, model := rankEndpoints(h.r, 1); model != "model@b" {
		t.Fatalf("worker 1 after moving to group b: model %q", model)
	}
	h.want("POST", "/select", `{"model_name":"model","routing_group":"b","token_ids":[1,2,3]}`, 200, `"worker_id":1`, `"routing_group":"b"`)
	var ws []map[string]any
	h.decode("GET", "/workers?routing_group=b", "", 200, &ws)
	if len(ws) != 1 || ws[0]["worker_id"] != 1.0 {
		t.Fatalf("GET /workers?routing_group=b: %v", ws)
	}
	h.decode("GET", "/workers", "", 200, &ws)
	if len(ws) != 3 || ws[0]["worker_id"] != 1.0 || ws[1]["worker_id"] != 2.0 || ws[2]["worker_id"] != 3.0 { // group b < default
		t.Fatalf("GET /workers, by model, group and id: %v", ws)
	}
	// An upsert without an endpoint makes it incomplete: out of the router.
	h.want("POST", "/workers", `{"worker_id":1,"model_name":"model","routing_group":"b","block_size":16,"kv_events_endpoint":"tcp://worker:5557"}`, 201,
		`"incomplete"`, `"endpoint is required"`)
	if _, model := rankEndpoints(h.r, 1); model != "" {
		t.Fatalf("an incomplete worker is still in the router, model %q", model)
	}

	// DELETE: the unschedulable record, the worker out of the router and the catalog.
	var rec map[string]any
	h.decode("DELETE", "/workers/2", "", 200, &rec)
	if rec["lifecycle"] != "unschedulable" || rec["worker_id"] != 2.0 || rec["total_kv_blocks"] != 64.0 {
		t.Fatalf("DELETE /workers/2: %v", rec)
	}
	if _, model := rankEndpoints(h.r, 2); model != "" {
		t.Fatal("a deleted worker is still in the router")
	}
	h.decode("GET", "/workers", "", 200, &ws)
	if len(ws) != 2 {
		t.Fatalf("GET /workers after DELETE: %v", ws)
	}
	h.wantError("PATCH", "/workers/2", `{}`, 404, "worker 2 not found")
}

// TestSelectionMetrics: each route's requests are counted by route, method and status, with
// the unknown members of their bodies, and refusals in the HTTP rejection counter.
func TestSelectionMetrics(t *testing.T) {
	h := newSelHarness(t)
	h.want("POST", "/workers", worker1, 201)
	h.want("POST", "/select", `{"model_name":"model","token_ids":[1],"future":1}`, 200)
	h.want("POST", "/select", `{"model_name":"model","token_ids":[1]}`, 200)
	h.wantError("GET", "/select", "", 405, "method not allowed")
	h.wantError("GET", "/nowhere", "", 404, "route not found")
	h.wantError("PATCH", "/workers/7", `{}`, 404, "worker 7 not found")
	_, page := h.get("/metrics")
	for _, want := range []string{
		`kvrouterd_selection_requests_total{code="201",method="POST",route="/workers"} 1`,
		`kvrouterd_selection_requests_total{code="200",method="POST",route="/select"} 2`,
		`kvrouterd_selection_requests_total{code="405",method="GET",route="/select"} 1`,
		`kvrouterd_selection_requests_total{code="404",method="GET",route="other"} 1`,
		`kvrouterd_selection_requests_total{code="404",method="PATCH",route="/workers/{worker_id}"} 1`,
		`kvrouterd_dynamo_unknown_fields_total{path="/select"} 1`,
		`kvrouterd_dynamo_unknown_fields_total{path="/workers"} 2`,
		`kvrouterd_http_rejected_total{endpoint="selection",reason="not_found"} 2`,
		`kvrouterd_http_request_duration_seconds_count{endpoint="selection"} 6`,
	} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestSelectionShutdown: from the start of a shutdown, /ready answers 503.
func TestSelectionShutdown(t *testing.T) {
	h := newSelHarness(t)
	h.want("POST", "/workers", worker1, 201)
	h.want("GET", "/ready", "", 200, `"ready":true`)
	if err := h.s.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/ready")
	h.s.HandleSelection(&ctx)
	if body := string(ctx.Response.Body()); ctx.Response.StatusCode() != 503 || !strings.Contains(body, `"ready":false,"schedulable_workers":1`) {
		t.Fatalf("/ready in a shutdown: %d %s", ctx.Response.StatusCode(), body)
	}
}

// TestPendingCache: the pending selections expire after the TTL, and past the number of
// entries or bytes the oldest go; a replaced entry counts once.
func TestPendingCache(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newPendingCache(time.Minute, 3, 1<<20)
	c.now = func() time.Time { return now }
	k := func(i int) pendingKey { return pendingKey{"m", "default", fmt.Sprint(i)} }
	for i := range 3 {
		c.put(k(i), &pendingEntry{seqs: []uint64{uint64(i)}})
	}
	c.put(k(1), &pendingEntry{seqs: []uint64{11}})
	if c.len() != 3 || c.get(k(1)).seqs[0] != 11 {
		t.Fatalf("a replaced entry: %d entries, %+v", c.len(), c.get(k(1)))
	}
	c.put(k(3), &pendingEntry{}) // past 3 entries: the oldest, 0, goes
	if c.get(k(0)) != nil || c.get(k(2)) == nil || c.get(k(3)) == nil {
		t.Fatal("past the number of entries the oldest did not go")
	}
	now = now.Add(time.Minute + time.Second)
	if c.get(k(2)) != nil {
		t.Fatal("an entry outlived the TTL")
	}
	c.put(k(4), &pendingEntry{})
	if c.len() != 1 {
		t.Fatalf("expired entries left after a put: %d", c.len())
	}
	c.take(k(4))
	if c.len() != 0 || c.bytes != 0 {
		t.Fatalf("after take: %d entries, %d bytes", c.len(), c.bytes)
	}
	small := newPendingCache(time.Minute, 100, 1000)
	small.put(k(1), &pendingEntry{seqs: make([]uint64, 200)}) // larger than the bound on its own
	small.put(k(2), &pendingEntry{seqs: make([]uint64, 50)})
	small.put(k(3), &pendingEntry{seqs: make([]uint64, 50)}) // 2 and 3 exceed 1000 bytes together
	if small.get(k(1)) != nil || small.get(k(2)) != nil || small.get(k(3)) == nil {
		t.Fatal("the byte bound is not kept")
	}
}

// TestSelectionConcurrent: the catalog changing while requests select, reserve and read it
// (run under -race); a worker deleted between a choice and its booking is Dynamo's 500 and books
// nothing; every reservation's load is freed at the end.
func TestSelectionConcurrent(t *testing.T) {
	h := newSelHarness(t)
	h.want("POST", "/workers", worker1, 201)
	h.want("POST", "/workers", worker2, 201)
	prompt, _ := json.Marshal(tokens(0, 70))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 25 {
				id := fmt.Sprintf("c-%d-%d", g, i)
				code, out := h.do("POST", "/select_and_reserve", `{"selection_id":"`+id+`","model_name":"model","token_ids":`+string(prompt)+`}`)
				if code == 500 && strings.Contains(out, `"selected worker 3 is no longer schedulable"`) {
					continue // deleted between its choice and its booking, as in Dynamo: nothing booked
				}
				if code != 200 {
					t.Errorf("/select_and_reserve %s: %d %s", id, code, out)
					return
				}
				h.do("GET", "/ready", "")
				h.do("GET", "/loads", "")
				if code, out := h.do("DELETE", "/reservations/"+id, ""); code != 200 {
					t.Errorf("DELETE %s: %d %s", id, code, out)
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 25 {
			h.do("POST", "/workers", fmt.Sprintf(`{"worker_id":3,"model_name":"model","endpoint":"http://w3","block_size":16,"kv_events_endpoint":"tcp://w3:%d"}`, 1000+i))
			h.do("GET", "/workers", "")
			h.do("DELETE", "/workers/3", "")
		}
	})
	wg.Wait()
	if n := h.r.Stats().ActiveRequests; n != 0 {
		t.Fatalf("%d reservations left booked", n)
	}
	if _, model := rankEndpoints(h.r, 3); model != "" {
		t.Fatal("worker 3, deleted last, is still in the router")
	}
}

// TestSelectionTiers: /overlap_scores and /select report the lower tiers as Dynamo does: worker
// 1 holds 2 blocks on its device and the next one in its host tier; host_pinned_blocks and
// disk_blocks are cumulative (3), the extensions apart (host 1), and router_credit_blocks is
// 1.0 × 2 + 0.75 × 1 = 2.75 at the default weights; /select's overlap is gpu 32, cpu and disk
// 48 tokens.
func TestSelectionTiers(t *testing.T) {
	h := newSelHarness(t)
	h.want("POST", "/workers", `{"worker_id":1,"model_name":"model","endpoint":"http://w1:8000","kv_events_endpoint":"tcp://w1:5557","block_size":16}`, 201)
	toks := tokens(0, 64)
	evs := []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{1, 2}, Tokens: toks[:32], BlockSize: 16},
		{Kind: kvevent.Stored, ID: 2, Tier: kvevent.Host, Hashes: []uint64{3}, Parent: 2, HasParent: true, Tokens: toks[32:48], BlockSize: 16},
	}
	if res, err := h.c.Events(&wire.EventBatch{Worker: 1, Model: "model", Events: evs}); err != nil || res.OK != 2 {
		t.Fatalf("events: %+v %v", res, err)
	}
	ids, _ := json.Marshal(toks)
	var scores struct {
		Workers []map[string]any `json:"workers"`
	}
	h.decode("POST", "/overlap_scores", `{"model_name":"model","token_ids":`+string(ids)+`}`, 200, &scores)
	want := map[string]any{"worker_id": 1.0, "dp_rank": 0.0, "device_blocks": 2.0, "host_pinned_blocks": 3.0, "disk_blocks": 3.0,
		"host_pinned_extension_blocks": 1.0, "disk_extension_blocks": 0.0, "shared_beyond_device_blocks": nil, "router_credit_blocks": 2.75}
	if len(scores.Workers) != 1 || !reflect.DeepEqual(scores.Workers[0], want) {
		t.Fatalf("/overlap_scores workers %v\nwant [%v]", scores.Workers, want)
	}
	var sel map[string]any
	h.decode("POST", "/select", `{"model_name":"model","token_ids":`+string(ids)+`}`, 200, &sel)
	wantOverlap := map[string]any{"longest_matched": 48.0, "gpu": 32.0, "dp": map[string]any{"0": 32.0}, "cpu": 48.0, "disk": 48.0}
	if !reflect.DeepEqual(sel["overlap"], wantOverlap) {
		t.Fatalf("/select overlap %v, want %v", sel["overlap"], wantOverlap)
	}
}

// TestSelectionPotentialLoads works /potential_loads out by hand. Three ranks of model "model"
// (blocks of 16), a prompt of 70 tokens: 4 full blocks and 6 tokens more. Worker 1 rank 0 holds
// the prompt's 4 blocks, worker 2 rank 1 its first 2; worker 2 rank 0 holds none, but has the
// prompt's 4 blocks booked already (a reservation of 30 prefill tokens). A rank's potential
// load is its booked load with the prompt added:
//
//	rank   cached  prefill tokens     decode blocks           requests
//	(1,0)  64      0 + (70 − 64) = 6   0 + 4 new = 4            0
//	(2,0)  0       30 + 70 = 100       4 + 0 new (booked) = 4   1
//	(2,1)  32      0 + (70 − 32) = 38  0 + 4 new = 4            0
//
// With track_prefill_tokens false the prompt adds no prefill tokens: 0, 30 and 0. Nothing is
// booked by the question.
func TestSelectionPotentialLoads(t *testing.T) {
	h := newSelHarness(t)
	h.want("POST", "/workers", worker1, 201, `"schedulable"`)
	h.want("POST", "/workers", worker2, 201, `"schedulable"`)
	toks := tokens(0, 70)
	h.storeModel(1, 0, 1, toks)
	h.storeModel(2, 1, 1, toks[:32])
	var hasher radix.Hasher
	seqs, _ := json.Marshal(signed(hasher.AppendSequence(nil, toks, 16, radix.BaseSeed)))
	h.want("POST", "/reservations", `{"selection_id":"r-1","model_name":"model","worker_id":2,"dp_rank":0,
		"sequence_hashes":`+string(seqs)+`,"isl_tokens":70,"effective_prefill_tokens":30}`, 201)
	h.wantLoad(2, 0, 30, 4, 1)

	prompt, _ := json.Marshal(toks)
	potential := func(override string) map[[2]uint64]load {
		t.Helper()
		var out []load
		h.decode("POST", "/potential_loads", `{"model_name":"model","routing_group":"default","token_ids":`+string(prompt)+
			`,"router_config_override":`+override+`}`, 200, &out)
		m := map[[2]uint64]load{}
		for _, l := range out {
			m[[2]uint64{l.Worker, uint64(l.Rank)}] = l
		}
		if len(m) != len(out) {
			t.Fatalf("/potential_loads lists a rank twice: %+v", out)
		}
		return m
	}
	want := map[[2]uint64]load{
		{1, 0}: {Worker: 1, Rank: 0, Prefill: 6, Decode: 4},
		{2, 0}: {Worker: 2, Rank: 0, Prefill: 100, Decode: 4, Requests: 1},
		{2, 1}: {Worker: 2, Rank: 1, Prefill: 38, Decode: 4},
	}
	if got := potential("null"); !reflect.DeepEqual(got, want) {
		t.Fatalf("/potential_loads: %+v\nwant %+v", got, want)
	}
	for k, l := range want {
		l.Prefill = map[[2]uint64]int64{{2, 0}: 30}[k]
		want[k] = l
	}
	if got := potential(`{"track_prefill_tokens":false}`); !reflect.DeepEqual(got, want) {
		t.Fatalf("/potential_loads without prefill tracking: %+v\nwant %+v", got, want)
	}
	h.wantLoad(1, 0, 0, 0, 0)
	h.wantLoad(2, 0, 30, 4, 1)
	h.wantLoad(2, 1, 0, 0, 0)
}
