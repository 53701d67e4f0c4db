package frontdoor

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
)

// idleConn is a connection that says no byte of a request came, as package server's do.
type idleConn struct{ net.Conn }

func (idleConn) Idle() bool { return true }

// TestTransportError: each error fasthttp reports before the handler gets its status and
// OpenAI's error object with a string code, counted under a bounded path label; an idle
// connection's timeout is answered 408 without a count.
func TestTransportError(t *testing.T) {
	r := router.New(router.Config{BlockSize: 4, Shards: 1, Logger: slog.New(slog.DiscardHandler)})
	defer r.Close()
	d := New(r, Config{})
	defer d.Close()
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ETIMEDOUT)}
	f := func(path string, err error, status int, code string) {
		t.Helper()
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI(path)
		d.TransportError(&ctx, err)
		var e struct {
			Error map[string]any `json:"error"`
		}
		if ctx.Response.StatusCode() != status || string(ctx.Response.Header.ContentType()) != "application/json" ||
			json.Unmarshal(ctx.Response.Body(), &e) != nil {
			t.Fatalf("%v: %d %q %q", err, ctx.Response.StatusCode(), ctx.Response.Header.ContentType(), ctx.Response.Body())
		}
		if e.Error["code"] != code || e.Error["type"] != "invalid_request_error" || e.Error["param"] != nil || e.Error["message"] == "" {
			t.Fatalf("%v: %s; want code %q", err, ctx.Response.Body(), code)
		}
	}
	f("/v1/completions", fasthttp.ErrBodyTooLarge, 413, "request_too_large")
	f("/v1/completions", &fasthttp.ErrSmallBuffer{}, 431, "request_header_fields_too_large")
	f("/v1/chat/completions", timeout, 408, "request_timeout")
	f("/x/y/z", errors.New("cannot find http request method"), 400, "malformed_request")
	if n := testutil.ToFloat64(d.m.requests.WithLabelValues("other", "400")); n != 1 {
		t.Fatalf("%v malformed requests counted under path other, want 1", n)
	}

	// An idle connection timing out: no answer to speak of, nothing counted.
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	var ctx fasthttp.RequestCtx
	ctx.Init2(idleConn{c1}, nil, false)
	d.TransportError(&ctx, timeout)
	if ctx.Response.StatusCode() != 408 || len(ctx.Response.Body()) != 0 || !ctx.Response.ConnectionClose() {
		t.Fatalf("idle: %d %q", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if n := testutil.ToFloat64(d.m.requests.WithLabelValues("/v1/chat/completions", "408")); n != 1 {
		t.Fatalf("%v timeouts counted, want the one request's", n)
	}
	if strings.Contains(string(ctx.Response.Body()), "error") {
		t.Fatal("an idle connection got an error body")
	}
}
