package frontdoor

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
)

// TestRefusalsLogRateLimited: a flood of bad requests logs a bounded number of lines, while
// kvrouterd_frontdoor_requests_total counts each.
func TestRefusalsLogRateLimited(t *testing.T) {
	var out syncbuf.Buffer
	f := newFixture(t, Config{Logger: slog.New(slog.NewTextHandler(&out, nil))})
	const n = 500
	for range n {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/v1/chat/completions")
		ctx.Request.SetBodyString(`{"model":`)
		f.d.Handle(&ctx)
		if ctx.Response.StatusCode() != 400 {
			t.Fatalf("status %d", ctx.Response.StatusCode())
		}
	}
	if got := testutil.ToFloat64(f.d.m.requests.WithLabelValues("/v1/chat/completions", "400")); got != n {
		t.Fatalf("counted %v refusals, want %d", got, n)
	}
	lines := strings.Count(out.String(), "request refused")
	if lines == 0 || lines > 10 {
		t.Fatalf("%d refusals logged %d lines, want 1 to 10", n, lines)
	}
}
