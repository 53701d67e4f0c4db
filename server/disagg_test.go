package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestRegisterRoleJSON: "role" on POST /v1/workers sets a worker's role, GET /v1/workers lists
// it, a registration without it keeps the worker's, and an unknown role is a 400 naming the
// field. The Go client carries it.
func TestRegisterRoleJSON(t *testing.T) {
	h := newHarness(t)
	if code, body := h.post("/v1/workers", "application/json", []byte(`{"worker_id":1,"model":"m","role":"prefill"}`)); code != 201 {
		t.Fatalf("register: %d %s", code, body)
	}
	if err := h.c.Register(client.Worker{ID: 2, Model: "m", Role: "decode"}); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Register(client.Worker{ID: 3, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	// Another rank, no role: worker 1 stays a prefill worker.
	if err := h.c.Register(client.Worker{ID: 1, Model: "m", Ranks: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	code, body := h.post("/v1/workers", "application/json", []byte(`{"worker_id":4,"model":"m","role":"encode"}`))
	if code != 400 || !strings.Contains(body, `"field":"role"`) {
		t.Fatalf("unknown role: %d %s", code, body)
	}
	code, body = h.get("/v1/workers")
	if code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	var list struct {
		Workers []struct {
			ID   uint64 `json:"worker_id"`
			Rank uint32 `json:"dp_rank"`
			Role string `json:"role"`
		} `json:"workers"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	want := map[[2]uint64]string{{1, 0}: "prefill", {1, 1}: "prefill", {2, 0}: "decode", {3, 0}: "both"}
	if len(list.Workers) != len(want) {
		t.Fatalf("listed %+v", list.Workers)
	}
	for _, w := range list.Workers {
		if want[[2]uint64{w.ID, uint64(w.Rank)}] != w.Role {
			t.Errorf("worker %d rank %d listed as %q", w.ID, w.Rank, w.Role)
		}
	}
}

// TestDisaggRoute: /v1/route with "disagg" answers both picks in JSON, and the Go client's
// binary route carries them; under --enforce-disagg a model without prefill workers answers
// 503 naming the model, counted in kvrouterd_disagg_decisions_total.
func TestDisaggRoute(t *testing.T) {
	h := newHarnessWith(t, func(c *router.Config) { c.Disagg = &router.DisaggConfig{Enforce: true} })
	for id, role := range map[uint64]string{1: "prefill", 2: "decode"} {
		if err := h.c.Register(client.Worker{ID: id, Model: "m", Role: role}); err != nil {
			t.Fatal(err)
		}
	}
	h.store(1, 1, 100, 0, tokens(0, 16))
	code, body := h.post("/v1/route", "application/json", []byte(`{"request_id":"a","model":"m","token_ids":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],"disagg":true}`))
	if code != 200 || !strings.Contains(body, `"worker_id":2,"dp_rank":0,"prefill":true,"prefill_worker_id":1,"prefill_dp_rank":0,`) {
		t.Fatalf("JSON: %d %s", code, body)
	}
	var resp wire.RouteResponse
	if err := h.c.Route(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: tokens(0, 17), Disagg: true}, &resp); err != nil {
		t.Fatal(err)
	}
	if !resp.Prefill || resp.PrefillWorker != 1 || resp.Worker != 2 {
		t.Fatalf("binary: %+v", resp)
	}
	for _, id := range []string{"a", "b"} {
		if err := h.c.PrefillDone(id); err != nil {
			t.Fatal(err)
		}
		if err := h.c.Complete(id); err != nil {
			t.Fatal(err)
		}
	}
	if _, m := h.get("/metrics"); !strings.Contains(m, `dynamo_component_router_worker_registered{dp_rank="0",router_worker_id="1",worker_type="prefill"} 1`) {
		t.Error("Dynamo's worker_type does not name the prefill worker")
	}
	if err := h.c.Unregister(1); err != nil {
		t.Fatal(err)
	}
	code, body = h.post("/v1/route", "application/json", []byte(`{"request_id":"c","model":"m","token_ids":[1,2,3],"disagg":true}`))
	if code != 503 || !strings.Contains(body, `"field":"model"`) || !strings.Contains(body, "--enforce-disagg") {
		t.Fatalf("enforced: %d %s", code, body)
	}
	_, metrics := h.get("/metrics")
	for _, want := range []string{`kvrouterd_disagg_decisions_total{outcome="disaggregated"} 2`, `kvrouterd_disagg_decisions_total{outcome="refused"} 1`,
		`dynamo_component_router_worker_registered{dp_rank="0",router_worker_id="2",worker_type="decode"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
