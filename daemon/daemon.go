package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/frontdoor"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/lograte"
	"github.com/kvrouterd/kvrouterd/replica"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/kvrouterd/kvrouterd/ui"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// processStart is when the process started, for the time to ready.
var processStart = time.Now()

// Daemon is a started kvrouterd: its HTTP API serving, its index restored, its events read.
// Start makes one and Wait runs it to the end; both are for one goroutine, one call each.
// Addr may be called from any goroutine.
type Daemon struct {
	c    Config
	log  *slog.Logger
	ln   net.Listener
	sel  net.Listener // Dynamo's selection service; nil when off
	fdLn net.Listener // the front door; nil when off
	stLn net.Listener // Dynamo's slot tracker; nil when off
	adm  net.Listener // the admin listener (pprof); nil when off
	cred credentials  // tokens and certificate, nil when not configured
	fd   *fasthttp.Server
	srv  *server.Server
	r    *router.Router
	p    *persist // nil with --no-snapshots
	st   *ingest.Stream
	seq  uint64     // the stream sequence restored up to
	done chan error // each Serve's end
	// serving is how many Serves send to done.
	serving int
	// logFile is --log-file's, nil when logging to stderr.
	logFile *logFile

	// undo is what Start did, undone in reverse order by a failed Start and by Wait.
	undo undo
	// graceful is set by a shutdown that finished the requests in flight: its last snapshot is
	// written. A start that fails and a server that fails write none.
	graceful bool
}

// Run starts the daemon and serves until ctx ends, then shuts down gracefully: stop accepting,
// finish the requests in flight, apply every accepted event, write a last snapshot. It logs to
// stderr. An error names the flag to change when one is at fault.
func Run(ctx context.Context, c Config, stderr io.Writer) error {
	d, err := Start(ctx, c, stderr)
	if err != nil {
		return err
	}
	return d.Wait(ctx)
}

