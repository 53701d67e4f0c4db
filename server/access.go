package server

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/kvrouterd/kvrouterd/internal/bearer"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"
)

// Who may call what, how large a body each endpoint reads, and how fast the control plane
// may be changed.
//
// With Config.Tokens set, every endpoint but health, readiness and metrics needs a bearer
// token: a read token for what changes nothing (GET, the match and Dynamo's queries), a write
// token for the rest. The check runs before the endpoint's own and allocates nothing.

// apiAccess is the class of token the HTTP API's endpoint at path needs for method. The status
// page's files carry no data and are open, so that a browser can load the page and then send a
// token for its one document, /ui/status.json.
func apiAccess(path, method []byte) bearer.Class {
	switch string(path) {
	case "/healthz", "/health", "/readyz", "/metrics", "/ui", "/ui/", "/ui/index.html", "/ui/app.js", "/ui/style.css":
		return bearer.None
	case "/v1/match", "/query", "/query_by_hash":
		return bearer.Read
	case "/v1/snapshot":
		return bearer.Write // it carries the workers' API keys (router.Registration.APIKey)
	}
	if readMethod(method) {
		return bearer.Read
	}
	return bearer.Write
}

// selectionAccess is apiAccess for the selection service's routes.
func selectionAccess(path, method []byte) bearer.Class {
	switch string(path) {
	case "/health", "/ready":
		return bearer.None
	case "/potential_loads", "/overlap_scores":
		return bearer.Read
	}
	if readMethod(method) {
		return bearer.Read
	}
	return bearer.Write
}

func readMethod(m []byte) bool {
	return string(m) == "GET" || string(m) == "HEAD" || string(m) == "OPTIONS"
}

// answerFunc answers a refused request in the shape of the API it came to.
type answerFunc func(ctx *fasthttp.RequestCtx, status int, reason, msg string)

// apiRefusal answers in the native API's shape, counted under the endpoint "other".
func (s *Server) apiRefusal(ctx *fasthttp.RequestCtx, status int, reason, msg string) {
	field := ""
	if reason == "unauthorized" || reason == "forbidden" {
		field = "Authorization"
	}
	s.reject(ctx, epOther, status, reason, field, -1, msg)
}

// authorized checks ctx's token against the class its endpoint needs; it answers 401 (no or
// an unknown token) or 403 (a read token where a write one is needed) and returns false when
// the request may not go on. REQUIRES: s.cfg.Tokens != nil.
func (s *Server) authorized(ctx *fasthttp.RequestCtx, need bearer.Class, refuse answerFunc) bool {
	status, msg := s.cfg.Tokens.Refusal(ctx.Request.Header.Peek("Authorization"), need)
	switch status {
	case 0:
		return true
	case fasthttp.StatusUnauthorized:
		ctx.Response.Header.Set("WWW-Authenticate", bearer.Challenge)
		refuse(ctx, status, "unauthorized", msg)
	default:
		refuse(ctx, status, "forbidden", msg)
	}
	return false
}

// Body limits below Config.MaxBodyBytes, by endpoint: a lifecycle call or a registration has
// no business sending megabytes, and is refused before its body is read.
const (
	smallBodyBytes    = 64 << 10 // lifecycle calls, bodies of GETs, peers, thresholds
	registerBodyBytes = 4 << 20  // registrations: 1,024 ranks with their endpoints fit
)

// apiBodyLimit is the body limit of the HTTP API's endpoint at path (the request URI's path,
// query included) for method.
func (s *Server) apiBodyLimit(uri, method []byte) (limit int, what string) {
	path := uriPath(uri)
	limit, what = s.cfg.MaxBodyBytes, "--max-body-bytes"
	switch {
	case readMethod(method) && !bytes.Equal(path, pWorkers):
		limit, what = smallBodyBytes, "a GET's"
	case bytes.HasPrefix(path, pRequests):
		limit, what = smallBodyBytes, "a lifecycle call's"
	case bytes.Equal(path, pWorkers), bytes.HasPrefix(path, pWorkersS),
		string(path) == "/register", string(path) == "/unregister":
		limit, what = registerBodyBytes, "a registration's"
	case string(path) == "/register_peer", string(path) == "/deregister_peer", string(path) == "/busy_threshold", string(path) == "/reopen_logs":
		limit, what = smallBodyBytes, "this endpoint's"
	}
	return min(limit, s.cfg.MaxBodyBytes), what
}

