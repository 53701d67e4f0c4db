// Package client is the Go client of kvrouterd for gateways: route and match in the binary wire
// format over a fasthttp HostClient that keeps connections alive, request lifecycle calls, and
// worker registration and events for simple publishers.
//
// A Client is safe for concurrent use by many goroutines. With a reused request and response,
// Route allocates nothing in steady state.
package client

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// Config configures a Client. Zero values take the defaults listed.
type Config struct {
	// Addr is the kvrouterd host:port (required).
	Addr string
	// Timeout bounds one call, connection included (1 s).
	Timeout time.Duration
	// MaxConns bounds the open connections (512).
	MaxConns int
	// Dial replaces the TCP dialer (tests use in-memory listeners).
	Dial fasthttp.DialFunc
}

// Client calls one kvrouterd. Safe for concurrent use.
type Client struct {
	hc      *fasthttp.HostClient
	timeout time.Duration
	bufs    sync.Pool // *[]byte
}

// StatusError is a refusal from kvrouterd: the HTTP status and its error message.
type StatusError struct {
	Code  int
	Msg   string `json:"error"`
	Field string `json:"field"`
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("kvrouterd: HTTP %d: %s", e.Code, e.Msg)
}

// New returns a Client for cfg.Addr.
func New(cfg Config) *Client {
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 512
	}
	c := &Client{
		hc: &fasthttp.HostClient{
			Addr:                          cfg.Addr,
			Name:                          "kvrouterd-client",
			MaxConns:                      cfg.MaxConns,
			Dial:                          cfg.Dial,
			ReadTimeout:                   cfg.Timeout,
			WriteTimeout:                  cfg.Timeout,
			MaxIdleConnDuration:           60 * time.Second,
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
			// Pooled per call in flight, not per connection: large enough that a 2,048-token
			// request goes out, and a 1,000-worker answer comes in, in one system call each
			// (fasthttp's 4 KiB splits both).
			WriteBufferSize: 16 << 10,
			ReadBufferSize:  64 << 10,
		},
		timeout: cfg.Timeout,
	}
	c.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	return c
}

// Route asks kvrouterd to choose a worker for req and book its load; resp receives the choice and
// every candidate's scores. Reuse req and resp across calls: then Route allocates nothing.
func (c *Client) Route(req *wire.RouteRequest, resp *wire.RouteResponse) error {
	return c.call("/v1/route", req, resp)
}

// Match scores req against the workers without choosing or booking.
func (c *Client) Match(req *wire.RouteRequest, resp *wire.RouteResponse) error {
	return c.call("/v1/match", req, resp)
}

func (c *Client) call(path string, req *wire.RouteRequest, resp *wire.RouteResponse) error {
	hreq := fasthttp.AcquireRequest()
	hresp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(hreq)
	defer fasthttp.ReleaseResponse(hresp)
	bp := c.bufs.Get().(*[]byte)
	defer c.bufs.Put(bp)
	*bp = wire.AppendRouteRequest((*bp)[:0], req)
	c.prepare(hreq, "POST", path, wire.ContentType)
	hreq.SetBodyRaw(*bp)
	if err := c.hc.DoTimeout(hreq, hresp, c.timeout); err != nil {
		return fmt.Errorf("kvrouterd %s: %w", path, err)
	}
	if hresp.StatusCode() != fasthttp.StatusOK {
		return statusError(hresp)
	}
	if err := wire.DecodeRouteResponse(hresp.Body(), resp); err != nil {
		return err
	}
	// The decoded id aliases the response buffer, which is recycled when we return: use the
	// request's string, the same in the normal case, or a copy.
	if resp.RequestID == req.RequestID {
		resp.RequestID = req.RequestID
	} else {
		resp.RequestID = strings.Clone(resp.RequestID)
	}
	return nil
}

func (c *Client) prepare(r *fasthttp.Request, method, path, contentType string) {
	r.Header.SetMethod(method)
	r.SetRequestURI(path)
	r.Header.SetHost(c.hc.Addr)
	if contentType != "" {
		r.Header.SetContentType(contentType)
	}
}

func statusError(r *fasthttp.Response) error {
	e := &StatusError{Code: r.StatusCode()}
	if json.Unmarshal(r.Body(), e) != nil || e.Msg == "" {
		e.Msg = string(r.Body())
	}
	return e
}

// PrefillDone tells kvrouterd that request id has finished its prefill.
func (c *Client) PrefillDone(id string) error {
	return c.do("POST", "/v1/requests/"+url.PathEscape(id)+"/prefill_done", "", nil, nil)
}

// Complete tells kvrouterd that request id has finished.
func (c *Client) Complete(id string) error {
	return c.do("POST", "/v1/requests/"+url.PathEscape(id)+"/complete", "", nil, nil)
}

// Worker describes a worker to register.
type Worker struct {
	ID        uint64   `json:"worker_id"`
	Model     string   `json:"model"`
	BlockSize int      `json:"block_size,omitempty"`
	Ranks     []uint32 `json:"dp_ranks,omitempty"`
	Capacity  int64    `json:"capacity_blocks,omitempty"`
	MaxTokens int64    `json:"max_batched_tokens,omitempty"`
	// Role is "prefill", "decode" or "both"; "" leaves a registered worker's as it was (both
	// for a new one).
	Role string `json:"role,omitempty"`
}

// Register registers a worker (or adds ranks to it).
func (c *Client) Register(w Worker) error {
	body, err := json.Marshal(w)
	if err != nil {
		return err
	}
	return c.do("POST", "/v1/workers", "application/json", body, nil)
}

// Unregister removes worker id.
func (c *Client) Unregister(id uint64) error {
	return c.do("DELETE", fmt.Sprintf("/v1/workers/%d", id), "", nil, nil)
}

// EventsResult is kvrouterd's answer to an event batch: per event, what applying it did.
type EventsResult struct {
	Events   int `json:"events"`
	OK       int `json:"ok"`
	Outcomes []struct {
		EventID uint64 `json:"event_id"`
		Rank    uint32 `json:"dp_rank"`
		Status  string `json:"status"`
		Applied int    `json:"applied"`
		Skipped int    `json:"skipped"`
		Gap     uint64 `json:"gap"`
		Cleared int    `json:"cleared"` // residencies dropped to repair the gap
	} `json:"outcomes"`
}

// Events posts a batch of one worker's KV events (binary) and waits until it is applied.
func (c *Client) Events(b *wire.EventBatch) (*EventsResult, error) {
	var out EventsResult
	if err := c.do("POST", "/v1/events", wire.ContentType, wire.AppendEventBatch(nil, b), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) do(method, path, contentType string, body []byte, out any) error {
	hreq := fasthttp.AcquireRequest()
	hresp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(hreq)
	defer fasthttp.ReleaseResponse(hresp)
	c.prepare(hreq, method, path, contentType)
	hreq.SetBodyRaw(body)
	if err := c.hc.DoTimeout(hreq, hresp, c.timeout); err != nil {
		return fmt.Errorf("kvrouterd %s %s: %w", method, path, err)
	}
	if code := hresp.StatusCode(); code < 200 || code > 299 {
		return statusError(hresp)
	}
	if out != nil {
		if err := json.Unmarshal(hresp.Body(), out); err != nil {
			return fmt.Errorf("kvrouterd %s: answer: %w", path, err)
		}
	}
	return nil
}
