package server

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/bearer"
	"github.com/kvrouterd/kvrouterd/internal/freelist"
	"github.com/kvrouterd/kvrouterd/internal/lograte"
	"github.com/kvrouterd/kvrouterd/internal/peer"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/snapshot"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"
)

// ContentType marks bodies in package wire's binary format.
const ContentType = wire.ContentType

// Config configures a Server. Zero values take the defaults listed.
type Config struct {
	// MaxBodyBytes bounds request bodies (8 MiB, Dynamo's limit); larger ones get 413.
	MaxBodyBytes int
	// ReadTimeout and WriteTimeout bound one request's I/O (30 s each; ReadTimeout also bounds
	// the wait for a new connection's first request); IdleTimeout closes idle keep-alive
	// connections (120 s).
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxConns bounds the open connections (DefaultMaxConns(FileLimit())). At the limit a new
	// connection closes the one idle longest, or is refused with 503 if none is idle.
	MaxConns int
	// MaxConnsPerIP bounds one client address's open connections (a quarter of MaxConns);
	// beyond it a new connection is refused with 503.
	MaxConnsPerIP int
	// Logger receives one line per refused request, at warn level (slog.Default()).
	Logger *slog.Logger
	// Registry is where the metrics are registered (a new registry).
	Registry *prometheus.Registry
	// Snapshots, if set, serves GET /v1/snapshot: the newest snapshot as a portable stream,
	// for a replica's --bootstrap-from.
	Snapshots *snapshot.Store
	// Ready lists the conditions /readyz checks, besides shutdown: the replica is ready while
	// every one of them holds.
	Ready []ReadyCheck
	// ReadBufferSize and WriteBufferSize are each connection's I/O buffers (16 KiB and 64
	// KiB), kept while it is open. A request or an answer that does not fit its buffer with its
	// header takes more than one system call: fasthttp's 4 KiB would split every 2,048-token
	// request and every answer of more than about 100 candidates in two.
	ReadBufferSize, WriteBufferSize int
	// Changes makes the registrations, their removals and the event batches the API is asked
	// for (the Router itself). The daemon gives an ingest.Journal, which sends them through the
	// event stream so that every replica makes them.
	Changes router.Changer
	// ReopenLogs, if set, reopens the daemon's log file (Dynamo's /reopen_logs, after a
	// rotation); without it /reopen_logs has nothing to do.
	ReopenLogs func() error
	// Listeners, if set, serves Dynamo's listener-control test endpoints (listeners.go).
	Listeners ListenerControl
	// SelectionCacheTTL and SelectionCacheMaxEntries bound the selection service's pending
	// selections (a /select with a selection_id, kept for a POST /reservations): 120 s and
	// 4,096, Dynamo's --selection-cache-ttl-secs and --selection-cache-max-entries.
	// SelectionCacheMaxBytes bounds their size (256 MiB, Dynamo's
	// --selection-cache-max-bytes).
	SelectionCacheTTL        time.Duration
	SelectionCacheMaxEntries int
	SelectionCacheMaxBytes   int64
	// OverloadStatus answers a route refused as every eligible worker, or the pinned one, is
	// overloaded (router.ErrOverloaded): 529, Dynamo's frontend's (its older releases: 503).
	OverloadStatus int
	// NoKVEvents says that workers publish no KV events (the daemon's approximate mode): the
	// selection service's catalog then needs no kv_events endpoint, as Dynamo's with KV events
	// off.
	NoKVEvents bool
	// Tokens, if set, requires a bearer token of it on every endpoint of the API and the
	// selection service but health, readiness and metrics: a read token for what changes
	// nothing, a write token for the rest (access.go). Nil: no authentication.
	Tokens *bearer.Tokens
	// ControlRate and ControlBurst bound the control plane's requests (registrations and
	// their removals, peers, thresholds, snapshots and dumps; both APIs together) to a token
	// bucket of ControlRate a second holding ControlBurst; over it, 429. EventsRate and
	// EventsBurst do the same for POST /v1/events. A rate ≤ 0: no limit.
	ControlRate  float64
	ControlBurst int
	EventsRate   float64
	EventsBurst  int
	// UI, if set, serves GET /ui and every path under /ui/: the status page (package ui), read
	// only. Without it they are 404. The server checks the method; UI sees only GETs.
	UI fasthttp.RequestHandler
	// RouterID, if set, labels Dynamo's routing-overhead histograms router_id, as Dynamo
	// labels each router instance's: the replica's id in load sharing. Empty: no label.
	RouterID string
}

