package server

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/valyala/fasthttp"
)

// TestBusyThresholdEndpoint: Dynamo's /busy_threshold JSON, read and written per model; a
// POST takes effect on the next route, which is refused with 529 once every worker is over.
func TestBusyThresholdEndpoint(t *testing.T) {
	h := newHarness(t)
	for _, w := range []string{`{"worker_id":1,"model":"m","capacity_blocks":100,"max_batched_tokens":64}`,
		`{"worker_id":2,"model":"m","weight":2,"device_type":"gpu"}`} {
		if code, body := h.post("/v1/workers", "application/json", []byte(w)); code != 201 {
			t.Fatalf("register: %d %s", code, body)
		}
	}
	route := func(id string, pin uint64, isl int) (int, string) {
		body := `{"request_id":"` + id + `","model":"m","token_ids":[` + strings.TrimSuffix(strings.Repeat("7,", isl), ",") + `]`
		if pin != 0 {
			body += `,"router_mode":"direct","pinned_worker":{"worker_id":` + string(rune('0'+pin)) + `,"dp_rank":0}`
		}
		return h.post("/v1/route", "application/json", []byte(body+`}`))
	}
	if code, body := route("a", 1, 40); code != 200 {
		t.Fatalf("route: %d %s", code, body)
	}
	if code, body := route("b", 2, 40); code != 200 {
		t.Fatalf("route: %d %s", code, body)
	}
	code, body := h.get("/busy_threshold")
	if want := `{"thresholds":[{"model":"m","active_decode_blocks_threshold":null,"active_prefill_tokens_threshold":null,"active_prefill_tokens_threshold_frac":null}]}`; code != 200 || body != want {
		t.Fatalf("GET: %d %s\nwant %s", code, body, want)
	}
	// Reading: no threshold given; an unknown model reads as all null, as Dynamo.
	code, body = h.post("/busy_threshold", "application/json", []byte(`{"model":"other","extra":1}`))
	if want := `{"model":"other","active_decode_blocks_threshold":null,"active_prefill_tokens_threshold":null,"active_prefill_tokens_threshold_frac":null}`; code != 200 || body != want {
		t.Fatalf("read unknown: %d %s", code, body)
	}
	code, body = h.post("/busy_threshold", "application/json", []byte(`{"model":"m","active_prefill_tokens_threshold":30}`))
	if want := `{"model":"m","active_decode_blocks_threshold":null,"active_prefill_tokens_threshold":30,"active_prefill_tokens_threshold_frac":null}`; code != 200 || body != want {
		t.Fatalf("set: %d %s\nwant %s", code, body, want)
	}
	// Both workers carry 40 prefill tokens > 30: refused with 529, naming the reason.
	code, body = route("c", 0, 8)
	if code != 529 || !strings.Contains(body, "all eligible workers are overloaded") {
		t.Fatalf("every worker overloaded: %d %s", code, body)
	}
	code, body = route("d", 1, 8)
	if code != 529 || !strings.Contains(body, "pinned worker 1 is overloaded") {
		t.Fatalf("pinned to an overloaded worker: %d %s", code, body)
	}
	// Another field: the first stays.
	code, body = h.post("/busy_threshold", "application/json", []byte(`{"model":"m","active_decode_blocks_threshold":0.5}`))
	if want := `{"model":"m","active_decode_blocks_threshold":0.5,"active_prefill_tokens_threshold":30,"active_prefill_tokens_threshold_frac":null}`; code != 200 || body != want {
		t.Fatalf("second field: %d %s", code, body)
	}
	if code, body = h.post("/busy_threshold", "application/json", []byte(`{"model":"m","active_prefill_tokens_threshold":1000}`)); code != 200 {
		t.Fatalf("raise: %d %s", code, body)
	}
	if code, body = route("e", 0, 8); code != 200 {
		t.Fatalf("after raising the threshold: %d %s", code, body)
	}
	// Errors in Dynamo's envelope.
	for _, c := range []struct {
		ct, body string
		code     int
		msg      string
	}{
		{"text/plain", `{"model":"m"}`, 415, "Expected request with Content-Type application/json"},
		{"application/json", `{"model":"m","active_decode_blocks_threshold":2}`, 400, "active_decode_blocks_threshold must be between 0.0 and 1.0, got 2"},
		// serde's split, which Dynamo keeps: JSON that does not fit is a 422, not JSON a 400.
		{"application/json", `{"model":"m","active_prefill_tokens_threshold":-1}`, 422, "Failed to parse the request body as JSON"},
		{"application/json", `{"active_prefill_tokens_threshold":1}`, 422, "Failed to parse the request body as JSON: missing field `model`"},
		{"application/json", `{"model":null}`, 422, "Failed to parse the request body as JSON"},
		{"application/json", `{"model":"m",`, 400, "Failed to parse the request body as JSON"},
		{"application/json", ``, 400, "Failed to parse the request body as JSON"},
		{"application/json", `{"model":"m"} x`, 400, "Failed to parse the request body as JSON"},
		{"application/json", `{"model":"nope","active_prefill_tokens_threshold":1}`, 404, "Model 'nope' not found. Thresholds can only be set for discovered models."},
	} {
		code, body := h.post("/busy_threshold", c.ct, []byte(c.body))
		if code != c.code || !strings.HasPrefix(body, `{"error":"`) || !strings.Contains(body, c.msg) {
			t.Errorf("%s: %d %s; want %d %q", c.body, code, body, c.code, c.msg)
		}
	}
	// The metrics.
	_, m := h.get("/metrics")
	for _, want := range []string{"kvrouterd_overload_rejections_total 2", `kvrouterd_overloaded_workers{model="m"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	_, w := h.get("/v1/workers")
	if !strings.Contains(w, `"weight":2`) {
		t.Errorf("the worker listing lacks the weight: %s", w)
	}
}

// TestOverloadStatusConfigurable: --overload-status changes the status (503 as Dynamo's older
// releases).
func TestOverloadStatusConfigurable(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{Logger: quiet, Busy: router.Thresholds{PrefillTokens: 0, HasPrefillTokens: true}})
	defer r.Close()
	s := New(r, Config{Logger: quiet, OverloadStatus: 503})
	if err := r.Register(router.Registration{ID: 1, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	send := func(body string) *fasthttp.RequestCtx {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/v1/route")
		ctx.Request.Header.SetContentType("application/json")
		ctx.Request.SetBodyString(body)
		s.Handle(&ctx)
		return &ctx
	}
	if ctx := send(`{"request_id":"a","model":"m","token_ids":[1,2,3]}`); ctx.Response.StatusCode() != 200 {
		t.Fatalf("first: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if ctx := send(`{"request_id":"b","model":"m","token_ids":[1,2,3]}`); ctx.Response.StatusCode() != 503 {
		t.Fatalf("status %d, want 503: %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
}
