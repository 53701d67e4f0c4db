package server

import (
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestRequestOutput: POST /v1/requests/{id}/output reports a request's generated tokens; with
// output tracking its booking grows a block at each boundary, and the request's
// router_config_override (JSON) is obeyed.
func TestRequestOutput(t *testing.T) {
	h := newHarnessWith(t, func(c *router.Config) { c.TrackOutputBlocks = true })
	if err := h.r.Register(router.Registration{ID: 1, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	// 10 tokens in blocks of 4: 2 full blocks booked, ⌈10/4⌉ = 3 counted.
	code, body := h.post("/v1/route", "application/json", []byte(`{"request_id":"a","model":"m","token_ids":[1,2,3,4,5,6,7,8,9,10],`+
		`"router_config_override":{"track_prefill_tokens":false,"assume_kv_reuse":false}}`))
	if code != 200 {
		t.Fatalf("route: %d %s", code, body)
	}
	active := func(blocks, prefill int64) {
		t.Helper()
		w := h.r.Workers()[0]
		if w.ActiveBlocks != blocks || w.ActivePrefill != prefill {
			t.Fatalf("%d active blocks, %d prefill; want %d, %d", w.ActiveBlocks, w.ActivePrefill, blocks, prefill)
		}
	}
	active(2, 0) // track_prefill_tokens false: no prefill booked
	if code, body := h.post("/v1/requests/a/output", "application/json", []byte(`{"generated_tokens":3}`)); code != 204 {
		t.Fatalf("output: %d %s", code, body)
	}
	active(3, 0) // ⌈13/4⌉ = 4
	if code, body := h.post("/v1/requests/a/output?generated_tokens=10", "", nil); code != 204 {
		t.Fatalf("output by query: %d %s", code, body)
	}
	active(4, 0) // ⌈20/4⌉ = 5
	for _, c := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/v1/requests/zz/output", `{"generated_tokens":1}`, 404, "zz"},
		{"/v1/requests/a/output", `{}`, 400, "generated_tokens"},
		{"/v1/requests/a/output", `{"generated_tokens":-1}`, 400, "generated_tokens"},
		{"/v1/requests/a/output", `nope`, 400, "body"},
	} {
		if code, body := h.post(c.path, "application/json", []byte(c.body)); code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s, want %d naming %s", c.path, c.body, code, body, c.code, c.want)
		}
	}
	if code, _ := h.post("/v1/requests/a/complete", "", nil); code != 204 {
		t.Fatalf("complete: %d", code)
	}
	active(0, 0)

	// A second request with the same prompt, assume_kv_reuse off, shares nothing with a third.
	for _, id := range []string{"b", "c"} {
		var resp wire.RouteResponse
		if err := h.c.Route(&wire.RouteRequest{RequestID: id, Model: "m", Tokens: tokens(0, 8), AssumeReuse: wire.False}, &resp); err != nil {
			t.Fatal(err)
		}
	}
	active(4, 16)
}
