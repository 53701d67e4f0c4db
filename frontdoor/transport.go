package frontdoor

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/valyala/fasthttp"
)

// idler is implemented by the connections of a listener that knows whether a byte of a request
// has come (package server's, which the daemon serves the front door on).
type idler interface{ Idle() bool }

// bodyLimiter is implemented by the connections of a listener that knows the request-body limit
// they are served under (package server's: --max-body-bytes).
type bodyLimiter interface{ MaxBodyBytes() int }

// TransportError answers a request fasthttp refused before the handler saw it, in OpenAI's error
// shape: a body over the limit gets 413 (code "request_too_large", naming the limit and
// --max-body-bytes), headers over the read buffer 431, a request that did not come whole in time
// 408, anything unreadable 400. Each is counted in kvrouterd_frontdoor_requests_total and logged
// behind the refusals' rate limit. A connection that timed out or closed before any byte of a
// request came gets 408 and is closed without a count or a line: a flood of idle connections
// must not become a flood of lines. It is the front door's fasthttp.Server.ErrorHandler; safe for
// concurrent use.
func (d *Door) TransportError(ctx *fasthttp.RequestCtx, err error) {
	if c, ok := ctx.Conn().(idler); ok && c.Idle() {
		ctx.SetStatusCode(fasthttp.StatusRequestTimeout)
		ctx.SetConnectionClose()
		return
	}
	var status int
	var code, msg string
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, code = fasthttp.StatusRequestEntityTooLarge, "request_too_large"
		msg = "the request body is larger than kvrouterd accepts"
		if c, ok := ctx.Conn().(bodyLimiter); ok {
			msg += fmt.Sprintf(", %d bytes", c.MaxBodyBytes())
		}
		msg += ": send a smaller one, or raise kvrouterd's --max-body-bytes"
	case errors.As(err, &small):
		status, code = fasthttp.StatusRequestHeaderFieldsTooLarge, "request_header_fields_too_large"
		msg = "the request headers are larger than kvrouterd's read buffer: send smaller ones, or raise kvrouterd's --http-read-buffer"
	case errors.As(err, &ne) && ne.Timeout():
		status, code = fasthttp.StatusRequestTimeout, "request_timeout"
		msg = "the request did not arrive whole in time: " + err.Error()
	default:
		status, code = fasthttp.StatusBadRequest, "malformed_request"
		msg = "the request could not be read: " + err.Error()
	}
	path := transportPath(ctx.Path())
	writeError(ctx, status, apiError{Message: msg, Type: errorType(status), Code: &code})
	d.m.requests.WithLabelValues(path, strconv.Itoa(status)).Inc()
	d.refusals.Info("front door: request refused", "path", path, "status", status, "code", code, "msg", msg,
		"remote", ctx.RemoteAddr().String())
}

// transportPath is the path label of a request refused in transport: one of the API's paths,
// else "other", so that a client's arbitrary paths add no series.
func transportPath(p []byte) string {
	switch string(p) {
	case "/v1/completions", "/v1/chat/completions", "/v1/models", "/health":
		return string(p)
	}
	return "other"
}
