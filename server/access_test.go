package server

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/bearer"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
)

const (
	writeToken = "write-0123456789abcdef"
	readToken  = "read-0123456789abcdef"
)

// accessServer serves a Router with cfg (and a token file of writeToken and readToken when
// tokens is set) on loopback: the API and the selection service. It returns both addresses.
func accessServer(t *testing.T, cfg Config, tokens bool) (s *Server, api, sel string) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{BlockSize: 4, Shards: 2, Logger: quiet})
	if tokens {
		path := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte(writeToken+"\nread "+readToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		tk, err := bearer.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Tokens = tk
	}
	cfg.Logger = quiet
	s = New(r, cfg)
	var addrs [2]string
	for i, serve := range []func(net.Listener) error{s.Serve, s.ServeSelection} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = ln.Addr().String()
		go func() { _ = serve(ln) }()
	}
	t.Cleanup(func() {
		_ = s.Shutdown(t.Context())
		r.Close()
	})
	return s, addrs[0], addrs[1]
}

// do sends one request with an Authorization header when token is not empty, and returns the
// response (released by the test's end).
func do(t *testing.T, method, url, token string, body []byte) *fasthttp.Response {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), &fasthttp.Response{}
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(url)
	req.Header.SetMethod(method)
	req.Header.SetContentType("application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.SetBody(body)
	if err := (&fasthttp.Client{}).DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp
}

func TestAuthTokens(t *testing.T) {
	s, api, sel := accessServer(t, Config{}, true)
	register := []byte(`{"worker_id":1,"model":"m","dp_ranks":[0]}`)
	match := []byte(`{"model":"m","token_ids":[1,2,3,4,5,6,7,8]}`)
	route := []byte(`{"model":"m","request_id":"r1","token_ids":[1,2,3,4,5,6,7,8]}`)
	f := func(method, url, token string, body []byte, want int) {
		t.Helper()
		resp := do(t, method, url, token, body)
		if resp.StatusCode() != want {
			t.Errorf("%s %s with token %q: %d %s, want %d", method, url, token, resp.StatusCode(), resp.Body(), want)
		}
		if want == fasthttp.StatusUnauthorized {
			if !strings.Contains(string(resp.Header.Peek("WWW-Authenticate")), "Bearer") {
				t.Errorf("%s %s: 401 without WWW-Authenticate: Bearer", method, url)
			}
			// The API names the header as the field; the selection service answers Dynamo's
			// shape, a message alone.
			field := strings.HasPrefix(url, "http://"+sel) || strings.Contains(string(resp.Body()), `"field":"Authorization"`)
			if !strings.Contains(string(resp.Body()), "--auth-token-file") || !field {
				t.Errorf("%s %s: 401 says %s, want the header and the flag named", method, url, resp.Body())
			}
		}
	}
	unauthorized := testutil.ToFloat64(s.m.rejected.WithLabelValues("other", "unauthorized"))
	// Mutating requests: none without a write token.
	f("POST", "http://"+api+"/v1/workers", "", register, 401)
	f("POST", "http://"+api+"/v1/workers", "not-a-token-of-the-file", register, 401)
	f("POST", "http://"+api+"/v1/workers", readToken, register, 403)
	f("POST", "http://"+api+"/v1/workers", writeToken, register, 201)
	f("POST", "http://"+api+"/register", "", []byte(`{"instance_id":2,"endpoint":"tcp://127.0.0.1:1","model_name":"m","block_size":4}`), 401)
	f("DELETE", "http://"+api+"/v1/workers/1", readToken, nil, 403)
	f("POST", "http://"+api+"/v1/route", readToken, route, 403)
	f("POST", "http://"+api+"/v1/route", writeToken, route, 200)
	f("POST", "http://"+api+"/v1/events", "", []byte(`{"events":[]}`), 401)
	// Reads: a read token is enough.
	f("POST", "http://"+api+"/v1/match", "", match, 401)
	f("POST", "http://"+api+"/v1/match", readToken, match, 200)
	f("GET", "http://"+api+"/v1/workers", readToken, nil, 200)
	f("GET", "http://"+api+"/workers", "", nil, 401)
	f("GET", "http://"+api+"/workers", readToken, nil, 200)
	f("POST", "http://"+api+"/query", readToken, []byte(`{"token_ids":[1,2,3,4],"model_name":"m"}`), 200)
	// The snapshot carries the workers' API keys: a write token's, as the keys are.
	f("GET", "http://"+api+"/v1/snapshot", readToken, nil, 403)
	f("GET", "http://"+api+"/v1/snapshot", writeToken, nil, 404) // this server keeps none
	// Open to everyone: health, readiness, metrics.
	f("GET", "http://"+api+"/healthz", "", nil, 200)
	f("GET", "http://"+api+"/readyz", "", nil, 200)
	f("GET", "http://"+api+"/metrics", "", nil, 200)
	// The status page's files carry no data; its document needs a read token.
	f("GET", "http://"+api+"/ui/app.js", "", nil, 404) // open (this server has no page: 404, not 401)
	f("GET", "http://"+api+"/ui/status.json", "", nil, 401)
	// The selection service, in Dynamo's error shape.
	f("GET", "http://"+sel+"/health", "", nil, 200)
	f("GET", "http://"+sel+"/ready", "", nil, 503) // open, and not ready: no worker yet
	f("GET", "http://"+sel+"/workers", "", nil, 401)
	f("GET", "http://"+sel+"/loads", readToken, nil, 200)
	f("POST", "http://"+sel+"/select", readToken, []byte(`{"model":"m","token_ids":[1,2,3,4]}`), 403)
	f("DELETE", "http://"+sel+"/workers/9", "", nil, 401)
	if got := testutil.ToFloat64(s.m.rejected.WithLabelValues("other", "unauthorized")) - unauthorized; got != 7 {
		t.Errorf("kvrouterd_http_rejected_total{reason=unauthorized} rose by %v, want 7", got)
	}
}

