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
	toks := benchFleet(b, r, 8, func(uint64) int { return 0 })
	ev := wire.EventBatch{Worker: 3, Model: "m"}
	ev.Events = append(ev.Events, kvevent.Event{Kind: kvevent.Stored, ID: 1, BlockSize: 16, Hashes: benchHashes(64), Tokens: toks[:1024]})
	if _, err := r.ApplyEvents(&ev, nil); err != nil {
		b.Fatal(err)
	}
	route := newRouteRequester(s, r, toks, "request-")
	for b.Loop() {
		if err := route(); err != nil {
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
			// Worker w holds the prompt's first 8 + w%56 blocks.
			toks := benchFleet(b, r, workers, func(w uint64) int { return 8 + int(w%56) })
			var next atomic.Uint32
			b.RunParallel(func(pb *testing.PB) {
				route := newRouteRequester(s, r, toks, fmt.Sprintf("g%03d-", next.Add(1)))
				for pb.Next() {
					if err := route(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// benchFleet registers workers 1 to n for model "m" on r, each storing the first held(w) blocks
// (of 16 tokens) of a 2,048-token prompt, and returns the prompt.
func benchFleet(b *testing.B, r *router.Router, n uint64, held func(w uint64) int) []uint32 {
	toks := make([]uint32, 2048)
	for i := range toks {
		toks[i] = uint32(i)
	}
	hashes := benchHashes(len(toks) / 16)
	for w := range n {
		if err := r.Register(router.Registration{ID: w + 1, Model: "m"}); err != nil {
			b.Fatal(err)
		}
		if k := held(w); k > 0 {
			ev := wire.EventBatch{Worker: w + 1, Model: "m"}
			ev.Events = append(ev.Events, kvevent.Event{Kind: kvevent.Stored, ID: 1, BlockSize: 16, Hashes: hashes[:k], Tokens: toks[:16*k]})
			if _, err := r.ApplyEvents(&ev, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := r.Flush(); err != nil {
		b.Fatal(err)
	}
	return toks
}

// benchHashes returns the engine hashes 1 to n.
func benchHashes(n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = uint64(i + 1)
	}
	return h
}

// newRouteRequester returns a function that routes toks through s.Handle as a binary POST
// /v1/route, the request id prefix followed by 8 digits counting up, and completes it on r:
// one goroutine's requests, as from one connection.
func newRouteRequester(s *Server, r *router.Router, toks []uint32, prefix string) func() error {
	id := prefix + "00000000"
	body := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks})
	at := bytes.Index(body, []byte(id)) + len(prefix)
	// Init gives the context a connection id of its own, as a served connection has: the
	// server's metrics stripe by it.
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(new(fasthttp.Request), nil, nil)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v1/route")
	ctx.Request.Header.SetContentTypeBytes(binaryType)
	n := 0
	var buf [8]byte
	return func() error {
		n++
		digits := strconv.AppendUint(buf[:0], uint64(n)%100_000_000, 10)
		copy(body[at+8-len(digits):at+8], digits)
		ctx.Request.SetBodyRaw(body)
		ctx.Response.Reset()
		s.Handle(ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusOK {
			return fmt.Errorf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		return r.Complete(string(body[at-len(prefix) : at+8]))
	}
}
