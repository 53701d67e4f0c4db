package server

import (
	"errors"
	"mime"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// NVIDIA Dynamo's standalone selection service (python -m dynamo.select_service, lib/kv-router
// services/selection), served by HandleSelection on a listener of its own (the daemon's
// --selection-addr; Dynamo's default port is 8092), over the same Router as the native API: a
// reservation is a booking whose request id is the selection_id, so that /v1/route's load and
// the selection service's are one. Same paths, JSON, statuses and messages as Dynamo's; errors
// are {"error": msg}, including the JSON rejections Dynamo's axum extractors answer (which it
// wraps so too). docs/dynamo.md lists the differences.
//
// The worker catalog and the pending selections are this replica's, in memory, as Dynamo's
// are: the registrations the catalog makes go through Config.Changes like every other, so each
// replica's router has the workers, but another replica's catalog does not list them.

// selection is the selection service's own state: the worker catalog and the pending
// selections. Lock order: write, then mu. write is held across the router changes of a catalog
// change, each of which may wait for the event stream; mu only over the maps, and neither is
// taken by anything the router calls.
type selection struct {
	// write serializes the catalog's changes: each reconciles one worker with the router, maybe
	// through the event stream, and must see the previous one's result.
	write sync.Mutex

	mu sync.Mutex
	// workers are the catalog's records by worker id. A record is never changed once stored:
	// a change stores a new one, so a reader may keep one after mu is released. REQUIRES mu.
	workers map[uint64]*selRecord
	// eagle is each partition's is_eagle, set by its first schedulable worker and kept (as
	// Dynamo keeps its partitions once made). REQUIRES mu.
	eagle map[string]bool

	pending *pendingCache
}

func newSelection(cfg Config) *selection {
	return &selection{
		workers: map[uint64]*selRecord{},
		eagle:   map[string]bool{},
		pending: newPendingCache(cfg.SelectionCacheTTL, cfg.SelectionCacheMaxEntries, cfg.SelectionCacheMaxBytes),
	}
}

// ServeSelection serves Dynamo's selection service (HandleSelection) on ln until Shutdown,
// within the same connection limits as Serve's listeners.
func (s *Server) ServeSelection(ln net.Listener) error {
	return s.selSrv.Serve(s.conns.listener(ln, lnSelection))
}

// selRoutes are the selection service's routes: path patterns ({…} is one path segment) and
// their methods. The pattern names the route in kvrouterd_selection_requests_total.
var selRoutes = []struct {
	pattern string
	methods []string
}{
	{"/select", []string{"POST"}},
	{"/select_and_reserve", []string{"POST"}},
	{"/reservations", []string{"POST"}},
	{"/reservations/{reservation_id}/prefill_complete", []string{"POST"}},
	{"/reservations/{reservation_id}/output_block", []string{"POST"}},
	{"/reservations/{reservation_id}", []string{"DELETE"}},
	{"/workers", []string{"GET", "POST"}},
	{"/workers/{worker_id}", []string{"PATCH", "DELETE"}},
	{"/health", []string{"GET"}},
	{"/ready", []string{"GET"}},
	{"/loads", []string{"GET"}},
	{"/potential_loads", []string{"POST"}},
	{"/overlap_scores", []string{"POST"}},
	{"/dump", []string{"GET"}},
	{"/replica_sync/register_peer", []string{"POST"}},
	{"/replica_sync/deregister_peer", []string{"POST"}},
	{"/replica_sync/peers", []string{"GET"}},
}

// matchRoute returns the index in selRoutes of the route path matches and its path parameter
// (percent-decoded, as axum decodes it), or -1. A parameter is one path segment, never empty.
func matchRoute(path string) (int, string, bool) {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i, r := range selRoutes {
		pat := strings.Split(strings.TrimPrefix(r.pattern, "/"), "/")
		if len(pat) != len(segs) {
			continue
		}
		param, ok := "", true
		for j, p := range pat {
			if strings.HasPrefix(p, "{") {
				v, err := url.PathUnescape(segs[j])
				if err != nil || v == "" {
					ok = false
					break
				}
				param = v
			} else if p != segs[j] {
				ok = false
				break
			}
		}
		if ok {
			return i, param, true
		}
	}
	return -1, "", false
}

// HandleSelection serves one request of Dynamo's selection service; it is the fasthttp
// handler of the selection listener (tests may call it directly).
func (s *Server) HandleSelection(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	route := "other"
	if p, m := ctx.Path(), ctx.Method(); (s.cfg.Tokens == nil || s.authorized(ctx, selectionAccess(p, m), s.selError)) &&
		(!selectionControlPlane(p, m) || s.allowed(ctx, s.controlLim, "--control-rate-limit", s.selError)) {
		route = s.selDispatch(ctx)
	}
	method := string(ctx.Method())
	switch method {
	case "GET", "POST", "PATCH", "DELETE", "PUT", "HEAD", "OPTIONS":
	default:
		method = "other" // what a client sends bounds no label
	}
	s.m.selRequests.WithLabelValues(route, method, strconv.Itoa(ctx.Response.StatusCode())).Inc()
	s.m.latency.series[epSelection].Observe(ctx.ConnID(), time.Since(start).Seconds())
}

// selDispatch answers ctx and returns its route's name for the metrics: its pattern, or
// "other" for a path that is none.
func (s *Server) selDispatch(ctx *fasthttp.RequestCtx) string {
	i, param, ok := matchRoute(string(ctx.URI().PathOriginal()))
	if !ok {
		s.selError(ctx, fasthttp.StatusNotFound, "not_found", "route not found")
		return "other"
	}
	r := &selRoutes[i]
	method := string(ctx.Method())
	if method == "HEAD" {
		method = "GET" // as axum answers HEAD on its GET routes (fasthttp sends no body)
	}
	allowed := false
	for _, m := range r.methods {
		allowed = allowed || m == method
	}
	if !allowed {
		ctx.Response.Header.Set("Allow", strings.Join(r.methods, ","))
		s.selError(ctx, fasthttp.StatusMethodNotAllowed, "method", "method not allowed")
		return r.pattern
	}
	switch r.pattern {
	case "/select":
		s.selSelect(ctx, false)
	case "/select_and_reserve":
		s.selSelect(ctx, true)
	case "/reservations":
		s.selReserve(ctx)
	case "/reservations/{reservation_id}/prefill_complete":
		s.selPrefillComplete(ctx, param)
	case "/reservations/{reservation_id}/output_block":
		s.selOutputBlock(ctx, param)
	case "/reservations/{reservation_id}":
		s.selFree(ctx, param)
	case "/workers":
		if method == "GET" {
			s.selListWorkers(ctx)
		} else {
			s.selUpsertWorker(ctx)
		}
	case "/workers/{worker_id}":
		// axum's Path extractor refuses a worker id that is not a u64 with a 400 of its own;
		// its text, from axum's sources (not Dynamo's), in Dynamo's error shape.
		id, err := strconv.ParseUint(param, 10, 64)
		if err != nil {
			s.selError(ctx, fasthttp.StatusBadRequest, "invalid", "Invalid URL: Cannot parse `"+param+"` to a `u64`")
			break
		}
		if method == "PATCH" {
			s.selPatchWorker(ctx, id)
		} else {
			s.selDeleteWorker(ctx, id)
		}
	case "/health":
		s.writeJSON(ctx, map[string]string{"status": "ok"})
	case "/ready":
		s.selReady(ctx)
	case "/loads":
		s.selLoads(ctx)
	case "/potential_loads", "/overlap_scores":
		s.selPotential(ctx, r.pattern == "/overlap_scores")
	case "/dump":
		s.dynamoDump(ctx) // the indexer's /dump: one index serves both
	case "/replica_sync/register_peer", "/replica_sync/deregister_peer":
		s.selReplicaPeer(ctx, r.pattern)
	case "/replica_sync/peers":
		s.writeJSON(ctx, []string{}) // Dynamo's answer with replica sync disabled
	}
	return r.pattern
}

// selError answers Dynamo's {"error": msg} with status, counted in kvrouterd_http_rejected_total
// (endpoint "selection") by reason and logged.
func (s *Server) selError(ctx *fasthttp.RequestCtx, status int, reason, msg string) {
	s.m.rejected.WithLabelValues(endpointNames[epSelection], reason).Inc()
	s.refusals.Warn("request refused", "endpoint", endpointNames[epSelection], "path", string(ctx.Path()), "status", status,
		"reason", reason, "error", msg, "remote", ctx.RemoteAddr().String())
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendError(ctx.Response.Body()[:0], msg, "", -1))
}