// Start starts the daemon's parts in order, each failing at once with an error that names the
// flag to change: the HTTP address, the data directory, the snapshot store and its restore,
// the engine subscriptions, the event stream, load sharing, then the API. A Start that fails
// has undone what it started, in reverse order: no goroutine, file or port is left. ctx bounds
// the daemon's background work; Wait ends it.
func Start(ctx context.Context, c Config, stderr io.Writer) (_ *Daemon, err error) {
	d := &Daemon{c: c, done: make(chan error, 3)}
	// Libraries the daemon embeds log every retry of a failing write; the log must stay readable.
	logOut := stderr
	if c.LogFile != "" {
		lf, err := openLogFile(c.LogFile)
		if err != nil {
			return nil, fmt.Errorf("--log-file: %w", err)
		}
		d.logFile, logOut = lf, lf
		d.undo.push(func() { lf.close() }) // the first pushed, the last undone: after every log line
	}
	plain := NewLogger(logOut, c.LogLevel, c.LogFormat)
	d.log = slog.New(lograte.New(plain.Handler(), lograte.Config{}))
	log := d.log
	warnIgnored(plain, c.DynamoIgnored)
	defer func() {
		if err != nil {
			d.undo.run()
		}
	}()
	if c.TransparentHugePages == "off" {
		// Before the restore, most of a start's time, which huge pages made about 2.4 times slower
		// (docs/performance.md, "Restart").
		if err := setTHPOff(true); err != nil {
			log.Warn("could not keep transparent huge pages out of the daemon's memory: a restore may be slower (--transparent-huge-pages)", "host_mode", hostTHP(), "err", err)
		} else if m := hostTHP(); m == "always" {
			log.Info("transparent huge pages kept out of the daemon's memory (--transparent-huge-pages)", "host_mode", m)
		}
	}
	// The HTTP address first: a bad or taken one fails the start at once, before NATS and the
	// restore. Connections wait in the backlog until the API serves.
	if d.ln, err = net.Listen("tcp", c.HTTPAddr); err != nil {
		return nil, fmt.Errorf("--http-addr %s: %w", c.HTTPAddr, err)
	}
	d.undo.push(func() { d.ln.Close() })
	if c.FrontendAddr != "" {
		if d.fdLn, err = net.Listen("tcp", c.FrontendAddr); err != nil {
			return nil, fmt.Errorf("--frontend-addr %s: %w", c.FrontendAddr, err)
		}
		d.undo.push(func() { d.fdLn.Close() })
	}
	if c.SelectionAddr != "" {
		if d.sel, err = net.Listen("tcp", c.SelectionAddr); err != nil {
			return nil, fmt.Errorf("--selection-addr %s: %w", c.SelectionAddr, err)
		}
		d.undo.push(func() { d.sel.Close() })
	}
	if c.SlotTrackerAddr != "" {
		if d.stLn, err = net.Listen("tcp", c.SlotTrackerAddr); err != nil {
			return nil, fmt.Errorf("--slot-tracker-addr %s: %w", c.SlotTrackerAddr, err)
		}
		d.undo.push(func() { d.stLn.Close() })
	}
	if c.Security.AdminAddr != "" {
		if d.adm, err = net.Listen("tcp", c.Security.AdminAddr); err != nil {
			return nil, fmt.Errorf("--admin-addr %s: %w", c.Security.AdminAddr, err)
		}
		d.undo.push(func() { d.adm.Close() })
	}
	if d.cred, err = c.Security.load(); err != nil {
		return nil, err
	}
	if d.cred.keys != nil {
		log.Info("worker API keys loaded; they win over the keys workers register (--worker-api-keys-file)",
			"file", d.cred.keys.Path(), "keys", d.cred.keys.Len())
	}
	if err := checkDataDir(c.DataDir); err != nil {
		return nil, err
	}
	full := c.diskFull()
	if full != nil && !c.NoKVEvents && c.NATSURL == "" {
		return nil, fmt.Errorf("%w: the embedded NATS server could store no event; free space, or give --nats-url", full)
	}
	mode, _ := scoring.ParseMode(c.RouterMode)
	cost := c.cost()
	if c.RouterCost == "auto" && cost != scoring.CostTTFT {
		log.Info("--router-cost auto: a Dynamo weight or preset is given, so the kv mode's cost is Dynamo's", "cost", cost.String())
	}
	terms := c.terms()
	disagg, err := c.disagg()
	if err != nil {
		return nil, err
	}
	tierCredit := c.tierCredit()
	tracking, err := c.trackingKey()
	if err != nil {
		return nil, err
	}
	if tracking != nil {
		log.Info("active blocks are booked under keyed tracking identities", "tracking_hash", c.RouterTrackingHash, "key_id", tracking.ID())
	}
	watch := &engineWatcher{}
	var share *replica.Sharer
	if c.ShareLoad && !c.NoKVEvents {
		if share, err = replica.New(replica.Config{Prefix: c.NATSPrefix, Replica: c.ReplicaID, Logger: log}); err != nil {
			return nil, fmt.Errorf("--replica-id: %w", err)
		}
	}
	newRouter := func() *router.Router {
		cfg := router.Config{
			BlockSize:         c.BlockSize,
			Mode:              mode,
			OverlapWeight:     c.OverlapScoreWeight,
			NoOverlapWeight:   c.OverlapScoreWeight == 0,
			Temperature:       c.RouterTemperature,
			NoTrackPrefill:    !c.TrackPrefillTokens,
			Cost:              cost,
			Terms:             &terms,
			CacheWeight:       cacheWeight(c.CacheWeight),
			DecayPrefill:      c.PrefillLoadModel == "aic",
			TierCredit:        &tierCredit,
			NoAssumeReuse:     c.NoAssumeKVReuse || c.LoadAware,
			TrackOutputBlocks: c.TrackOutputBlocks,
			TrackingKey:       tracking,
			Queue:             c.queue(),
			Affinity:          c.affinity(),
			PredictedTTL:      c.PredictedTTL,
			Disagg:            disagg,
			RequestExpiry:     c.RequestExpiry,
			MaxCandidates:     c.MaxCandidates,
			Busy:              c.BusyThresholds(),
			Shards:            c.Shards,
			QueueLen:          c.QueueLen,
			MaxBlocks:         c.MaxBlocks,
			MaxIndexBytes:     c.MaxIndexBytes,
			WorkerTimeout:     c.WorkerTimeout,
			ClearOnGap:        c.ClearOnGap,
			KeepTree:          c.KeepBlockTree,
			Approximate:       c.approx(),
			Endpoints:         watch,
			Sources:           watch,
			APIKeys:           d.cred.apiKeys(),
			Eject: router.EjectConfig{Off: !c.WorkerEject, Consecutive: c.WorkerEjectFailures,
				BaseTime: c.WorkerEjectBaseTime, MaxTime: c.WorkerEjectMaxTime, MaxPercent: c.WorkerEjectMaxPercent},
			Logger: log,
		}
		if share != nil {
			cfg.Share = share // never a typed nil
		}
		return router.New(cfg)
	}
	reg := prometheus.NewRegistry()
	build := c.Build
	if build.Version == "" {
		build = ReadBuild("")
	}
	reg.MustRegister(build.collector())
	if c.NoSnapshots {
		d.r = newRouter()
	} else {
		if d.p, err = openPersist(c, reg, log, full); err != nil {
			return nil, err
		}
		d.undo.push(func() { d.p.close() })
		if c.BootstrapFrom != "" {
			if err := d.p.bootstrap(ctx, c.BootstrapFrom); err != nil {
				return nil, fmt.Errorf("--bootstrap-from: %w", err)
			}
		}
		if d.r, d.seq, err = d.p.restore(newRouter); err != nil {
			return nil, err
		}
	}
	d.undo.push(func() { d.r.Close() }) // applies every event accepted
	d.undo.push(d.lastSnapshot)
	eng := engines(ctx, c, d.r, log)
	if eng != nil {
		reg.MustRegister(eng.Collector())
	}
	watch.set(eng)
	d.undo.push(watch.close)
	resubscribe(d.r, watch, log) // restored workers' engine endpoints
	startSeq := c.NATSStartSeq
	if startSeq == 0 && d.seq > 0 {
		startSeq = d.seq + 1
	}
	if d.st, err = d.startStream(ctx, reg, startSeq); err != nil {
		return nil, err
	}
	if d.st != nil {
		d.undo.push(d.st.Close) // stops taking events; the ones taken are in the shard queues
	}
	if share != nil && d.st != nil {
		// A connection of its own, without echo: this replica's messages do not come back.
		nc, err := d.st.Dial("kvrouterd-share", nats.NoEcho())
		if err != nil {
			return nil, fmt.Errorf("load sharing: %w", err)
		}
		d.undo.push(nc.Close)
		if err := share.Start(nc, d.r); err != nil {
			return nil, fmt.Errorf("load sharing: %w", err)
		}
		d.undo.push(share.Close)
		reg.MustRegister(share.Collector())
		log.Info("sharing load with the other replicas", "replica", share.Replica())
	}
	scfg := server.Config{MaxBodyBytes: c.MaxBodyBytes, ReadBufferSize: c.HTTPReadBuffer, WriteBufferSize: c.HTTPWriteBuffer,
		MaxConns: c.HTTPMaxConns, MaxConnsPerIP: c.HTTPMaxConnsPerIP, IdleTimeout: c.HTTPIdleTimeout, Logger: log, Registry: reg,
		SelectionCacheTTL: c.SelectionCacheTTL, SelectionCacheMaxEntries: c.SelectionCacheMaxEntries, NoKVEvents: c.NoKVEvents,
		OverloadStatus: c.OverloadStatus, Tokens: d.cred.tokens, RouterID: c.ReplicaID,
		ControlRate: c.Security.ControlRate, ControlBurst: c.Security.ControlBurst, EventsRate: c.Security.EventsRate, EventsBurst: c.Security.EventsBurst}
	if share != nil {
		scfg.RouterID = share.Replica() // the random one when --replica-id is unset
	}
	// Background work that ends before the stream and the router close.
	bgCtx, stopBackground := context.WithCancel(ctx)
	var background sync.WaitGroup
	d.undo.push(func() {
		stopBackground()
		background.Wait()
	})
	background.Go(func() { d.cred.watch(bgCtx, c.Security.ReloadInterval, log) })
	if d.p != nil {
		scfg.Snapshots = d.p.store
		scfg.Ready = append(scfg.Ready, server.ReadyCheck{Name: "disk", Check: d.p.diskReady},
			server.ReadyCheck{Name: "snapshots", Check: d.p.snapshotsReady})
		background.Go(func() { d.p.loop(bgCtx, d.r, c.SnapshotInterval, d.lastSeq) })
	}
	if d.st != nil {
		cu := &catchUp{cons: d.st.Consumer}
		// Not ready while the events are not being read: NATS away, the stream deleted (until
		// it is created again) or changed in a way that cannot be set back.
		scfg.Ready = append(scfg.Ready, server.ReadyCheck{Name: "catching up", Check: cu.ready},
			server.ReadyCheck{Name: "stream", Check: d.st.Health})
		background.Go(func() { cu.watch(bgCtx, d.r, log) })
		// Registrations and events posted over HTTP go through the stream, so that every
		// replica makes them; each is answered once this replica has.
		if scfg.Changes, err = ingest.NewJournal(d.st.Consumer, d.st.Conn, d.r, 0); err != nil {
			return nil, err
		}
	}
	if d.logFile != nil {
		scfg.ReopenLogs = d.logFile.reopen
	}
	if c.TestEndpoints {
		log.Warn("Dynamo's listener-control test endpoints are mounted (POST /test/pause_listener, /test/resume_listener): " +
			"they stop and restart workers' event subscriptions; never enable them in production (--kv-indexer-test-endpoints)")
		scfg.Listeners = &listenerControl{r: d.r, w: watch}
	}
	page := ui.Config{Router: d.r, RouterQueue: c.queue() != nil, Started: processStart,
		// d.srv is set below, before the API serves the page's first request.
		HitRate: func() (float64, uint64) { return d.srv.HitRate() }}
	if d.p != nil {
		page.LastSnapshot = d.p.newestTime
	}
	scfg.UI = ui.New(page).Handle
	d.srv = server.New(d.r, scfg)
	if c.Peers != "" {
		// As a Dynamo indexer does before it serves; none answering is no failure: it starts
		// empty.
		_, _ = d.srv.RecoverFromPeers(ctx, splitList(c.Peers), 10*time.Second)
	}
	if d.fdLn != nil {
		door := frontdoor.New(d.r, frontdoor.Config{Logger: log, Registry: reg, Retries: c.FrontendRetries, Timeout: c.FrontendTimeout, OverloadStatus: c.OverloadStatus, Tokens: d.cred.tokens})
		d.undo.push(door.Close)
		// The API's transport settings, but for the write timeout: a streamed answer may last
		// minutes (--frontend-timeout bounds it).
		d.fd = server.HTTPServer(door.Handle, scfg)
		d.fd.WriteTimeout = 0
		// Refusals before the handler (a body over --max-body-bytes, a timeout, a malformed
		// request) in OpenAI's error shape, as the door's own.
		d.fd.ErrorHandler = door.TransportError
		d.srv.AdoptFrontDoor(d.fd)
	}
	maxConns, perIP := d.srv.ConnLimits()
	log.Info("kvrouterd ready", "version", build.Version, "cost", c.cost().String(), "http", d.ln.Addr().String(), "selection", d.selectionAddr(), "frontend", c.FrontendAddr, "nats", streamURL(d.st), "resume_after_seq", d.seq,
		"http_max_conns", maxConns, "http_max_conns_per_ip", perIP, "shards", c.Shards, "mode", c.RouterMode, "block_size", c.BlockSize, "data_dir", c.DataDir,
		"since_start", time.Since(processStart))
	d.serving = 1
	go func() { d.done <- d.srv.Serve(d.cred.listen(d.ln)) }()
	if d.sel != nil {
		d.serving++
		go func() { d.done <- d.srv.ServeSelection(d.cred.listen(d.sel)) }()
	}
	if d.stLn != nil {
		d.serving++
		go func() { d.done <- d.srv.ServeSlotTracker(d.cred.listen(d.stLn)) }()
	}
	if d.fd != nil {
		d.serving++
		// Within the API's connection limits: the front door's listener rides out the open-file
		// limit and every accept error as the API's does.
		go func() { d.done <- d.srv.ServeFrontDoor(d.cred.listen(d.fdLn)) }()
	}
	if d.adm != nil {
		// Not in serving: a failed admin listener is logged, not the daemon's end.
		adm := &http.Server{Handler: d.cred.adminHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		d.undo.push(func() { adm.Close() })
		go func() {
			if err := adm.Serve(server.KeepAccepting(d.adm, "admin", log)); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin listener failed", "addr", d.adm.Addr().String(), "err", err)
			}
		}()
	}
	return d, nil
}