// ReadyCheck is one condition of readiness. Check returns nil while it holds, otherwise why the
// replica is not ready (the reason /readyz writes); it is called on every /readyz, by the
// server's goroutines concurrently, so it must be cheap and safe for concurrent use.
type ReadyCheck struct {
	Name  string
	Check func() error
}

// withDefaults returns c with every unset field at its default.
func (c Config) withDefaults() Config {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 8 << 20
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns(FileLimit())
	}
	if c.MaxConnsPerIP <= 0 {
		c.MaxConnsPerIP = max(1, c.MaxConns/4)
	}
	if c.ReadBufferSize <= 0 {
		c.ReadBufferSize = 16 << 10
	}
	if c.WriteBufferSize <= 0 {
		c.WriteBufferSize = 64 << 10
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.SelectionCacheTTL <= 0 {
		c.SelectionCacheTTL = 120 * time.Second
	}
	if c.SelectionCacheMaxEntries <= 0 {
		c.SelectionCacheMaxEntries = 4096
	}
	if c.SelectionCacheMaxBytes <= 0 {
		c.SelectionCacheMaxBytes = 256 << 20
	}
	return c
}

// HTTPServer returns a fasthttp server serving h with the transport settings New gives the API
// for cfg (limits, timeouts, buffers; New adds its own error handler, which counts transport
// errors in its metrics, and its connection limits, which Serve applies): for a benchmark that
// puts another handler in the same transport.
func HTTPServer(h fasthttp.RequestHandler, cfg Config) *fasthttp.Server {
	cfg = cfg.withDefaults()
	return &fasthttp.Server{
		Handler:                      h,
		Name:                         "kvrouterd",
		MaxRequestBodySize:           cfg.MaxBodyBytes,
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 cfg.WriteTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		ReadBufferSize:               cfg.ReadBufferSize,
		WriteBufferSize:              cfg.WriteBufferSize,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		Logger:                       fasthttpLogger{cfg.Logger},
	}
}

// Server serves the HTTP API of one Router. Safe for concurrent use.
type Server struct {
	r   *router.Router
	ch  router.Changer // cfg.Changes, or r
	cfg Config
	log *slog.Logger
	// refusals logs refused requests, behind a rate limit (refusalLogger).
	refusals *slog.Logger
	m        *metrics
	srv      *fasthttp.Server
	selSrv   *fasthttp.Server // Dynamo's selection service (ServeSelection)
	fdSrv    *fasthttp.Server // the front door (AdoptFrontDoor); nil without one
	stSrv    *fasthttp.Server // Dynamo's slot tracker (ServeSlotTracker)
	st       *slotTracker
	sel      *selection
	ready    atomic.Bool
	conns    *conns
	bufs     *freelist.List[buffers]
	metrics  fasthttp.RequestHandler

	controlLim, eventsLim *rate.Limiter // nil: no limit

	// The unknown fields of Dynamo's bodies logged so far ("path name"), and how many.
	unknownSeen  sync.Map
	unknownCount atomic.Int64

	// peers are the peer URLs of Dynamo's /register_peer, informational as Dynamo's are.
	peersMu sync.Mutex
	peers   map[string]struct{} // REQUIRES peersMu
}

// buffers is one request's reusable decode and encode state.
type buffers struct {
	req  wire.RouteRequest
	resp wire.RouteResponse
	ev   wire.EventBatch
	out  []byte // the events answer (a route answer is encoded into the response's own body)
	oc   []shard.Outcome
	h    radix.Hasher // Dynamo's /query hashes its tokens here

	// conn is the connection of the request a queued route waits for; isGone, bound once,
	// looks at it (peer.Gone) without a closure per request.
	conn   net.Conn
	isGone func() bool
}