// selFail answers an error of package router in Dynamo's shape: its message, the status
// dynStatus gives it.
func (s *Server) selFail(ctx *fasthttp.RequestCtx, err error) {
	status, reason := dynStatus(err)
	s.selError(ctx, status, reason, err.Error())
}

// dynStatus is the status, and its reason, that Dynamo's selection service and slot tracker
// answer an error of package router's kind with.
func dynStatus(err error) (int, string) {
	switch {
	case errors.Is(err, router.ErrUnknownModel), errors.Is(err, router.ErrUnknownWorker), errors.Is(err, router.ErrUnknownRequest):
		return fasthttp.StatusNotFound, "not_found"
	case errors.Is(err, router.ErrConflict):
		return fasthttp.StatusConflict, "conflict"
	case errors.Is(err, router.ErrClosed), errors.Is(err, router.ErrUnavailable):
		return fasthttp.StatusServiceUnavailable, "unavailable"
	}
	return fasthttp.StatusBadRequest, "invalid"
}

// Prefixes of the texts of axum's Json rejections (axum's sources; Dynamo's selection service
// wraps them in its error shape).
const (
	axumSyntax = "Failed to parse the request body as JSON: "
	axumSchema = "Failed to deserialize the JSON body into the target type: "
)

// selJSON decodes a selection-service body into v as Dynamo's handlers do (axum's Json
// extractor, its rejections wrapped): 415 unless the Content-Type is JSON; 400 for a body that
// is not JSON; 422 for a required field missing, a field of the wrong type, or null in a field
// that takes none (nonNull: Dynamo's fields with a serde default, which take absence but not
// null). Unknown fields are ignored, counted and logged as the indexer endpoints' are. It
// answers a refusal itself and returns false.
func (s *Server) selJSON(ctx *fasthttp.RequestCtx, route string, v any, required, nonNull []string) (jsonKeys, bool) {
	if !jsonContentType(string(ctx.Request.Header.ContentType())) {
		s.selError(ctx, fasthttp.StatusUnsupportedMediaType, "content_type", "Expected request with `Content-Type: application/json`")
		return nil, false
	}
	unknown, keys, err := decodeLenient(ctx.PostBody(), v)
	if err != nil {
		var je *jsonError
		if !errors.As(err, &je) {
			s.selError(ctx, fasthttp.StatusBadRequest, "json", axumSyntax+err.Error())
			return nil, false
		}
		if je.typed {
			s.selError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+je.msg)
		} else {
			s.selError(ctx, fasthttp.StatusBadRequest, "json", axumSyntax+je.msg)
		}
		return nil, false
	}
	s.noteUnknown(route, unknown)
	for _, name := range required {
		if !keys.has(name) || keys.null(name) {
			s.selError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+"missing field `"+name+"`")
			return nil, false
		}
	}
	for _, name := range nonNull {
		if keys.null(name) {
			s.selError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+name+": invalid type: null")
			return nil, false
		}
	}
	return keys, true
}