// Addr is the HTTP API's address.
func (d *Daemon) Addr() net.Addr { return d.ln.Addr() }

// FrontendAddr is the front door's address; nil when it is off.
func (d *Daemon) FrontendAddr() net.Addr {
	if d.fdLn == nil {
		return nil
	}
	return d.fdLn.Addr()
}

// AdminAddr is the admin listener's address; nil when it is off.
func (d *Daemon) AdminAddr() net.Addr {
	if d.adm == nil {
		return nil
	}
	return d.adm.Addr()
}

// SelectionAddr is the selection service's address; nil when it is off.
func (d *Daemon) SelectionAddr() net.Addr {
	if d.sel == nil {
		return nil
	}
	return d.sel.Addr()
}

// selectionAddr is what the log says of the selection service.
func (d *Daemon) selectionAddr() string {
	if d.sel == nil {
		return "off"
	}
	return d.sel.Addr().String()
}

// Wait serves until ctx ends, then shuts down gracefully (see Run); or until serving fails (the
// API or the selection service), then undoes the start and returns why.
func (d *Daemon) Wait(ctx context.Context) error {
	select {
	case err := <-d.done:
		d.undo.run() // closes the other listener: its Serve ends, into done's room
		return err
	case <-ctx.Done():
	}
	d.log.Info("shutting down: finishing requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), d.c.ShutdownTimeout)
	defer cancel()
	start := time.Now()
	// Requests waiting in the router queue would hold the shutdown for their whole wait: they
	// are refused now (503), as new ones are from here on.
	d.r.RefuseWaiting()
	// The front door's streams end beside the API's requests.
	if err := d.srv.Shutdown(sctx); err != nil {
		d.log.Warn("requests still in flight at the shutdown timeout", "err", err)
	}
	for range d.serving {
		<-d.done
	}
	d.graceful = true
	d.undo.run()
	d.log.Info("stopped", "took", time.Since(start))
	return nil
}

// lastSeq is the stream sequence every event up to which has been handed to the router.
func (d *Daemon) lastSeq() uint64 {
	if d.st == nil {
		return d.seq
	}
	return d.st.Consumer.LastSeq()
}

// lastSnapshot writes the snapshot of a graceful shutdown, once the events stopped coming and
// before the router closes: every event up to lastSeq was handed over, and the snapshot's
// copies wait for them.
func (d *Daemon) lastSnapshot() {
	if !d.graceful || d.p == nil || d.p.readOnly != nil {
		return
	}
	if err := d.p.write(d.r, d.lastSeq()); err != nil {
		d.log.Warn("the shutdown snapshot failed; the next start replays more of the stream", "err", err)
	}
}

// undo is a stack of what a start did, undone last first. For the goroutine that starts and
// stops the daemon.
type undo []func()

func (u *undo) push(f func()) { *u = append(*u, f) }

// run undoes everything pushed, in reverse order, once.
func (u *undo) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
	*u = nil
}

