// Command kvrouterd is the KV-cache-aware router daemon: it keeps a global index of which
// inference worker holds which KV blocks and answers route and match requests over HTTP.
// Run kvrouterd --help for its configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "bridge" {
		bridgeMain(os.Args[2:])
		return
	}
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
	watch := &engineWatcher{}
	defer watch.close()
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
		WorkerTimeout:   c.WorkerTimeout,
		ClearOnGap:      c.ClearOnGap,
		Approximate:     c.approx(),
		Endpoints:       watch,
		Logger:          log,
	})
	reg := prometheus.NewRegistry()
	watch.set(engines(ctx, c, r, log))
	stream, err := startStream(ctx, c, r, reg, log)
	if err != nil {
		r.Close()
		return err
	}
	srv := server.New(r, server.Config{MaxBodyBytes: c.MaxBodyBytes, Logger: log, Registry: reg})
	ln, err := net.Listen("tcp", c.HTTPAddr)
	if err != nil {
		stream.Close()
		r.Close()
		return err
	}
	log.Info("kvrouterd listening", "http", ln.Addr().String(), "nats", streamURL(stream), "shards", c.Shards, "mode", c.RouterMode,
		"block_size", c.BlockSize, "data_dir", c.DataDir)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err = <-served:
		stream.Close()
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
	stream.Close() // stops taking events; the ones taken are in the shard queues
	watch.close()
	r.Close() // applies every event accepted
	log.Info("stopped", "took", time.Since(start))
	return nil
}

// startStream connects to --nats-url, or starts the embedded server, and consumes the events;
// nil with --no-kv-events.
func startStream(ctx context.Context, c config, r *router.Router, reg *prometheus.Registry, log *slog.Logger) (*ingest.Stream, error) {
	if c.NoKVEvents {
		return nil, nil
	}
	var opts []nats.Option
	if c.NATSURL != "" {
		opts = c.NATS.options() // credentials and TLS are for an external server
	}
	st, err := ingest.StartStream(ctx, r, ingest.StreamConfig{
		URL:      c.NATSURL,
		Embedded: ingest.EmbeddedConfig{Dir: filepath.Join(c.DataDir, "nats"), Listen: c.NATSListen},
		Options:  opts,
		Consumer: ingest.ConsumerConfig{
			Prefix: c.NATSPrefix, Stream: c.NATSStream, MaxAge: c.NATSMaxAge, MaxBytes: c.NATSMaxBytes,
			Replicas: c.NATSReplicas, StartSeq: c.NATSStartSeq,
		},
	}, log)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(st.Consumer.Collector())
	return st, nil
}

// streamURL is what the log says of the event stream.
func streamURL(st *ingest.Stream) string {
	if st == nil {
		return "off (--no-kv-events)"
	}
	return st.URL
}

func (c *config) approx() *approx.Config {
	if !c.NoKVEvents {
		return nil
	}
	return &approx.Config{TTL: c.ApproxTTL, MaxBlocks: c.ApproxMaxBlocks, PruneTarget: c.ApproxPruneTarget}
}

// engines subscribes to the --zmq sources; nil in approximate mode.
func engines(ctx context.Context, c config, r *router.Router, log *slog.Logger) *ingest.Engines {
	if c.NoKVEvents {
		return nil
	}
	e := ingest.NewEngines(ctx, r, ingest.EngineConfig{Logger: log})
	for _, src := range c.ZMQ {
		if err := e.Add(src); err != nil {
			log.Error("engine source refused", "source", src.String(), "err", err)
		}
	}
	return e
}

// engineWatcher subscribes to the event endpoints workers register with (Dynamo's /register
// endpoint and replay_endpoint). Set once, before the HTTP API serves.
type engineWatcher struct {
	mu sync.Mutex
	e  *ingest.Engines
}

func (w *engineWatcher) set(e *ingest.Engines) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.e = e
}

func (w *engineWatcher) engines() *ingest.Engines {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.e
}

func (w *engineWatcher) Registered(g router.Registration) error {
	e := w.engines()
	if e == nil {
		return nil // approximate mode: no events to read
	}
	src := ingest.EngineSource{Worker: g.ID, Model: g.Model, Endpoint: g.Endpoint, Replay: g.Replay, Ranks: 1}
	if len(g.Ranks) > 0 {
		src.FirstRank, src.Ranks = slices.Min(g.Ranks), len(g.Ranks)
	}
	return e.Add(src)
}

func (w *engineWatcher) Unregistered(id uint64) {
	if e := w.engines(); e != nil {
		e.Remove(id)
	}
}

func (w *engineWatcher) close() {
	if e := w.engines(); e != nil {
		e.Close()
	}
}

// bridgeMain runs `kvrouterd bridge` until SIGTERM or SIGINT.
func bridgeMain(args []string) {
	c, err := parseBridgeConfig(args, os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvrouterd bridge:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := runBridge(ctx, c, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvrouterd bridge:", err)
		os.Exit(1)
	}
}
