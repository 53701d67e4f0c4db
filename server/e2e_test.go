package server

import (
	"bytes"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// harness is a Router and Server on an in-memory listener, with a client.
type harness struct {
	t  *testing.T
	r  *router.Router
	s  *Server
	ln *fasthttputil.InmemoryListener
	c  *client.Client
	hc *fasthttp.Client
	// tcp serves the same Server on a loopback port: an in-memory pipe has no buffer, so a
	// client writing a body the server refuses unread would fail instead of reading the 413.
	tcp string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, nil)
}

// newHarnessWith is newHarness with the router's configuration changed by cfg, if not nil.
func newHarnessWith(t *testing.T, cfg func(*router.Config)) *harness {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rc := router.Config{BlockSize: 4, Shards: 2, Logger: quiet}
	if cfg != nil {
		cfg(&rc)
	}
	r := router.New(rc)
	s := New(r, Config{MaxBodyBytes: 64 << 10, Logger: quiet})
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = s.Serve(ln) }()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(tl) }()
	dial := func(addr string) (net.Conn, error) {
		if addr == tl.Addr().String() {
			return net.Dial("tcp", addr)
		}
		return ln.Dial()
	}
	h := &harness{t: t, r: r, s: s, ln: ln, tcp: tl.Addr().String(),
		c:  client.New(client.Config{Addr: "kvrouterd", Dial: dial, Timeout: 5 * time.Second}),
		hc: &fasthttp.Client{Dial: dial},
	}
	t.Cleanup(func() {
		_ = s.Shutdown(t.Context())
		r.Close()
	})
	return h
}

// post sends a raw request and returns the status and body.
func (h *harness) post(path, contentType string, body []byte) (int, string) {
	h.t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	host := "kvrouterd"
	if len(body) > 64<<10 {
		host = h.tcp
	}
	req.SetRequestURI("http://" + host + path)
	req.Header.SetMethod("POST")
	if contentType != "" {
		req.Header.SetContentType(contentType)
	}
	req.SetBody(body)
	if err := h.hc.DoTimeout(req, resp, 5*time.Second); err != nil {
		h.t.Fatalf("POST %s: %v", path, err)
	}
	return resp.StatusCode(), string(resp.Body())
}

func (h *harness) get(path string) (int, string) {
	h.t.Helper()
	code, body, err := h.hc.GetTimeout(nil, "http://kvrouterd"+path, 5*time.Second)
	if err != nil {
		h.t.Fatalf("GET %s: %v", path, err)
	}
	return code, string(body)
}

func tokens(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

// store posts a stored event of worker id: the blocks of toks (block size 4), engine hashes
// from base, chained onto parent if it is not 0.
func (h *harness) store(id, eventID, base uint64, parent uint64, toks []uint32) {
	h.t.Helper()
	n := len(toks) / 4
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = base + uint64(i)
	}
	ev := kvevent.Event{Kind: kvevent.Stored, ID: eventID, Hashes: hashes, Tokens: toks, BlockSize: 4, Parent: parent, HasParent: parent != 0}
	res, err := h.c.Events(&wire.EventBatch{Worker: id, Model: "m", Events: []kvevent.Event{ev}})
	if err != nil || res.OK != 1 {
		h.t.Fatalf("events of worker %d: %+v, %v", id, res, err)
	}
}

func (h *harness) route(id string, toks []uint32, pin uint64) *wire.RouteResponse {
	h.t.Helper()
	req := &wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks}
	if pin != 0 {
		req.HasPinned, req.PinnedWorker = true, pin
	}
	var resp wire.RouteResponse
	if err := h.c.Route(req, &resp); err != nil {
		h.t.Fatalf("route %s: %v", id, err)
	}
	return &resp
}

func wantCandidate(t *testing.T, resp *wire.RouteResponse, worker uint64, cached, prefill, active uint32, logit float64) {
	t.Helper()
	for _, c := range resp.Candidates {
		if c.Worker == worker {
			if c.CachedBlocks != cached || c.PrefillTokens != prefill || c.ActiveBlocks != active || math.Abs(c.Logit-logit) > 1e-9 {
				t.Fatalf("worker %d: cached %d prefill %d active %d logit %v; want %d %d %d %v",
					worker, c.CachedBlocks, c.PrefillTokens, c.ActiveBlocks, c.Logit, cached, prefill, active, logit)
			}
			return
		}
	}
	t.Fatalf("worker %d is not a candidate", worker)
}

