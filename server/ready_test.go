package server

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

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
