package server

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/lograte"
	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
)

// TestRefusalsLogRateLimited: a flood of bad requests, on the native and Dynamo's endpoints and
// the selection service, logs a bounded number of lines (the last saying how many were dropped),
// while kvrouterd_http_rejected_total counts each; a logger limited already is not limited
// twice.
func TestRefusalsLogRateLimited(t *testing.T) {
	var out syncbuf.Buffer
	r := router.New(router.Config{BlockSize: 4, Shards: 1, Logger: slog.New(slog.DiscardHandler)})
	defer r.Close()
	s := New(r, Config{Logger: slog.New(slog.NewTextHandler(&out, nil))})
	const n = 1000
	for i := range n {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		switch i % 3 {
		case 0:
			ctx.Request.SetRequestURI("/v1/route")
			ctx.Request.SetBodyString(`{"request_id":"r","model":"m","token_ids":"x"}`)
			s.Handle(&ctx)
		case 1:
			ctx.Request.SetRequestURI("/register")
			ctx.Request.SetBodyString(`{"instance_id":"x"}`)
			s.Handle(&ctx)
		case 2:
			ctx.Request.SetRequestURI("/select")
			ctx.Request.Header.SetContentType("application/json")
			ctx.Request.SetBodyString(`{`)
			s.HandleSelection(&ctx)
		}
		if ctx.Response.StatusCode() < 400 {
			t.Fatalf("request %d not refused: %d", i, ctx.Response.StatusCode())
		}
	}
	counted := testutil.ToFloat64(s.m.rejected.WithLabelValues("route", "json")) +
		testutil.ToFloat64(s.m.rejected.WithLabelValues("dynamo", "json")) +
		testutil.ToFloat64(s.m.rejected.WithLabelValues("selection", "json"))
	if counted != n {
		t.Fatalf("kvrouterd_http_rejected_total counted %v refusals, want %d", counted, n)
	}
	lines := strings.Count(out.String(), "request refused")
	if lines == 0 || lines > 10 {
		t.Fatalf("%d refusals logged %d lines, want 1 to 10:\n%s", n, lines, out.String())
	}

	limited := slog.New(lograte.New(slog.NewTextHandler(&out, nil), lograte.Config{}))
	if refusalLogger(limited) != limited {
		t.Fatal("a logger limited already was limited again")
	}
}