// TestAuthAllocs: the check a request with a token passes before its endpoint allocates
// nothing, so that the route's hot path stays allocation-free with tokens configured.
func TestAuthAllocs(t *testing.T) {
	s, _, _ := accessServer(t, Config{}, true)
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v1/route")
	ctx.Request.Header.Set("Authorization", "Bearer "+writeToken)
	ok := true
	n := testing.AllocsPerRun(200, func() {
		ok = ok && s.authorized(ctx, apiAccess(ctx.Path(), ctx.Method()), s.apiRefusal)
	})
	if !ok {
		t.Fatal("a write token refused on /v1/route")
	}
	if n > 0 {
		t.Fatalf("the token check allocates %v times", n)
	}
}

func TestControlRateLimit(t *testing.T) {
	s, api, sel := accessServer(t, Config{ControlRate: 0.001, ControlBurst: 2, EventsRate: 0.001, EventsBurst: 1}, false)
	before := testutil.ToFloat64(s.m.rejected.WithLabelValues("other", "rate_limited"))
	codes := func(method, url string, body []byte, n int) (got []int) {
		for range n {
			resp := do(t, method, url, "", body)
			got = append(got, resp.StatusCode())
			if resp.StatusCode() == 429 {
				if string(resp.Header.Peek("Retry-After")) != "1" || !strings.Contains(string(resp.Body()), "--control-rate-limit") &&
					!strings.Contains(string(resp.Body()), "--events-rate-limit") {
					t.Errorf("429 %s, Retry-After %q: want the flag named and Retry-After 1", resp.Body(), resp.Header.Peek("Retry-After"))
				}
			}
		}
		return got
	}
	// Two registrations fit the burst; the third, and the selection service's, share it.
	if got := codes("POST", "http://"+api+"/v1/workers", []byte(`{"worker_id":1,"model":"m","dp_ranks":[0]}`), 3); got[0] != 201 || got[1] != 201 || got[2] != 429 {
		t.Errorf("registrations: %v, want 201 201 429", got)
	}
	if got := codes("DELETE", "http://"+sel+"/workers/1", nil, 1); got[0] != 429 {
		t.Errorf("selection service's removal: %v, want 429", got)
	}
	// Routes, matches and listings are not the control plane.
	for i := range 5 {
		if resp := do(t, "POST", "http://"+api+"/v1/route", "", []byte(`{"model":"m","request_id":"r`+strconv.Itoa(i)+`","token_ids":[1,2,3,4]}`)); resp.StatusCode() != 200 {
			t.Fatalf("route under the control limit: %d %s", resp.StatusCode(), resp.Body())
		}
		if resp := do(t, "GET", "http://"+api+"/v1/workers", "", nil); resp.StatusCode() != 200 {
			t.Fatalf("listing under the control limit: %d", resp.StatusCode())
		}
	}
	if got := codes("POST", "http://"+api+"/v1/events", []byte(`{"events":[]}`), 2); got[1] != 429 {
		t.Errorf("events: %v, want the second refused", got)
	}
	if got := testutil.ToFloat64(s.m.rejected.WithLabelValues("other", "rate_limited")) - before; got != 2 {
		t.Errorf("rate_limited refusals of the API counted %v, want 2", got)
	}
}

