package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// target is a server under load: its address and how to stop it (a no-op for an external one);
// for an in-process kvrouterd also its Router, and the filler its index holds if any.
type target struct {
	addr   string
	stop   func() error
	router *router.Router
	filler *filler
}

// startKvrouterd runs a Router and its Server on a loopback port, configured as the daemon is by
// default (kv mode, prefill tracking on), with logging off so that logging is not what is measured.
func startKvrouterd() (*target, error) {
	quiet := slog.New(slog.DiscardHandler)
	r := router.New(router.Config{Logger: quiet})
	s := server.New(r, server.Config{Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.Close()
		return nil, err
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	return &target{addr: ln.Addr().String(), router: r, stop: func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := s.Shutdown(ctx)
		r.Close()
		return errors.Join(err, <-served)
	}}, nil
}

// noopBody is the no-op target's answer to /v1/route: a valid route response, so that the client
// decodes it as it decodes kvrouterd's and the two targets differ only in what the server does.
// It carries cands candidates, or for 0 two (130 bytes). Its empty request id keeps the client
// from copying one.
func noopBody(w *workload, cands int) []byte {
	resp := wire.RouteResponse{
		Mode:   wire.ModeKV,
		Chosen: true,
		Worker: workerID(0),
		Blocks: uint32(w.blocks),
		ISL:    uint32(w.blocks * w.bs),
	}
	if cands == 0 {
		cands = min(2, w.workers)
	}
	for i := range cands {
		resp.Candidates = append(resp.Candidates, wire.Candidate{Worker: workerID(i), CachedBlocks: uint32(w.blocks), ActiveBlocks: 1, Logit: 1})
	}
	return wire.AppendRouteResponse(nil, &resp)
}

// startNoop runs a fasthttp server with kvrouterd's server settings and a handler that does no
// work: body for /v1/route, 204 for anything else (the complete call), as kvrouterd answers them.
func startNoop(body []byte) (*target, error) {
	route, ctype := []byte("/v1/route"), []byte(wire.ContentType)
	// The transport is server.New's (its error handler aside, which only counts errors), so that
	// the only difference between the targets is the handler. The fixed answer is set raw: the
	// route's answer is not copied either.
	srv := server.HTTPServer(func(ctx *fasthttp.RequestCtx) {
		if bytes.Equal(ctx.Path(), route) {
			ctx.SetContentTypeBytes(ctype)
			ctx.Response.SetBodyRaw(body)
			return
		}
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	}, server.Config{Logger: slog.New(slog.DiscardHandler)})
	srv.Name = "kvrload-noop"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return &target{addr: ln.Addr().String(), stop: func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return errors.Join(srv.ShutdownWithContext(ctx), <-served)
	}}, nil
}

// start brings up the target c names and, for kvrouterd, fills its index, padded to
// c.Residencies (filler.go) when set. The returned stop also unregisters the workers from an
// external kvrouterd.
func start(c *Config, w *workload) (*target, error) {
	if c.Target == "noop" {
		return startNoop(noopBody(w, c.NoopCandidates))
	}
	t := &target{addr: c.Addr, stop: func() error { return nil }}
	if c.Addr == "" {
		var err error
		if t, err = startKvrouterd(); err != nil {
			return nil, err
		}
	}
	// Setup gets its own client with a generous timeout: a large event batch is not what is measured.
	sc := client.New(client.Config{Addr: t.addr, Timeout: 30 * time.Second, MaxConns: 4})
	if err := w.setup(sc); err != nil {
		if c.Addr != "" {
			err = errors.Join(err, w.teardown(sc))
		}
		return nil, errors.Join(fmt.Errorf("setup of %d workers: %w", w.workers, err), t.stop())
	}
	if c.Addr != "" {
		t.stop = func() error { return w.teardown(sc) }
	}
	if c.Residencies > 0 || c.EventRate > 0 {
		t.filler = newFiller(w, c.Residencies, c.EventRate > 0)
		if err := t.filler.fill(t.router); err != nil {
			return nil, errors.Join(fmt.Errorf("filling the index to %d residencies: %w", c.Residencies, err), t.stop())
		}
		// The fill's garbage is collected now, not in the first measured window.
		runtime.GC()
	}
	return t, nil
}