// TestRouteLifecycle registers workers, posts events, and routes, with the scores checked against
// the cost function by hand: logit = 1.0 × prefill_tokens/4 + active_blocks.
func TestRouteLifecycle(t *testing.T) {
	h := newHarness(t)
	for id := uint64(1); id <= 3; id++ {
		if err := h.c.Register(client.Worker{ID: id, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	h.store(1, 1, 10, 0, tokens(0, 16)) // worker 1 holds blocks 0-3 of prompt P
	h.store(2, 1, 20, 0, tokens(0, 8))  // worker 2 holds blocks 0-1
	p := tokens(0, 18)                  // 4 full blocks and 2 tokens more

	// 1: prefill 18 − 16 = 2 tokens (0.5 blocks), 4 new blocks: 4.5. 2: 10 tokens, 6.5. 3: 8.5.
	resp := h.route("a", p, 0)
	if !resp.Chosen || resp.Worker != 1 || resp.Blocks != 4 || resp.ISL != 18 {
		t.Fatalf("route a: %+v", resp)
	}
	wantCandidate(t, resp, 1, 4, 2, 4, 4.5)
	wantCandidate(t, resp, 2, 2, 10, 4, 6.5)
	wantCandidate(t, resp, 3, 0, 18, 4, 8.5)
	if err := h.c.Complete("a"); err != nil {
		t.Fatal(err)
	}

	// Load on worker 1: two pinned requests of 4 uncached blocks each (16 prefill tokens each).
	h.route("q1", tokens(1000, 16), 1)
	h.route("q2", tokens(2000, 16), 1)
	// 1: (32 + 2)/4 + 8 + 4 = 20.5; 2 is now the cheapest at 6.5: the load term moves the request.
	resp = h.route("b", p, 0)
	if resp.Worker != 2 {
		t.Fatalf("with worker 1 loaded, chose %d: %+v", resp.Worker, resp.Candidates)
	}
	wantCandidate(t, resp, 1, 4, 34, 12, 20.5)
	wantCandidate(t, resp, 2, 2, 10, 4, 6.5)
	for _, id := range []string{"q1", "q2"} {
		if err := h.c.PrefillDone(id); err != nil {
			t.Fatal(err)
		}
	}
	// Prefill done: 1 costs 0.5 + 12 = 12.5; 2 carries b now, whose four blocks are all this
	// prompt's: (10 + 10)/4 + 4 active + 0 new = 9.
	var m wire.RouteResponse
	if err := h.c.Match(&wire.RouteRequest{Model: "m", Tokens: p}, &m); err != nil {
		t.Fatal(err)
	}
	if m.Chosen {
		t.Fatal("match chose a worker")
	}
	wantCandidate(t, &m, 1, 4, 2, 12, 12.5)
	wantCandidate(t, &m, 2, 2, 20, 4, 9)
	for _, id := range []string{"q1", "q2", "b"} {
		if err := h.c.Complete(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.c.Complete("b"); err == nil {
		t.Fatal("completing twice succeeded")
	}
	resp = h.route("c", p, 0)
	if resp.Worker != 1 {
		t.Fatalf("after completions chose %d, want 1", resp.Worker)
	}
	wantCandidate(t, resp, 1, 4, 2, 4, 4.5)
}

// TestRouteTies checks temperature-0 ties: the smaller tree wins, then a random pick among equals.
func TestRouteTies(t *testing.T) {
	h := newHarness(t)
	for id := uint64(1); id <= 3; id++ {
		if err := h.c.Register(client.Worker{ID: id, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	h.store(1, 1, 10, 0, tokens(500, 8)) // trees: 1 holds 2 unrelated blocks, 2 and 3 none
	q := tokens(0, 8)
	// All three cost 2 + 2 = 4; 2 and 3 have the smallest tree (0): one of them, never 1.
	seen := map[uint64]int{}
	for i := range 60 {
		id := "t" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		resp := h.route(id, q, 0)
		seen[resp.Worker]++
		if err := h.c.Complete(id); err != nil {
			t.Fatal(err)
		}
	}
	if seen[1] != 0 || seen[2] == 0 || seen[3] == 0 {
		t.Fatalf("tie picks %v: want workers 2 and 3 only, both", seen)
	}

	// max_candidates caps the answer at the chosen worker, in JSON as in binary.
	code, body := h.post("/v1/route", "application/json", []byte(`{"request_id":"cap","model":"m","token_ids":[0,1,2,3,4,5,6,7],"max_candidates":1}`))
	if code != 200 || strings.Count(body, `"worker_id"`) != 2 { // the choice, and its one candidate
		t.Fatalf("route capped at 1: %d %s", code, body)
	}
	if code, body = h.post("/v1/route", "application/json", []byte(`{"request_id":"cap2","model":"m","token_ids":[0,1,2,3],"max_candidates":70000}`)); code != 400 || !strings.Contains(body, "max_candidates") {
		t.Fatalf("max_candidates 70000: %d %s", code, body)
	}
}

// TestBadInput sends malformed and inconsistent requests: each gets a 4xx naming the field, a
// counter, and leaves the index as it was.
func TestBadInput(t *testing.T) {
	h := newHarness(t)
	if err := h.c.Register(client.Worker{ID: 1, Model: "m", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	h.store(1, 1, 10, 0, tokens(0, 8))
	good := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "x", Model: "m", Tokens: tokens(0, 8)})
	version := bytes.Clone(good)
	version[4] = 2
	magic := bytes.Clone(good)
	magic[0] = 'X'
	nanWeight := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "x", Model: "m", Tokens: tokens(0, 8), HasWeight: true, Weight: math.NaN()})
	isl := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "x", Model: "m", Tokens: tokens(0, 8), ISL: 9})
	unknownModel := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "x", Model: "nope", Tokens: tokens(0, 8)})
	pinned := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "x", Model: "m", Tokens: tokens(0, 8), HasPinned: true, PinnedWorker: 99})
	evBatch := func(ev kvevent.Event, worker uint64) []byte {
		return wire.AppendEventBatch(nil, &wire.EventBatch{Worker: worker, Model: "m", Events: []kvevent.Event{ev}})
	}
	badBS := evBatch(kvevent.Event{Kind: kvevent.Stored, ID: 2, Hashes: []uint64{30}, Tokens: tokens(100, 8), BlockSize: 8}, 1)
	badTokens := evBatch(kvevent.Event{Kind: kvevent.Stored, ID: 2, Hashes: []uint64{30, 31}, Tokens: tokens(100, 5)}, 1)
	unknownWorker := evBatch(kvevent.Event{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{30}, Tokens: tokens(100, 4)}, 99)
	big := make([]byte, 65<<10)

	bin := wire.ContentType
	f := func(path, ctype string, body []byte, status int, field, reason string) {
		t.Helper()
		before := h.r.Models()
		ep := "route"
		if path == "/v1/events" {
			ep = "events"
		}
		if status == 413 {
			ep = "any"
		}
		c0 := testutil.ToFloat64(h.s.m.rejected.WithLabelValues(ep, reason))
		code, msg := h.post(path, ctype, body)
		if code != status {
			t.Fatalf("%s %s: status %d (%s), want %d", path, field, code, msg, status)
		}
		if !strings.Contains(msg, `"error"`) || (field != "" && !strings.Contains(msg, `"field":"`+field+`"`)) {
			t.Fatalf("%s: body %s does not name field %q", path, msg, field)
		}
		if c1 := testutil.ToFloat64(h.s.m.rejected.WithLabelValues(ep, reason)); c1 != c0+1 {
			t.Fatalf("%s %s: rejected{%s,%s} went %v → %v", path, field, ep, reason, c0, c1)
		}
		if after := h.r.Models(); after[0] != before[0] {
			t.Fatalf("%s %s changed the index: %+v → %+v", path, field, before, after)
		}
	}
	f("/v1/route", bin, good[:len(good)/2], 400, "body_length", "truncated")
	f("/v1/route", bin, good[:7], 400, "", "truncated")
	f("/v1/route", bin, big, 413, "body", "too_large")
	f("/v1/route", bin, magic, 400, "magic", "magic")
	f("/v1/route", bin, version, 400, "version", "version")
	f("/v1/route", bin, isl, 400, "isl", "invalid")
	f("/v1/route", bin, nanWeight, 400, "overlap_score_weight", "invalid")
	f("/v1/route", bin, unknownModel, 404, "model", "unknown_model")
	f("/v1/route", bin, pinned, 404, "pinned_worker", "unknown_worker")
	f("/v1/route", "", []byte(`{"request_id":"x","model":"m","token_ids":[1,2,`), 400, "body", "json")
	f("/v1/route", "", []byte(`{"request_id":"x","model":"m","tokens":[1]}`), 400, "tokens", "json")
	f("/v1/route", "", []byte(`{"request_id":"x","model":"m","token_ids":[1,2,3,4],"isl":5}`), 400, "isl", "invalid")
	f("/v1/route", "", []byte(`{"request_id":"x","model":"m","token_ids":["a"]}`), 400, "token_ids", "json")
	f("/v1/events", bin, badBS, 400, "events[0].block_size", "invalid")
	f("/v1/events", bin, badTokens, 400, "events[0].token_ids", "invalid")
	f("/v1/events", bin, unknownWorker, 404, "worker_id", "unknown_worker")
	f("/v1/events", "", []byte(`{"worker_id":1,"events":[{"type":"stored","block_hashes":[5],"token_ids":[1,2,3,4],"medium":"TAPE"}]}`), 400, "events[0].medium", "json")
	f("/v1/events", "", []byte(`{"worker_id":1,"events":[{"type":"moved"}]}`), 400, "events[0].type", "json")
	// None of it touched worker 1's two blocks.
	if ws := h.r.Workers(); ws[0].CachedBlocks != 2 || ws[0].LastEventID != 1 {
		t.Fatalf("worker state changed: %+v", ws[0])
	}
}

