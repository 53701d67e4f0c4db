package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/kvrouterd/kvrouterd/wire"
)

// A gateway routes a prompt, sends it to the worker chosen, and tells kvrouterd when the request
// has prefilled and when it is done. Here kvrouterd runs in the example on a loopback port, with
// two workers of which one reported the prompt's first two blocks cached: the README's
// walkthrough, from Go.
func ExampleClient_Route() {
	quiet := slog.New(slog.DiscardHandler)
	r := router.New(router.Config{BlockSize: 4, Logger: quiet})
	srv := server.New(r, server.Config{Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	go func() { _ = srv.Serve(ln) }()
	defer r.Close()
	defer func() { _ = srv.Shutdown(context.Background()) }()
	kvrouterdAddr := ln.Addr().String()

	c := client.New(client.Config{Addr: kvrouterdAddr, Timeout: time.Second})
	// What a worker's publisher does: register, then report its cached blocks.
	for id := uint64(1); id <= 2; id++ {
		if err := c.Register(client.Worker{ID: id, Model: "llama", BlockSize: 4}); err != nil {
			fmt.Println(err)
			return
		}
	}
	if _, err := c.Events(&wire.EventBatch{Worker: 2, Model: "llama", Events: []kvevent.Event{{
		Kind: kvevent.Stored, ID: 1, Hashes: []uint64{700, 701}, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}}}}); err != nil {
		fmt.Println(err)
		return
	}

	id, promptTokens := "r1", []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	req := &wire.RouteRequest{RequestID: id, Model: "llama", Tokens: promptTokens}
	var resp wire.RouteResponse // reuse req and resp per goroutine: a call then allocates nothing
	if err := c.Route(req, &resp); err != nil {
		fmt.Println(err) // a *client.StatusError for refusals, with the HTTP status and message
		return
	}
	fmt.Printf("send %s to worker %d rank %d\n", resp.RequestID, resp.Worker, resp.Rank)
	for _, cand := range resp.Candidates {
		fmt.Printf("  worker %d: %d blocks cached, cost %.2f\n", cand.Worker, cand.CachedBlocks, cand.Logit)
	}
	// … once the worker has prefilled, and once it has finished:
	if err := c.PrefillDone(id); err != nil {
		fmt.Println(err)
	}
	if err := c.Complete(id); err != nil {
		fmt.Println(err)
	}
	// Output:
	// send r1 to worker 2 rank 0
	//   worker 1: 0 blocks cached, cost 4.25
	//   worker 2: 2 blocks cached, cost 2.25
}