// gone returns the function RouteWait polls while the request waits in the router queue.
func (b *buffers) gone(ctx *fasthttp.RequestCtx) func() bool {
	b.conn = ctx.Conn()
	if b.isGone == nil {
		b.isGone = func() bool { return b.conn != nil && peer.Gone(b.conn) }
	}
	return b.isGone
}

// statusClientGone answers a request whose client left while it waited (nobody reads it; the
// status is for the logs and metrics, as nginx's 499).
const statusClientGone = 499

// sessionHeader carries a session id on the JSON route API (Dynamo's header).
const sessionHeader = "X-Dynamo-Session-ID"

// New returns a Server for r.
func New(r *router.Router, cfg Config) *Server {
	cfg = cfg.withDefaults()
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if files := FileLimit(); uint64(cfg.MaxConns)+fileReserve > files {
		cfg.Logger.Warn(fmt.Sprintf("the connection limit leaves the daemon's other files fewer than %d of the open-file limit: "+
			"out of files, HTTP accepts close idle connections or wait", fileReserve), "max_conns", cfg.MaxConns, "open_file_limit", files)
	}
	s := &Server{r: r, ch: cfg.Changes, cfg: cfg, log: cfg.Logger, refusals: refusalLogger(cfg.Logger)}
	if s.ch == nil {
		s.ch = r
	}
	s.m = newMetrics(cfg.Registry, r, cfg.RouterID)
	r.SetPhaseObserver(s.m.dyn)
	s.metrics = metricsHandler(cfg.Registry)
	s.bufs = freelist.New[buffers]()
	s.srv = HTTPServer(s.Handle, cfg)
	s.srv.ErrorHandler = s.transportError
	s.srv.HeaderReceived = func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
		limit, _ := s.apiBodyLimit(h.RequestURI(), h.Method())
		return fasthttp.RequestConfig{MaxRequestBodySize: limit}
	}
	s.controlLim, s.eventsLim = newLimiter(cfg.ControlRate, cfg.ControlBurst), newLimiter(cfg.EventsRate, cfg.EventsBurst)
	s.conns = newConns(cfg.MaxConns, cfg.MaxConnsPerIP, cfg.Logger)
	s.conns.maxBody = cfg.MaxBodyBytes
	s.srv.ConnState = s.conns.connState
	// The limit is conns': fasthttp's own (a worker per connection) must never refuse first,
	// also while a closed connection's worker is still being released.
	s.srv.Concurrency = max(fasthttp.DefaultConcurrency, 2*cfg.MaxConns)
	s.sel = newSelection(cfg)
	s.selSrv = HTTPServer(s.HandleSelection, cfg)
	s.selSrv.ErrorHandler, s.selSrv.ConnState, s.selSrv.Concurrency = s.selTransportError, s.conns.connState, s.srv.Concurrency
	s.selSrv.HeaderReceived = func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
		limit, _ := s.selectionBodyLimit(h.RequestURI(), h.Method())
		return fasthttp.RequestConfig{MaxRequestBodySize: limit}
	}
	s.st, s.stSrv = newSlotTracker(), s.newSlotTrackerServer()
	cfg.Registry.MustRegister(connCollector{s.conns})
	s.ready.Store(true)
	return s
}

// ConnLimits are the connection limits in effect: Config's, or their defaults.
func (s *Server) ConnLimits() (total, perIP int) { return s.cfg.MaxConns, s.cfg.MaxConnsPerIP }

// Serve accepts connections on ln until Shutdown, within Config.MaxConns and MaxConnsPerIP
// over every listener it serves. A process out of files does not end it: Accept waits and
// tries again.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(s.conns.listener(ln, lnAPI)) }

// AdoptFrontDoor makes srv, the front door's server (made by HTTPServer), one of the Server's:
// ServeFrontDoor serves it within the same connection limits as Serve's listeners, and Shutdown
// shuts it down with them. It sets srv's ConnState and Concurrency. Call it once, before any
// Serve and Shutdown, from the goroutine that made s.
func (s *Server) AdoptFrontDoor(srv *fasthttp.Server) {
	srv.ConnState, srv.Concurrency = s.conns.connState, s.srv.Concurrency
	s.fdSrv = srv
}