// TestDynamoEndpoints drives the standalone-indexer compatible API.
func TestDynamoEndpoints(t *testing.T) {
	h := newHarness(t)
	code, body := h.post("/register", "", []byte(`{"instance_id":7,"endpoint":"tcp://w7:5557","model_name":"m","block_size":4,"dp_rank":0}`))
	if code != 201 || !strings.Contains(body, `"ok"`) {
		t.Fatalf("register: %d %s", code, body)
	}
	if code, body = h.post("/register", "", []byte(`{"instance_id":7,"endpoint":"tcp://w7:5557","model_name":"m","block_size":4,"dp_rank":0}`)); code != 409 {
		t.Fatalf("second register of the same rank: %d %s", code, body)
	}
	if code, body = h.post("/register", "", []byte(`{"instance_id":8,"endpoint":"tcp://w8:5557","model_name":"m","block_size":16}`)); code != 409 {
		t.Fatalf("register with another block size: %d %s", code, body)
	}
	if code, _ = h.post("/register", "", []byte(`{"instance_id":7,"endpoint":"tcp://w7:5558","model_name":"m","block_size":4,"dp_rank":1}`)); code != 201 {
		t.Fatalf("register rank 1: %d", code)
	}
	h.store(7, 1, 10, 0, tokens(0, 12))
	code, body = h.post("/query", "", []byte(`{"model_name":"m","token_ids":[0,1,2,3,4,5,6,7,99,99,99,99,1]}`))
	want := `{"frequencies":[1,1],"instances":{"7":{"longest_matched":8,"gpu":8,"dp":{"0":8},"cpu":8,"disk":8}},"scores":{"7":{"0":8}},"tree_sizes":{"7":{"0":3}}}`
	if code != 200 || body != want+"\n" {
		t.Fatalf("query: %d %s", code, body)
	}
	if code, body = h.post("/query", "", []byte(`{"model_name":"other","token_ids":[1]}`)); code != 404 || !strings.Contains(body, "no indexer for model=other routing_group=default") {
		t.Fatalf("query of an unknown model: %d %s", code, body)
	}
	// query_by_hash takes local block hashes, as signed 64-bit numbers.
	var m wire.RouteResponse
	if err := h.c.Match(&wire.RouteRequest{Model: "m", Tokens: tokens(0, 4)}, &m); err != nil {
		t.Fatal(err)
	}
	if code, body = h.post("/query_by_hash", "", []byte(`{"model_name":"m","block_hashes":[1,2]}`)); code != 200 || !strings.Contains(body, `"scores":{}`) {
		t.Fatalf("query_by_hash of unknown hashes: %d %s", code, body)
	}
	if code, body = h.get("/workers"); code != 200 || !strings.Contains(body, `"instance_id":7`) || !strings.Contains(body, `"1":"tcp://w7:5558"`) {
		t.Fatalf("workers: %d %s", code, body)
	}
	if code, body = h.get("/dump?form=sequence"); code != 200 || !strings.Contains(body, `"m:default":{"block_size":4`) || strings.Count(body, `"block_hash"`) != 3 {
		t.Fatalf("dump: %d %s", code, body)
	}
	if code, _ = h.get("/health"); code != 200 {
		t.Fatalf("health: %d", code)
	}
	if code, body = h.post("/unregister", "", []byte(`{"instance_id":7,"model_name":"m"}`)); code != 200 {
		t.Fatalf("unregister: %d %s", code, body)
	}
	if code, _ = h.post("/unregister", "", []byte(`{"instance_id":7,"model_name":"m"}`)); code != 404 {
		t.Fatalf("unregister twice: %d", code)
	}
	if ms := h.r.Models(); ms[0].Residencies != 0 {
		t.Fatalf("unregistered worker's blocks remain: %+v", ms)
	}
}

