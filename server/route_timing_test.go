package server

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
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

// BenchmarkHandleRouteParallel serves POST /v1/route as BenchmarkHandleRoute does, from one
// goroutine per P at once (each its own request ids, each request completed before its next),
// every worker in each answer: the cost of the state the server's requests share (metrics,
// spare buffers, the tracker) as cores contend for it. ns/op is wall time per request.
func BenchmarkHandleRouteParallel(b *testing.B) {
	for _, workers := range []uint64{8, 1000} {
		b.Run("workers="+strconv.FormatUint(workers, 10), func(b *testing.B) {
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			r := router.New(router.Config{BlockSize: 16, Logger: quiet})
			defer r.Close()
			s := New(r, Config{Logger: quiet})
			for id := range workers {
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
			for w := range workers {
				ev := wire.EventBatch{Worker: w + 1, Model: "m"}
				ev.Events = append(ev.Events, kvevent.Event{Kind: kvevent.Stored, ID: 1, BlockSize: 16, Hashes: hashes[:8+w%56], Tokens: toks[:16*(8+w%56)]})
				if _, err := r.ApplyEvents(&ev, nil); err != nil {
					b.Fatal(err)
				}
			}
			if err := r.Flush(); err != nil {
				b.Fatal(err)
			}
			var next atomic.Uint32
			b.RunParallel(func(pb *testing.PB) {
				g := next.Add(1)
				id := fmt.Sprintf("g%03d-00000000", g)
				body := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks})
				at := bytes.Index(body, []byte(id)) + len("g000-")
				var ctx fasthttp.RequestCtx
				ctx.Request.Header.SetMethod("POST")
				ctx.Request.SetRequestURI("/v1/route")
				ctx.Request.Header.SetContentTypeBytes(binaryType)
				n := 0
				var buf [8]byte
				for pb.Next() {
					n++
					digits := strconv.AppendUint(buf[:0], uint64(n)%100_000_000, 10)
					copy(body[at+8-len(digits):at+8], digits)
					ctx.Request.SetBodyRaw(body)
					ctx.Response.Reset()
					s.Handle(&ctx)
					if ctx.Response.StatusCode() != fasthttp.StatusOK {
						b.Errorf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
						return
					}
					if err := r.Complete(string(body[at-len("g000-") : at+8])); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