// selectionBodyLimit is apiBodyLimit for the selection service.
func (s *Server) selectionBodyLimit(uri, method []byte) (limit int, what string) {
	path := uriPath(uri)
	limit, what = s.cfg.MaxBodyBytes, "--max-body-bytes"
	switch {
	case readMethod(method):
		limit, what = smallBodyBytes, "a GET's"
	case bytes.HasPrefix(path, []byte("/reservations/")), bytes.HasPrefix(path, []byte("/replica_sync/")):
		limit, what = smallBodyBytes, "this endpoint's"
	case bytes.HasPrefix(path, []byte("/workers")):
		limit, what = registerBodyBytes, "a registration's"
	}
	return min(limit, s.cfg.MaxBodyBytes), what
}

func uriPath(uri []byte) []byte {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		return uri[:i]
	}
	return uri
}

// bodyTooLarge is the message of a 413: the limit that applied and the flag behind the largest.
func (s *Server) bodyTooLarge(ctx *fasthttp.RequestCtx, selection bool) string {
	h := &ctx.Request.Header
	limit, what := s.apiBodyLimit(h.RequestURI(), h.Method())
	if selection {
		limit, what = s.selectionBodyLimit(h.RequestURI(), h.Method())
	}
	if what == "--max-body-bytes" {
		return fmt.Sprintf("larger than the limit of %d bytes; send a smaller one, or raise the limit with --max-body-bytes", limit)
	}
	return fmt.Sprintf("larger than %s limit of %d bytes (--max-body-bytes, %d, bounds the largest body any endpoint takes)",
		what, limit, s.cfg.MaxBodyBytes)
}

// Rate limits: the control plane (registrations, peers, thresholds, snapshots, dumps, log
// reopening) and, apart, posted events. A request over its limit gets 429 with Retry-After.

// controlPlane reports whether the API's endpoint at path, for method, is one the control
// limit applies to.
func controlPlane(path, method []byte) bool {
	switch string(path) {
	case "/register", "/unregister", "/register_peer", "/deregister_peer", "/reopen_logs", "/v1/snapshot", "/dump":
		return true
	case "/busy_threshold":
		return !readMethod(method)
	}
	return !readMethod(method) && (bytes.Equal(path, pWorkers) || bytes.HasPrefix(path, pWorkersS))
}

// newLimiter is a token bucket of perSecond and burst, or nil (no limit) for perSecond ≤ 0.
func newLimiter(perSecond float64, burst int) *rate.Limiter {
	if perSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(perSecond), max(burst, 1))
}

// allowed takes a token of l for ctx's request, or answers 429 and returns false.
func (s *Server) allowed(ctx *fasthttp.RequestCtx, l *rate.Limiter, flag string, refuse answerFunc) bool {
	if l == nil || l.Allow() {
		return true
	}
	ctx.Response.Header.Set("Retry-After", "1")
	refuse(ctx, fasthttp.StatusTooManyRequests, "rate_limited",
		"over the rate limit of "+strconv.FormatFloat(float64(l.Limit()), 'g', -1, 64)+" requests/s ("+flag+"); retry after a second")
	return false
}

// control takes a token of the control plane's limit, or answers 429.
func (s *Server) control(ctx *fasthttp.RequestCtx) bool {
	return s.allowed(ctx, s.controlLim, "--control-rate-limit", s.apiRefusal)
}

// selectionControlPlane is controlPlane for the selection service.
func selectionControlPlane(path, method []byte) bool {
	if bytes.HasPrefix(path, []byte("/replica_sync/")) {
		return !readMethod(method)
	}
	return string(path) == "/dump" || !readMethod(method) && bytes.HasPrefix(path, []byte("/workers"))
}