// TestRouteRefusedAfterEncoding: a binary route whose every-worker answer was already encoded
// into the response body, then refused at booking (a duplicate id), answers 409 with the JSON
// error alone; the next request on the connection is answered whole.
func TestRouteRefusedAfterEncoding(t *testing.T) {
	h := newHarness(t)
	for id := uint64(1); id <= 3; id++ {
		if err := h.c.Register(client.Worker{ID: id, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	h.store(1, 1, 10, 0, tokens(0, 16))
	first := h.route("dup", tokens(0, 16), 0)
	body := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "dup", Model: "m", Tokens: tokens(0, 16)})
	code, msg := h.post("/v1/route", wire.ContentType, body)
	if code != 409 || !strings.HasPrefix(msg, "{") || !strings.Contains(msg, `"request_id"`) {
		t.Fatalf("duplicate route: %d %q", code, msg)
	}
	// The same client, so the same kept-alive connection.
	code, msg = h.post("/v1/match", wire.ContentType, wire.AppendRouteRequest(nil, &wire.RouteRequest{Model: "m", Tokens: tokens(0, 16)}))
	var m wire.RouteResponse
	if err := wire.DecodeRouteResponse([]byte(msg), &m); code != 200 || err != nil {
		t.Fatalf("match after the refusal: %d %v", code, err)
	}
	// dup's booking is on worker 1, as it was when the first answer counted it.
	if len(m.Candidates) != 3 || m.Candidates[0] != first.Candidates[0] {
		t.Fatalf("match after the refusal: %+v, first answer %+v", m, first)
	}
}

// TestHTTPServerDefaults: the transport settings New and benchmarks share, defaults filled.
func TestHTTPServerDefaults(t *testing.T) {
	s := HTTPServer(func(*fasthttp.RequestCtx) {}, Config{})
	if s.ReadBufferSize != 16<<10 || s.WriteBufferSize != 64<<10 || s.MaxRequestBodySize != 8<<20 ||
		s.ReadTimeout != 30*time.Second || s.IdleTimeout != 120*time.Second || !s.NoDefaultDate {
		t.Fatalf("defaults: %+v", s)
	}
	if s = HTTPServer(nil, Config{ReadBufferSize: 8192, WriteBufferSize: 4096}); s.ReadBufferSize != 8192 || s.WriteBufferSize != 4096 {
		t.Fatalf("set sizes: read %d, write %d", s.ReadBufferSize, s.WriteBufferSize)
	}
}