// ServeFrontDoor serves the front door's server (AdoptFrontDoor) on ln until Shutdown, within
// the connection limits of Serve's listeners: one budget for the process's files, so that a
// flood on any listener closes idle connections of all to make room, and no accept error but
// the listener's close ends it. Its connections are counted under listener="frontdoor".
func (s *Server) ServeFrontDoor(ln net.Listener) error {
	return s.fdSrv.Serve(s.conns.listener(ln, lnFrontDoor))
}

// Shutdown stops accepting connections, on Serve's listeners, ServeSelection's and
// ServeFrontDoor's, and waits for requests in flight (the front door's streams too) to finish,
// closing idle connections. /readyz and the selection service's /ready report 503 from its start.
func (s *Server) Shutdown(ctx context.Context) error {
	s.ready.Store(false)
	// fasthttp closes connections idle between requests, but takes one still waiting for its
	// first request for a request in flight, until its read timeout: held open by idle
	// clients, they would stretch every shutdown to the read timeout.
	stop := make(chan struct{})
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		s.conns.closeIdle(stop, shutdownGrace)
	}()
	var selErr, fdErr, stErr error
	var others sync.WaitGroup
	others.Go(func() { selErr = s.selSrv.ShutdownWithContext(ctx) })
	others.Go(func() { stErr = s.stSrv.ShutdownWithContext(ctx) })
	if s.fdSrv != nil {
		others.Go(func() { fdErr = s.fdSrv.ShutdownWithContext(ctx) })
	}
	err := s.srv.ShutdownWithContext(ctx)
	others.Wait()
	close(stop)
	<-closed
	return cmp.Or(err, selErr, fdErr, stErr)
}

// readyz answers 200 "ready" while the server is not shutting down and every Config.Ready
// check holds; otherwise 503 with one line per failed condition, "name: reason".
func (s *Server) readyz(ctx *fasthttp.RequestCtx) {
	var body []byte
	if !s.ready.Load() {
		body = append(body, "shutting down\n"...)
	}
	for _, c := range s.cfg.Ready {
		if err := c.Check(); err != nil {
			body = fmt.Appendf(body, "%s: %v\n", c.Name, err)
		}
	}
	if body != nil {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBody(body)
		return
	}
	ctx.SetBodyString("ready\n")
}

// transportError answers requests fasthttp refuses before the handler: oversized or unreadable.
func (s *Server) transportError(ctx *fasthttp.RequestCtx, err error) {
	s.refuseTransport(ctx, err, false)
}

// selTransportError is transportError for the selection service.
func (s *Server) selTransportError(ctx *fasthttp.RequestCtx, err error) {
	s.refuseTransport(ctx, err, true)
}

func (s *Server) refuseTransport(ctx *fasthttp.RequestCtx, err error, selection bool) {
	if cn, ok := ctx.Conn().(*conn); ok && cn.Idle() {
		// Not a byte of a request came: the connection timed out idle, its client left, or
		// it was closed to admit another (counted then). Nothing to count or log per
		// connection, which a flood of idle connections would turn into a flood of lines.
		ctx.SetStatusCode(fasthttp.StatusRequestTimeout)
		ctx.SetConnectionClose()
		return
	}
	status, reason, field := fasthttp.StatusBadRequest, "unreadable", "body"
	msg := ""
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, reason = fasthttp.StatusRequestEntityTooLarge, "too_large"
		msg = "body: " + s.bodyTooLarge(ctx, selection)
	case errors.As(err, &small):
		status, reason, field = fasthttp.StatusRequestHeaderFieldsTooLarge, "headers_too_large", "headers"
		msg = fmt.Sprintf("headers: larger than the read buffer of %d bytes; send smaller headers, or raise --http-read-buffer", s.cfg.ReadBufferSize)
	}
	if msg == "" {
		msg = field + ": " + err.Error()
	}
	s.m.rejected.WithLabelValues("any", reason).Inc()
	s.m.requests.countOther("any", status)
	s.refusals.Warn("request refused", "reason", reason, "err", msg, "remote", ctx.RemoteAddr().String())
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendError(nil, msg, field, -1))
}