// checkDataDir creates --data-dir if missing and checks that the daemon can write in it.
func checkDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--data-dir %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".kvrouterd-probe-*")
	if errors.Is(err, syscall.ENOSPC) {
		return nil // full: the start goes on read-only, or stops naming --min-free-disk
	}
	if err != nil {
		return fmt.Errorf("--data-dir %s: not writable: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// startStream connects to --nats-url, or starts the embedded server, and consumes the events;
// nil with --no-kv-events.
func (d *Daemon) startStream(ctx context.Context, reg *prometheus.Registry, startSeq uint64) (*ingest.Stream, error) {
	c, log, r := d.c, d.log, d.r
	if c.NoKVEvents {
		return nil, nil
	}
	var opts []nats.Option
	if c.NATSURL != "" {
		opts = c.NATS.Options() // credentials and TLS are for an external server
	}
	onGap := func(from, to uint64) {
		n, err := r.ClearAll()
		if d.p != nil {
			d.p.gapClears.Inc()
		}
		log.Warn("event-stream sequences were lost: every worker's blocks cleared, to be rebuilt from the events that follow",
			"from", from, "to", to, "residencies", n, "err", err)
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
	switch {
	case errors.Is(err, ingest.ErrEmbeddedListen):
		return nil, fmt.Errorf("--nats-listen %s: %w", c.NATSListen, err)
	case errors.Is(err, ingest.ErrUnreachable):
		return nil, fmt.Errorf("--nats-url %s: %w", c.NATSURL, err)
	case err != nil:
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
func (c *Config) diskFull() error {
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

func (c *Config) approx() *approx.Config {
	if !c.NoKVEvents {
		return nil
	}
	return &approx.Config{TTL: c.ApproxTTL, MaxBlocks: c.ApproxMaxBlocks, PruneTarget: c.ApproxPruneTarget, LRU: c.ApproxCachePolicy == "lru"}
}

// cacheWeight is --router-cache-weight as router.Config takes it: 0 is none.
func cacheWeight(w float64) float64 {
	if w == 0 {
		return -1
	}
	return w
}