// str is Dynamo's String member with a serde default: v when the body has name, def when not.
func (k jsonKeys) str(name, v, def string) string {
	if k.has(name) {
		return v
	}
	return def
}

// jsonContentType reports whether ct is a JSON media type as axum's Json takes them:
// application/json or application/…+json, parameters allowed.
func jsonContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// partKey is how Dynamo's selection messages name a partition, its RoutingPartitionId. Its
// Display form was not found in Dynamo's sources; the old SelectionKey printed
// "model={m} tenant={t}", so this is most likely it with the routing group.
func partKey(model, group string) string { return "model=" + model + " routing_group=" + group }

// selReady answers /ready: 200 while the server is not shutting down and at least one worker
// of the catalog is schedulable, 503 otherwise, both with the catalog.
func (s *Server) selReady(ctx *fasthttp.RequestCtx) {
	recs := s.sel.records("", "")
	n := 0
	for _, rec := range recs {
		if rec.Lifecycle == lifeSchedulable {
			n++
		}
	}
	ready := s.ready.Load() && n > 0
	if !ready {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	s.writeJSON(ctx, map[string]any{"ready": ready, "schedulable_workers": n, "workers": recs})
}

// selReplicaPeer answers Dynamo's replica-sync peer changes: kvrouterd replicas share their
// bookings over NATS (--share-load), so Dynamo's ZMQ replica sync is never on, and Dynamo's
// answer to these with it off is 409.
func (s *Server) selReplicaPeer(ctx *fasthttp.RequestCtx, route string) {
	var j struct {
		Endpoint string `json:"endpoint"`
	}
	if _, ok := s.selJSON(ctx, route, &j, []string{"endpoint"}, nil); !ok {
		return
	}
	s.selError(ctx, fasthttp.StatusConflict, "conflict", "replica sync is disabled")
}

// newSelMetrics registers the selection service's request counter.
func newSelMetrics(reg *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouterd_selection_requests_total",
		Help: "Requests to Dynamo's selection service (--selection-addr), by route (its path pattern; other for a path that is none), method and status.",
	}, []string{"route", "method", "code"})
	reg.MustRegister(c)
	return c
}
