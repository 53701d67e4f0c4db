package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/client"
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
