package server

import (
	"log/slog"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// TestHandleRouteAllocs: POST /v1/route and /v1/match in the binary format allocate nothing in
// the server, its metrics included (latency, the per-code request counter, Dynamo's series),
// once each endpoint and code has been counted. Under -race (whose sync.Pool drops spares at
// random) each request is served once, uncounted.
func TestHandleRouteAllocs(t *testing.T) {
	r := router.New(router.Config{BlockSize: 16, Shards: 1, Logger: slog.New(slog.DiscardHandler)})
	defer r.Close()
	s := New(r, Config{Logger: slog.New(slog.DiscardHandler)})
	for id := range uint64(8) {
		if err := r.Register(router.Registration{ID: id + 1, Model: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	toks := make([]uint32, 256)
	for i := range toks {
		toks[i] = uint32(i)
	}
	ev := wire.EventBatch{Worker: 3, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1, BlockSize: 16, Hashes: []uint64{1, 2, 3, 4}, Tokens: toks[:64]}}}
	if _, err := r.ApplyEvents(&ev, nil); err != nil {
		t.Fatal(err)
	}
	const id = "request-1"
	body := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks})
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.SetContentTypeBytes(binaryType)
	for _, path := range []string{"/v1/route", "/v1/match"} {
		ctx.Request.SetRequestURI(path)
		serve := func() {
			ctx.Request.SetBodyRaw(body)
			ctx.Response.Reset()
			s.Handle(&ctx)
			if ctx.Response.StatusCode() != fasthttp.StatusOK {
				t.Fatalf("%s: %d %s", path, ctx.Response.StatusCode(), ctx.Response.Body())
			}
			if path == "/v1/route" {
				if err := r.Complete(id); err != nil {
					t.Fatal(err)
				}
			}
		}
		if raceEnabled {
			serve()
			continue
		}
		if n := testing.AllocsPerRun(200, serve); n != 0 {
			t.Errorf("%s: %v allocations per request", path, n)
		}
	}
}