// Handle serves one request; it is the fasthttp handler (tests may call it directly).
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	if s.cfg.Tokens != nil && !s.authorized(ctx, apiAccess(ctx.Path(), ctx.Method()), s.apiRefusal) {
		s.m.observe(ctx.ConnID(), epOther, ctx.Response.StatusCode(), time.Since(start).Seconds())
		return
	}
	ep := s.dispatch(ctx)
	secs := time.Since(start).Seconds()
	s.m.observe(ctx.ConnID(), ep, ctx.Response.StatusCode(), secs)
	if ep == epDynamo || ep == epHealth || ep == epMetrics {
		if route, ok := dynIndexerRoute(ctx.Path()); ok {
			s.m.dyn.indexerRequest(route, ctx.Method(), ctx.Response.StatusCode(), secs)
		}
	}
}

var (
	pRoute     = []byte("/v1/route")
	pMatch     = []byte("/v1/match")
	pEvents    = []byte("/v1/events")
	pWorkers   = []byte("/v1/workers")
	pWorkersS  = []byte("/v1/workers/")
	pRequests  = []byte("/v1/requests/")
	pUI        = []byte("/ui")
	sPrefill   = []byte("/prefill_done")
	sComplete  = []byte("/complete")
	sOutput    = []byte("/output")
	mPost      = []byte("POST")
	mGet       = []byte("GET")
	mDelete    = []byte("DELETE")
	binaryType = []byte(ContentType)
)

func (s *Server) dispatch(ctx *fasthttp.RequestCtx) endpoint {
	path, method := ctx.Path(), ctx.Method()
	switch {
	case bytes.Equal(path, pRoute):
		if s.method(ctx, epRoute, method, mPost) {
			s.route(ctx, true)
		}
		return epRoute
	case bytes.Equal(path, pMatch):
		if s.method(ctx, epMatch, method, mPost) {
			s.route(ctx, false)
		}
		return epMatch
	case bytes.HasPrefix(path, pRequests):
		rest := path[len(pRequests):]
		switch {
		case bytes.HasSuffix(rest, sPrefill):
			if s.method(ctx, epPrefillDone, method, mPost) {
				s.lifecycle(ctx, epPrefillDone, rest[:len(rest)-len(sPrefill)])
			}
			return epPrefillDone
		case bytes.HasSuffix(rest, sComplete):
			if s.method(ctx, epComplete, method, mPost) {
				s.lifecycle(ctx, epComplete, rest[:len(rest)-len(sComplete)])
			}
			return epComplete
		case bytes.HasSuffix(rest, sOutput):
			if s.method(ctx, epOutput, method, mPost) {
				s.output(ctx, rest[:len(rest)-len(sOutput)])
			}
			return epOutput
		}
	case bytes.Equal(path, pEvents):
		if s.method(ctx, epEvents, method, mPost) && s.allowed(ctx, s.eventsLim, "--events-rate-limit", s.apiRefusal) {
			s.events(ctx)
		}
		return epEvents
	case bytes.Equal(path, pWorkers):
		switch {
		case bytes.Equal(method, mGet):
			s.listWorkers(ctx)
		case s.method(ctx, epWorkers, method, mPost) && s.control(ctx):
			s.registerWorker(ctx)
		}
		return epWorkers
	case bytes.HasPrefix(path, pWorkersS):
		if s.method(ctx, epWorkers, method, mDelete) && s.control(ctx) {
			s.unregisterWorker(ctx, path[len(pWorkersS):])
		}
		return epWorkers
	case bytes.HasPrefix(path, pUI) && (len(path) == len(pUI) || path[len(pUI)] == '/'):
		switch {
		case s.cfg.UI == nil:
			s.reject(ctx, epUI, fasthttp.StatusNotFound, "not_found", "path", -1, "this kvrouterd serves no status page")
		case s.method(ctx, epUI, method, mGet):
			s.cfg.UI(ctx)
		}
		return epUI
	}
	switch string(path) {
	case "/healthz", "/health":
		ctx.SetStatusCode(fasthttp.StatusOK)
		if string(path) == "/healthz" {
			ctx.SetBodyString("ok\n")
		}
		return epHealth
	case "/readyz":
		s.readyz(ctx)
		return epHealth
	case "/metrics":
		s.metrics(ctx)
		return epMetrics
	case "/busy_threshold":
		if !controlPlane(path, method) || s.control(ctx) {
			s.busyThresholds(ctx)
		}
		return epBusy
	case "/v1/snapshot":
		if s.method(ctx, epSnapshot, method, mGet) && s.control(ctx) {
			s.snapshot(ctx)
		}
		return epSnapshot
	case "/test/pause_listener", "/test/resume_listener":
		s.testListener(ctx, string(path))
		return epDynamo
	case "/register", "/unregister", "/workers", "/query", "/query_by_hash", "/dump", "/register_peer", "/deregister_peer", "/peers", "/reopen_logs":
		if !controlPlane(path, method) || s.control(ctx) {
			s.dynamo(ctx, string(path))
		}
		return epDynamo
	}
	s.reject(ctx, epOther, fasthttp.StatusNotFound, "not_found", "path", -1, "no endpoint "+strconv.Quote(string(path)))
	return epOther
}