// announce sends a request's header announcing a body of n bytes, and none of it, and returns
// the answer: a body over the endpoint's limit is refused before it is read.
func announce(t *testing.T, addr, method, path string, n int) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", method, path, n)
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(c)); err != nil {
		t.Fatalf("%s %s announcing %d bytes: %v", method, path, n, err)
	}
	return resp.StatusCode(), string(resp.Body())
}

func TestEndpointBodyLimits(t *testing.T) {
	s, api, sel := accessServer(t, Config{MaxBodyBytes: 1 << 20}, false)
	f := func(addr, method, path string, n, want int, says ...string) {
		t.Helper()
		code, body := announce(t, addr, method, path, n)
		if code != want {
			t.Errorf("%s %s announcing %d bytes: %d %.200s, want %d", method, path, n, code, body, want)
			return
		}
		for _, w := range says {
			if !strings.Contains(body, w) {
				t.Errorf("%s %s: %s, want it to say %q", method, path, body, w)
			}
		}
	}
	before := testutil.ToFloat64(s.m.rejected.WithLabelValues("any", "too_large"))
	// A lifecycle call of 100 KiB: over its own limit, refused before it is read.
	f(api, "POST", "/v1/requests/r1/complete", 100<<10, 413, "lifecycle call's limit of 65536 bytes", "--max-body-bytes")
	f(api, "POST", "/register_peer", 100<<10, 413, "65536 bytes")
	f(sel, "POST", "/reservations/r1/prefill_complete", 100<<10, 413, "65536 bytes")
	// Over --max-body-bytes: the flag is named as the fix.
	f(api, "POST", "/v1/route", 2<<20, 413, "limit of 1048576 bytes", "--max-body-bytes")
	f(api, "POST", "/v1/workers", 2<<20, 413, "1048576 bytes")
	if got := testutil.ToFloat64(s.m.rejected.WithLabelValues("any", "too_large")) - before; got != 5 {
		t.Errorf("too_large refusals counted %v, want 5", got)
	}
	// Within their limits, bodies are read and judged on their content.
	big := []byte(`{"model":"m","request_id":"r1","token_ids":[1,2,3,4],"pad":"` + strings.Repeat("x", 100<<10) + `"}`)
	if resp := do(t, "POST", "http://"+api+"/v1/route", "", big); resp.StatusCode() == 413 {
		t.Errorf("a 100 KiB route refused as too large: %s", resp.Body())
	}
}

// BenchmarkServerAccess is what a route pays before its endpoint with tokens configured: the
// body limit judged from its header, and the token check.
func BenchmarkServerAccess(b *testing.B) {
	path := filepath.Join(b.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(writeToken+"\nread "+readToken+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	tk, err := bearer.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	r := router.New(router.Config{BlockSize: 4, Shards: 1, Logger: quiet})
	defer r.Close()
	s := New(r, Config{Logger: quiet, Tokens: tk})
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v1/route")
	ctx.Request.Header.Set("Authorization", "Bearer "+writeToken)
	h := &ctx.Request.Header
	b.Run("body-limit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.apiBodyLimit(h.RequestURI(), h.Method())
		}
	})
	b.Run("token", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.authorized(ctx, apiAccess(ctx.Path(), ctx.Method()), s.apiRefusal)
		}
	})
}
