package server

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/valyala/fasthttp"
)

// TestReadyz: /readyz is 200 while every check holds, 503 naming each failed check and its
// reason otherwise, and says "shutting down" once Shutdown starts; /healthz stays 200.
func TestReadyz(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{BlockSize: 4, Shards: 1, Logger: quiet})
	defer r.Close()
	var snapErr, streamErr atomic.Pointer[error]
	check := func(p *atomic.Pointer[error]) func() error {
		return func() error {
			if e := p.Load(); e != nil {
				return *e
			}
			return nil
		}
	}
	s := New(r, Config{Logger: quiet, Ready: []ReadyCheck{{"snapshots", check(&snapErr)}, {"stream", check(&streamErr)}}})
	get := func(path string) (int, string) {
		t.Helper()
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI(path)
		ctx.Request.Header.SetMethod("GET")
		s.Handle(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}
	f := func(wantCode int, wantLines ...string) {
		t.Helper()
		code, body := get("/readyz")
		if code != wantCode {
			t.Fatalf("/readyz: %d %q, want %d", code, body, wantCode)
		}
		for _, l := range wantLines {
			if !strings.Contains(body, l) {
				t.Fatalf("/readyz body %q lacks %q", body, l)
			}
		}
		if code, _ := get("/healthz"); code != 200 {
			t.Fatalf("/healthz: %d, want 200 whatever readiness says", code)
		}
	}
	f(200, "ready")
	e1 := errors.New("the last 3 snapshots failed: disk full")
	snapErr.Store(&e1)
	f(503, "snapshots: the last 3 snapshots failed: disk full")
	e2 := errors.New("stream KVR_EVENTS is missing")
	streamErr.Store(&e2)
	f(503, "snapshots: ", "stream: stream KVR_EVENTS is missing")
	snapErr.Store(nil)
	streamErr.Store(nil)
	f(200, "ready")
	_ = s.Shutdown(t.Context())
	f(503, "shutting down")
}

// TestHeadersTooLarge: request headers past the read buffer get 431 naming the headers, and
// the server goes on serving.
func TestHeadersTooLarge(t *testing.T) {
	h := newHarness(t)
	c, err := net.Dial("tcp", h.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n"
	go func() { _, _ = c.Write([]byte(req)) }()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || !strings.Contains(string(body), `"field":"headers"`) {
		t.Fatalf("%d %s, want 431 naming the headers", resp.StatusCode, body)
	}
	if code, _ := h.post("/v1/match", "", []byte(`{"model":"m","token_ids":[1]}`)); code >= 500 {
		t.Fatalf("after the refusal: %d", code)
	}
}

// TestBodyNotAnObject: a JSON body that is not an object gets a 400 naming the body, on every
// endpoint that takes one, without the server's internal type names.
func TestBodyNotAnObject(t *testing.T) {
	h := newHarness(t)
	for _, path := range []string{"/v1/route", "/v1/match", "/v1/events", "/v1/workers", "/register", "/query"} {
		for _, body := range []string{"0", "00", "[]", `"x"`, "true"} {
			code, msg := h.post(path, "application/json", []byte(body))
			if code != 400 || !strings.Contains(msg, `"field":"body"`) || strings.Contains(msg, "server.") {
				t.Fatalf("POST %s %s: %d %s, want 400 naming the body", path, body, code, msg)
			}
		}
	}
}