func (s *Server) method(ctx *fasthttp.RequestCtx, ep endpoint, got, want []byte) bool {
	if bytes.Equal(got, want) {
		return true
	}
	ctx.Response.Header.Set("Allow", string(want))
	s.reject(ctx, ep, fasthttp.StatusMethodNotAllowed, "method", "method", -1, "use "+string(want))
	return false
}

func binary(ctx *fasthttp.RequestCtx) bool {
	return bytes.HasPrefix(ctx.Request.Header.ContentType(), binaryType)
}

// reject answers a refused request: status, a JSON error naming the field (and the byte offset
// for binary bodies, -1 when it does not apply), a counter and a log line.
func (s *Server) reject(ctx *fasthttp.RequestCtx, ep endpoint, status int, reason, field string, offset int, msg string) {
	s.m.rejected.WithLabelValues(endpointNames[ep], reason).Inc()
	s.refusals.Warn("request refused", "endpoint", endpointNames[ep], "status", status, "reason", reason,
		"field", field, "offset", offset, "error", msg, "remote", ctx.RemoteAddr().String())
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendError(ctx.Response.Body()[:0], msg, field, offset))
}

// refusalLogger is l behind a rate limit (package lograte: a few lines of a message, then one
// per interval saying how many it dropped), unless l's handler has one already, as the daemon's
// does: a client sending bad requests in a loop must not flood the log, and
// kvrouterd_http_rejected_total counts every one.
func refusalLogger(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(*lograte.Handler); ok {
		return l
	}
	return slog.New(lograte.New(l.Handler(), lograte.Config{}))
}

// fail maps an error of package router or wire to a refusal.
func (s *Server) fail(ctx *fasthttp.RequestCtx, ep endpoint, err error) {
	var je *jsonError
	if errors.As(err, &je) {
		s.reject(ctx, ep, fasthttp.StatusBadRequest, "json", je.field, je.offset, je.msg)
		return
	}
	var we *wire.Error
	if errors.As(err, &we) {
		reason := "malformed"
		for _, c := range []struct {
			err    error
			reason string
		}{{wire.ErrTruncated, "truncated"}, {wire.ErrMagic, "magic"}, {wire.ErrVersion, "version"},
			{wire.ErrType, "type"}, {wire.ErrTrailing, "trailing"}, {wire.ErrTooLong, "too_long"}} {
			if errors.Is(err, c.err) {
				reason = c.reason
			}
		}
		s.reject(ctx, ep, fasthttp.StatusBadRequest, reason, we.Field, we.Offset, err.Error())
		return
	}
	var pe *router.PolicyClassError
	if errors.As(err, &pe) {
		// Dynamo's structured overload body, as its frontend answers a policy class's refusal.
		status := s.cfg.overloadStatus()
		ctx.SetStatusCode(status)
		ctx.SetContentType("application/json")
		ctx.Response.SetBodyRaw(pe.AppendJSON(nil, status))
		return
	}
	status, reason := fasthttp.StatusBadRequest, "invalid"
	switch {
	case errors.Is(err, router.ErrUnknownPolicyClass):
		reason = "unknown_policy_class" // 400
	case errors.Is(err, router.ErrUnknownModel):
		status, reason = fasthttp.StatusNotFound, "unknown_model"
	case errors.Is(err, router.ErrUnknownWorker):
		status, reason = fasthttp.StatusNotFound, "unknown_worker"
	case errors.Is(err, router.ErrUnknownRequest):
		status, reason = fasthttp.StatusNotFound, "unknown_request"
	case errors.Is(err, router.ErrConflict):
		status, reason = fasthttp.StatusConflict, "conflict"
	case errors.Is(err, router.ErrTooLong):
		reason = "too_long" // 400, as wire.ErrTooLong
	case errors.Is(err, router.ErrClosed):
		status, reason = fasthttp.StatusServiceUnavailable, "closed"
	case errors.Is(err, router.ErrUnavailable):
		status, reason = fasthttp.StatusServiceUnavailable, "unavailable"
	case errors.Is(err, router.ErrOverloaded):
		status, reason = s.cfg.overloadStatus(), "overloaded"
	case errors.Is(err, router.ErrQueueFull):
		status, reason = fasthttp.StatusTooManyRequests, "queue_full"
	case errors.Is(err, router.ErrQueueTimeout):
		status, reason = fasthttp.StatusServiceUnavailable, "queue_timeout"
	case errors.Is(err, router.ErrGone):
		status, reason = statusClientGone, "client_gone"
	case errors.Is(err, router.ErrNoPrefill):
		status, reason = fasthttp.StatusServiceUnavailable, "no_prefill_worker"
	}
	field := ""
	var fe *router.FieldError
	if errors.As(err, &fe) {
		field = fe.Field
	}
	s.reject(ctx, ep, status, reason, field, -1, err.Error())
}

