package server

import (
	"bytes"
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// BenchmarkHandleRoute serves POST /v1/route in the binary format through Server.Handle, in
// process (no socket): 8 workers, a 2,048-token prompt half cached on one of them, and each
// request completed before the next so that the load stays the same. It is the route path's
// cost in the server, metrics included, beside the router's own (router BenchmarkRoute).
func BenchmarkHandleRoute(b *testing.B) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{BlockSize: 16, Shards: 1, Logger: quiet})
	defer r.Close()
	s := New(r, Config{Logger: quiet})
	for id := range uint64(8) {
		if err := r.Register(router.Registration{ID: id + 1, Model: "m"}); err != nil {
			b.Fatal(err)
		}
	}
	toks := make([]uint32, 2048)
	for i := range toks {
		toks[i] = uint32(i)
	}
	hashes := make([]uint64, 64)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	ev := wire.EventBatch{Worker: 3, Model: "m"}
	ev.Events = append(ev.Events, kvevent.Event{Kind: kvevent.Stored, ID: 1, BlockSize: 16, Hashes: hashes, Tokens: toks[:1024]})
	if _, err := r.ApplyEvents(&ev, nil); err != nil {
		b.Fatal(err)
	}
	const id = "request-00000000"
	body := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks})
	at := bytes.Index(body, []byte(id)) + len("request-")
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v1/route")
	ctx.Request.Header.SetContentTypeBytes(binaryType)
	n := 0
	var buf [8]byte
	for b.Loop() {
		n++
		digits := strconv.AppendUint(buf[:0], uint64(n)%100_000_000, 10)
		copy(body[at+8-len(digits):at+8], digits)
		ctx.Request.SetBodyRaw(body)
		ctx.Response.Reset()
		s.Handle(&ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusOK {
			b.Fatalf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		if err := r.Complete(string(body[at-len("request-") : at+8])); err != nil {
			b.Fatal(err)
		}
	}
}
