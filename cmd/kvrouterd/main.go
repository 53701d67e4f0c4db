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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/lograte"
	"github.com/kvrouterd/kvrouterd/replica"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// processStart is when the process started, for the time to ready.
var processStart = time.Now()

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
	// Libraries the daemon embeds log every retry of a failing write; the log must stay readable.
	log := slog.New(lograte.New(c.logger(os.Stderr).Handler(), lograte.Config{}))
	// The HTTP address first: a bad or taken one fails the start at once, before NATS and the
	// restore. Connections wait in the backlog until the API serves.
	ln, err := net.Listen("tcp", c.HTTPAddr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %w", c.HTTPAddr, err)
	}
	defer ln.Close()
	if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
		return fmt.Errorf("--data-dir %s: %w", c.DataDir, err)
	}
	full := c.diskFull()
	if full != nil && !c.NoKVEvents && c.NATSURL == "" {
		return fmt.Errorf("%w: the embedded NATS server could store no event; free space, or give --nats-url", full)
	}
	mode, _ := scoring.ParseMode(c.RouterMode)
	watch := &engineWatcher{}
	defer watch.close()
	var share *replica.Sharer
	if c.ShareLoad && !c.NoKVEvents {
		var err error
		if share, err = replica.New(replica.Config{Prefix: c.NATSPrefix, Replica: c.ReplicaID, Logger: log}); err != nil {
			return fmt.Errorf("--replica-id: %w", err)
		}
	}
	newRouter := func() *router.Router {
		cfg := router.Config{
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
		}
		if share != nil {
			cfg.Share = share // never a typed nil
		}
		return router.New(cfg)
	}
	reg := prometheus.NewRegistry()
	var (
		p      *persist
		r      *router.Router
		resume uint64
	)
	if c.NoSnapshots {
		r = newRouter()
	} else {
		if p, err = openPersist(c, reg, log, full); err != nil {
			return err
		}
		defer p.close()
		if c.BootstrapFrom != "" {
			if err := p.bootstrap(ctx, c.BootstrapFrom); err != nil {
				return err
			}
		}
		if r, resume, err = p.restore(newRouter); err != nil {
			return err
		}
	}
	eng := engines(ctx, c, r, log)
	if eng != nil {
		reg.MustRegister(eng.Collector())
	}
	watch.set(eng)
	resubscribe(r, watch, log) // restored workers' engine endpoints
	startSeq := c.NATSStartSeq
	if startSeq == 0 && resume > 0 {
		startSeq = resume + 1
	}
	stream, err := startStream(ctx, c, r, reg, log, startSeq, func(from, to uint64) {
		n, err := r.ClearAll()
		if p != nil {
			p.gapClears.Inc()
		}
		log.Warn("event-stream sequences were lost: every worker's blocks cleared, to be rebuilt from the events that follow",
			"from", from, "to", to, "residencies", n, "err", err)
	})
	if err != nil {
		r.Close()
		return err
	}
	var shareConn *nats.Conn
	if share != nil && stream != nil {
		if shareConn, err = stream.Dial("kvrouterd-share", nats.NoEcho()); err == nil {
			err = share.Start(shareConn, r)
		}
		if err != nil {
			stream.Close()
			r.Close()
			return fmt.Errorf("load sharing: %w", err)
		}
		reg.MustRegister(share.Collector())
		log.Info("sharing load with the other replicas", "replica", share.Replica())
	}
	closeShare := func() {
		if share != nil && shareConn != nil {
			share.Close()
			shareConn.Close()
		}
	}
	lastSeq := func() uint64 {
		if stream == nil {
			return resume
		}
		return stream.Consumer.LastSeq()
	}
	scfg := server.Config{MaxBodyBytes: c.MaxBodyBytes, ReadBufferSize: c.HTTPReadBuffer, WriteBufferSize: c.HTTPWriteBuffer,
		MaxConns: c.HTTPMaxConns, MaxConnsPerIP: c.HTTPMaxConnsPerIP, IdleTimeout: c.HTTPIdleTimeout, Logger: log, Registry: reg}
	// Background work that ends before the stream and the router close.
	snapCtx, stopSnaps := context.WithCancel(ctx)
	var background sync.WaitGroup
	if p != nil {
		scfg.Snapshots = p.store
		scfg.Ready = append(scfg.Ready, server.ReadyCheck{Name: "disk", Check: p.diskReady},
			server.ReadyCheck{Name: "snapshots", Check: p.snapshotsReady})
		background.Go(func() { p.loop(snapCtx, r, c.SnapshotInterval, lastSeq) })
	}
	if stream != nil {
		cu := &catchUp{cons: stream.Consumer}
		scfg.Ready = append(scfg.Ready, server.ReadyCheck{Name: "catching up", Check: cu.ready})
		background.Go(func() { cu.watch(snapCtx, r, log) })
	}
	stopSnapshots := func() {
		stopSnaps()
		background.Wait()
	}
	if stream != nil {
		// Not ready while the events are not being read: NATS away, the stream deleted (until
		// it is created again) or changed in a way that cannot be set back.
		scfg.Ready = append(scfg.Ready, server.ReadyCheck{Name: "stream", Check: stream.Health})
	}
	srv := server.New(r, scfg)
	maxConns, perIP := srv.ConnLimits()
	log.Info("kvrouterd ready", "http", ln.Addr().String(), "nats", streamURL(stream), "resume_after_seq", resume,
		"http_max_conns", maxConns, "http_max_conns_per_ip", perIP, "shards", c.Shards, "mode", c.RouterMode, "block_size", c.BlockSize, "data_dir", c.DataDir,
		"since_start", time.Since(processStart))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err = <-served:
		stopSnapshots()
		closeShare()
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
	stopSnapshots()
	closeShare()
	stream.Close() // stops taking events; the ones taken are in the shard queues
	watch.close()
	if p != nil && p.readOnly == nil {
		// Every event up to lastSeq was handed over; the snapshot's copies wait for them.
		if err := p.write(r, lastSeq()); err != nil {
			log.Warn("the shutdown snapshot failed; the next start replays more of the stream", "err", err)
		}
	}
	r.Close() // applies every event accepted
	log.Info("stopped", "took", time.Since(start))
	return nil
}