// route answers /v1/route (book) or /v1/match. Handle observes its time.
func (s *Server) route(ctx *fasthttp.RequestCtx, book bool) {
	ep := epMatch
	if book {
		ep = epRoute
	}
	b := s.bufs.Get()
	defer s.bufs.Put(b)
	if binary(ctx) {
		if err := wire.DecodeRouteRequest(ctx.PostBody(), &b.req); err != nil {
			s.fail(ctx, ep, err)
			return
		}
	} else if err := decodeRouteJSON(ctx.PostBody(), &b.req); err != nil {
		s.fail(ctx, ep, err)
		return
	}
	// The answer is encoded into the response's own body buffer: a 1,000-worker answer is 40 KB,
	// and copying it costs about as much as encoding it.
	out := ctx.Response.SwapBody(nil)[:0]
	var err error
	switch {
	case binary(ctx) && book:
		out, err = s.r.AppendRouteWaitClass(out, &b.req, &b.resp, policyClass(ctx), b.gone(ctx))
	case binary(ctx):
		out, err = s.r.AppendMatch(out, &b.req, &b.resp)
	case book:
		if b.req.SessionID == "" && s.r.SessionAffinity() {
			b.req.SessionID = string(ctx.Request.Header.Peek(sessionHeader))
		}
		err = s.r.RouteWaitClass(&b.req, &b.resp, policyClass(ctx), b.gone(ctx))
	default:
		err = s.r.Match(&b.req, &b.resp)
	}
	if err == nil && !binary(ctx) {
		out = appendRouteJSON(out, &b.resp)
	}
	ctx.Response.SwapBody(out)
	b.conn = nil // the pooled buffers keep no connection
	if err != nil {
		s.fail(ctx, ep, err)
		return
	}
	if binary(ctx) {
		ctx.SetContentTypeBytes(binaryType)
	} else {
		ctx.SetContentType("application/json")
	}
	if book {
		s.m.dyn.routed(ctx.ConnID(), b.resp.Blocks, b.resp.Cached, b.resp.ISL)
	}
}

