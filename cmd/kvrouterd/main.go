// Command kvrouterd is the KV-cache-aware router daemon: it keeps a global index of which
// inference worker holds which KV blocks and answers route and match requests over HTTP.
// Run kvrouterd --help for its configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/server"
)

func main() {
	c, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvrouterd:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "kvrouterd:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down gracefully: stop accepting, finish the requests in
// flight, apply every accepted event.
func run(ctx context.Context, c config) error {
	log := c.logger(os.Stderr)
	if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	mode, _ := scoring.ParseMode(c.RouterMode)
	r := router.New(router.Config{
		BlockSize:       c.BlockSize,
		Mode:            mode,
		OverlapWeight:   c.OverlapScoreWeight,
		NoOverlapWeight: c.OverlapScoreWeight == 0,
		Temperature:     c.RouterTemperature,
		TrackPrefill:    c.TrackPrefillTokens,
		RequestExpiry:   c.RequestExpiry,
		MaxCandidates:   c.MaxCandidates,
		Shards:          c.Shards,
		QueueLen:        c.QueueLen,
		MaxBlocks:       c.MaxBlocks,
		Logger:          log,
	})
	srv := server.New(r, server.Config{MaxBodyBytes: c.MaxBodyBytes, Logger: log})
	ln, err := net.Listen("tcp", c.HTTPAddr)
	if err != nil {
		r.Close()
		return err
	}
	log.Info("kvrouterd listening", "http", ln.Addr().String(), "shards", c.Shards, "mode", c.RouterMode,
		"block_size", c.BlockSize, "data_dir", c.DataDir)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err = <-served:
		r.Close()
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	start := time.Now()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("requests still in flight at the shutdown timeout", "err", err)
	}
	r.Close() // applies every event accepted
	log.Info("stopped", "took", time.Since(start))
	return nil
}