// startStream connects to --nats-url, or starts the embedded server, and consumes the events;
// nil with --no-kv-events.
func startStream(ctx context.Context, c config, r *router.Router, reg *prometheus.Registry, log *slog.Logger,
	startSeq uint64, onGap func(from, to uint64)) (*ingest.Stream, error) {
	if c.NoKVEvents {
		return nil, nil
	}
	var opts []nats.Option
	if c.NATSURL != "" {
		opts = c.NATS.options() // credentials and TLS are for an external server
	}
	st, err := ingest.StartStream(ctx, r, ingest.StreamConfig{
		URL:      c.NATSURL,
		Embedded: ingest.EmbeddedConfig{Dir: filepath.Join(c.DataDir, "nats"), Listen: c.NATSListen, NoAuth: c.NATSNoAuth},
		Options:  opts,
		Consumer: ingest.ConsumerConfig{
			Prefix: c.NATSPrefix, Stream: c.NATSStream, MaxAge: c.NATSMaxAge, MaxBytes: c.NATSMaxBytes,
			Replicas: c.NATSReplicas, StartSeq: startSeq, OnGap: onGap,
		},
	}, log)
	if errors.Is(err, ingest.ErrEmbeddedListen) {
		return nil, fmt.Errorf("--nats-listen %s: %w", c.NATSListen, err)
	}
	if err != nil {
		return nil, err
	}
	reg.MustRegister(st.Consumer.Collector())
	switch {
	case st.Credentials != nil:
		pf := st.Credentials.Publisher.File
		log.Info("the embedded NATS server takes only its users: publishers connect as user publisher with the password in "+pf+
			" (one line user:password, for the URL's user info), or kvrouterd bridge --nats-user-file "+pf,
			"publisher_url", "nats://publisher:<password>@"+strings.TrimPrefix(st.URL, "nats://"), "publisher_file", pf)
	case c.NATSURL == "":
		log.Warn("the embedded NATS server takes anonymous clients (--nats-no-auth): any process that reaches " + st.URL +
			" can inject events, purge or delete the stream")
	}
	return st, nil
}

// diskFull says why --data-dir's filesystem is too full to write snapshots, or nil: it has
// --min-free-disk free, or its free space is not known.
func (c *config) diskFull() error {
	free, err := diskFree(c.DataDir)
	if err != nil || free >= uint64(c.MinFreeDisk) {
		return nil
	}
	return fmt.Errorf("disk full: %s has %.1f MiB free, under --min-free-disk %.1f MiB",
		c.DataDir, float64(free)/(1<<20), float64(c.MinFreeDisk)/(1<<20))
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
	e := ingest.NewEngines(ctx, r, c.ZMQLimits.apply(ingest.EngineConfig{Logger: log}))
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

// resubscribe tells w of the engine endpoints of r's workers (restored from a snapshot).
func resubscribe(r *router.Router, w *engineWatcher, log *slog.Logger) {
	byID := map[uint64]*router.Registration{}
	var ids []uint64
	for _, wi := range r.Workers() {
		if wi.Endpoint == "" {
			continue
		}
		g := byID[wi.ID]
		if g == nil {
			g = &router.Registration{ID: wi.ID, Model: wi.Model, Endpoint: wi.Endpoint, Replay: wi.Replay}
			byID[wi.ID] = g
			ids = append(ids, wi.ID)
		}
		g.Ranks = append(g.Ranks, wi.Rank)
	}
	for _, id := range ids {
		if err := w.Registered(*byID[id]); err != nil {
			log.Warn("restored worker's event endpoint refused", "worker", id, "err", err)
		}
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