func (s *Server) lifecycle(ctx *fasthttp.RequestCtx, ep endpoint, id []byte) {
	if len(id) == 0 || bytes.IndexByte(id, '/') >= 0 {
		s.reject(ctx, ep, fasthttp.StatusBadRequest, "invalid", "id", -1, "the path must be /v1/requests/{id}/"+endpointNames[ep])
		return
	}
	var err error
	if ep == epPrefillDone {
		err = s.r.PrefillDone(string(id))
	} else {
		err = s.r.Complete(string(id))
	}
	if err != nil {
		s.fail(ctx, ep, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// output answers POST /v1/requests/{id}/output: the request has generated generated_tokens
// tokens in all (a JSON body {"generated_tokens": n}, or the query argument). With
// --router-track-output-blocks the booking grows a block at each boundary crossed.
func (s *Server) output(ctx *fasthttp.RequestCtx, id []byte) {
	if len(id) == 0 || bytes.IndexByte(id, '/') >= 0 {
		s.reject(ctx, epOutput, fasthttp.StatusBadRequest, "invalid", "id", -1, "the path must be /v1/requests/{id}/output")
		return
	}
	var j struct {
		Generated *int64 `json:"generated_tokens"`
	}
	if q := ctx.QueryArgs().Peek("generated_tokens"); len(q) > 0 {
		n, err := strconv.ParseInt(string(q), 10, 64)
		if err != nil {
			s.reject(ctx, epOutput, fasthttp.StatusBadRequest, "invalid", "generated_tokens", -1, "not an integer")
			return
		}
		j.Generated = &n
	} else if body := ctx.PostBody(); len(body) > 0 {
		if err := json.Unmarshal(body, &j); err != nil {
			field, msg := jsonErrText(err)
			s.reject(ctx, epOutput, fasthttp.StatusBadRequest, "invalid", field, -1, msg)
			return
		}
	}
	if j.Generated == nil {
		s.reject(ctx, epOutput, fasthttp.StatusBadRequest, "invalid", "generated_tokens", -1, "give the tokens generated so far")
		return
	}
	if err := s.r.OutputTokens(string(id), *j.Generated); err != nil {
		s.fail(ctx, epOutput, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

func (s *Server) events(ctx *fasthttp.RequestCtx) {
	b := s.bufs.Get()
	defer s.bufs.Put(b)
	if binary(ctx) {
		if err := wire.DecodeEventBatch(ctx.PostBody(), &b.ev); err != nil {
			s.fail(ctx, epEvents, err)
			return
		}
	} else if err := decodeEventsJSON(ctx.PostBody(), &b.ev); err != nil {
		s.fail(ctx, epEvents, err)
		return
	}
	var err error
	b.oc, err = s.ch.ApplyEvents(&b.ev, b.oc[:0])
	if err != nil {
		s.fail(ctx, epEvents, err)
		return
	}
	ctx.SetContentType("application/json")
	b.out = appendOutcomesJSON(b.out[:0], b.oc)
	ctx.SetBody(b.out)
}

// fasthttpLogger sends fasthttp's own messages (connection errors) to slog at debug level: the
// refusals that matter are logged by transportError.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp: " + fmt.Sprintf(format, args...))
}

// snapshot streams the newest snapshot that verifies (package snapshot's portable stream).
func (s *Server) snapshot(ctx *fasthttp.RequestCtx) {
	if s.cfg.Snapshots == nil {
		s.reject(ctx, epSnapshot, fasthttp.StatusNotFound, "no_snapshots", "path", -1, "this kvrouterd keeps no snapshots (--no-snapshots)")
		return
	}
	sn, _, err := s.cfg.Snapshots.Latest()
	if errors.Is(err, snapshot.ErrNone) {
		s.reject(ctx, epSnapshot, fasthttp.StatusNotFound, "no_snapshot", "path", -1, "no snapshot written yet")
		return
	}
	if err != nil {
		s.reject(ctx, epSnapshot, fasthttp.StatusServiceUnavailable, "snapshot_store", "path", -1, err.Error())
		return
	}
	ctx.SetContentType("application/x-kvrouterd-snapshot")
	ctx.Response.Header.Set("Kvr-Stream-Seq", strconv.FormatUint(sn.Meta.StreamSeq, 10))
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer sn.Close()
		if _, err := sn.WriteTo(w); err != nil {
			// The receiver sees a truncated stream and rejects it.
			s.log.Warn("snapshot stream broken off", "id", sn.Meta.ID, "err", err)
		}
	})
}

// policyClass is the policy class the request's x-dynamo-meta-policy-class header names, "" for
// none (its model's default class).
func policyClass(ctx *fasthttp.RequestCtx) string {
	v := ctx.Request.Header.Peek(router.PolicyClassHeader)
	if len(v) == 0 {
		return ""
	}
	return router.PolicyClassOf(string(v))
}
