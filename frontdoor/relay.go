package frontdoor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/peer"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// pollEvery is how often a request's watcher looks whether its client is still there.
const pollEvery = 50 * time.Millisecond

// watcher follows one request's client from the route to the answer's end: when the client
// goes (or the request outlives its deadline) it cancels the call to the worker in flight,
// which closes its connection (vLLM and SGLang abort a request whose connection closes, and
// that is the engine's request cancelled, before its answer's headers or during its body), and
// signals gone. The Door's poller looks at every watcher's client every pollEvery. Its methods
// are safe for concurrent use.
type watcher struct {
	p        *poller
	conn     net.Conn
	deadline time.Time
	gone     chan struct{} // closed when the client has gone or the deadline passed
	why      atomic.Int32  // endGone or endTimeout, once gone is closed
	mu       sync.Mutex
	cancel   func() // the call in flight's; nil between calls
	ended    bool
}

const (
	endGone int32 = iota + 1
	endTimeout
)

var (
	errClientGone = errors.New("the client went away")
	errDeadline   = errors.New("the request outlived --frontend-timeout")
)

// poller looks at the clients of a Door's requests in flight, from one goroutine that runs
// while there are any. Safe for concurrent use.
type poller struct {
	mu      sync.Mutex
	ws      map[*watcher]struct{}
	running bool
}

func (p *poller) watch(conn net.Conn, deadline time.Time) *watcher {
	w := &watcher{p: p, conn: conn, deadline: deadline, gone: make(chan struct{})}
	p.mu.Lock()
	if p.ws == nil {
		p.ws = make(map[*watcher]struct{})
	}
	p.ws[w] = struct{}{}
	if !p.running {
		p.running = true
		go p.loop()
	}
	p.mu.Unlock()
	return w
}

func (p *poller) loop() {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	var ws []*watcher
	for now := range t.C {
		p.mu.Lock()
		if len(p.ws) == 0 {
			p.running = false
			p.mu.Unlock()
			return
		}
		ws = ws[:0]
		for w := range p.ws {
			ws = append(ws, w)
		}
		p.mu.Unlock()
		for _, w := range ws {
			switch {
			case !w.deadline.IsZero() && now.After(w.deadline):
				w.fire(endTimeout)
			case peer.Gone(w.conn):
				w.fire(endGone)
			}
		}
		clear(ws)
	}
}

func (w *watcher) fire(why int32) {
	w.p.mu.Lock()
	delete(w.p.ws, w)
	w.p.mu.Unlock()
	w.mu.Lock()
	if w.ended || w.why.Load() != 0 {
		w.mu.Unlock()
		return
	}
	w.why.Store(why)
	close(w.gone)
	c := w.cancel
	w.mu.Unlock()
	if c != nil {
		c()
	}
}

// err is why the request ended early: errClientGone, errDeadline, or nil while it has not.
func (w *watcher) err() error {
	switch w.why.Load() {
	case endGone:
		return errClientGone
	case endTimeout:
		return errDeadline
	}
	return nil
}

// call returns the context of a call to a worker, cancelled when the watcher fires (at once,
// if it has) or at the deadline; the next call's replaces it.
func (w *watcher) call() context.Context {
	c, cancel := context.WithCancel(context.Background())
	if !w.deadline.IsZero() {
		c, cancel = context.WithDeadline(context.Background(), w.deadline)
	}
	w.attach(cancel)
	return c
}

// attach makes cancel the call in flight's, in place of the one before: the watcher's firing
// calls it, at once if it has fired.
func (w *watcher) attach(cancel func()) {
	w.mu.Lock()
	if w.cancel != nil {
		w.cancel()
	}
	w.cancel = cancel
	w.mu.Unlock()
	select {
	case <-w.gone:
		cancel()
	default:
	}
}

// end stops watching and releases the call's context. It may be called more than once.
func (w *watcher) end() {
	w.p.mu.Lock()
	delete(w.p.ws, w)
	w.p.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.ended = true
		if w.cancel != nil {
			w.cancel()
			w.cancel = nil
		}
	}
}

// errUpstream is a worker's failure before any of its answer reached the client: it could
// not be reached, or it answered 5xx (status, with its error).
type errUpstream struct {
	status int      // 0: no answer
	apiErr apiError // the worker's error, when status is set
	err    error
}

func (e *errUpstream) Error() string {
	if e.status != 0 {
		return fmt.Sprintf("answered %d: %s", e.status, e.apiErr.Message)
	}
	return e.err.Error()
}

// reason is the reason a failure is reported to the router's worker health under.
func (e *errUpstream) reason() string {
	var op *net.OpError
	var ne net.Error
	switch {
	case e.status != 0:
		return "5xx"
	case errors.As(e.err, &op) && op.Op == "dial":
		return "connect"
	case errors.As(e.err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "reset"
}

// outgoing is what send needs of a request.
type outgoing struct {
	endpoint string // the worker's http_endpoint
	path     string
	rank     uint32
	auth     string // Authorization to send, "" for none
	reqID    string
	body     []byte
}

// send posts o and returns the worker's answer with its body still to read; the watcher's
// firing cancels the call. A 5xx answer or no answer is an *errUpstream, and the watcher's
// firing returns its error.
func (d *Door) send(o *outgoing, w *watcher) (*upAnswer, error) {
	var resp *upAnswer
	var err error
	if addr, host, prefix, ok := splitEndpoint(o.endpoint); ok {
		resp, err = d.eng.do(addr, host, prefix+o.path, o, w.deadline, w.attach)
	} else {
		resp, err = d.sendHTTP(o, w) // https://
	}
	if err != nil {
		if werr := w.err(); werr != nil {
			return nil, werr
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
			(!w.deadline.IsZero() && !time.Now().Before(w.deadline)) {
			return nil, errDeadline
		}
		if _, ok := err.(*errUpstream); ok {
			return nil, err
		}
		return nil, &errUpstream{err: err}
	}
	if resp.status >= 500 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, &errUpstream{status: resp.status, apiErr: engineError(resp.status, b)}
	}
	return resp, nil
}

// sendHTTP is send through net/http's client, for workers whose endpoint is not http://.
func (d *Door) sendHTTP(o *outgoing, w *watcher) (*upAnswer, error) {
	req, err := http.NewRequestWithContext(w.call(), http.MethodPost, strings.TrimRight(o.endpoint, "/")+o.path, bytes.NewReader(o.body))
	if err != nil {
		return nil, &errUpstream{err: err}
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Accept"] = []string{"text/event-stream"}
	if o.auth != "" {
		req.Header["Authorization"] = []string{o.auth}
	}
	req.Header["X-Request-Id"] = []string{o.reqID}
	// Replayable (the key itself is not sent): a request that failed on a kept-alive connection
	// the worker had closed, before the worker read any of it, is sent again on a new one.
	req.Header["X-Idempotency-Key"] = nil
	req.Header["X-Data-Parallel-Rank"] = []string{strconv.FormatUint(uint64(o.rank), 10)}
	resp, err := d.up.Do(req)
	if err != nil {
		return nil, err
	}
	return &upAnswer{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), hh: resp.Header, Body: resp.Body}, nil
}

// hopByHop are the headers of one connection, never passed on (RFC 9110 §7.6.1), with those
// the front door sets itself.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Content-Type": true, "Content-Encoding": true, "Date": true, "Server": true,
	"X-Request-Id": true, "X-Kvrouterd-Worker": true, "X-Kvrouterd-Prefill-Worker": true, "X-Kvrouterd-Predicted-Ttft-Ms": true,
}

// passHeaders copies the worker's answer's end-to-end headers to the client's.
func passHeaders(ctx *fasthttp.RequestCtx, a *upAnswer) {
	if a.hdr != nil {
		for k, v := range a.hdr.All() {
			if !hopByHop[string(k)] {
				ctx.Response.Header.AddBytesKV(k, v)
			}
		}
		return
	}
	for k, vs := range a.hh {
		if hopByHop[k] {
			continue
		}
		for _, v := range vs {
			ctx.Response.Header.Add(k, v)
		}
	}
}

// answer is the state of one worker's answer as it is relayed: what it measured and how it
// ended. It belongs to the goroutine reading the answer.
type answer struct {
	d        *Door
	q        *request
	id       string // the booking
	worker   uint64
	rank     uint32
	first    time.Time // the first token's arrival; zero before it
	last     time.Time // the last token's
	done     bool      // "data: [DONE]" seen
	finished bool      // a choice's finish_reason seen
	errEv    []byte    // an in-stream error event's JSON, if the engine sent one
	events   int64     // token events (chunks with choices)
	reported int64     // tokens last told the router (output tracking)
	track    bool
	usage    struct{ Prompt, Completion int64 }
	hasUsage bool
	// predicted is the router's predicted TTFT on this worker, in ms (0: none), routed when
	// it was made: the measured one, for kvrouterd_frontdoor_ttft_prediction_ratio, is from
	// routed to first.
	predicted float64
	routed    time.Time
}

// event handles one server-sent event of the worker's answer (its data, without "data: "),
// and reports whether it goes on to a streaming client: the usage chunk that the front door
// asked for on its own is not passed on.
func (a *answer) event(data []byte) bool {
	now := time.Now()
	if string(data) == "[DONE]" {
		a.done = true
		return true
	}
	// The usage chunk (choices empty) and, with continuous usage stats, every chunk carry
	// usage; only the chunk with no choices is the front door's own to drop.
	if bytes.Contains(data, []byte(`"usage"`)) {
		if a.readUsage(gjson.GetBytes(data, "usage")) {
			if gjson.GetBytes(data, "choices.#").Int() == 0 {
				a.report()
				return a.q.usage
			}
		}
	}
	if isErrorEvent(data) {
		a.errEv = bytes.Clone(data)
		return true
	}
	if bytes.Contains(data, []byte(`"finish_reason":"`)) {
		a.finished = true
	}
	if a.first.IsZero() {
		a.first = now
		_ = a.d.r.PrefillDone(a.id)
	} else {
		gap := now.Sub(a.last).Seconds()
		a.q.mm.itl.Observe(gap)
		a.q.mm.dynITL.Observe(gap)
	}
	a.last = now
	a.events++
	a.report()
	return true
}

// readUsage takes an engine's usage object, and reports whether u is one.
func (a *answer) readUsage(u gjson.Result) bool {
	if !u.IsObject() {
		return false
	}
	a.usage.Prompt, a.usage.Completion = u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
	a.hasUsage = true
	return true
}

// report tells the router the tokens generated so far when they grew, with output tracking.
func (a *answer) report() {
	if n := a.tokens(); a.track && n > a.reported {
		a.reported = n
		_ = a.d.r.OutputTokens(a.id, n)
	}
}

// isErrorEvent says whether an event's data is an engine's error: {"error": …}, or older vLLM's
// {"object": "error", …}, as pydantic or json.dumps writes them (the key first).
func isErrorEvent(data []byte) bool {
	d := bytes.TrimLeft(data, " \t")
	switch {
	case bytes.HasPrefix(d, []byte(`{"error"`)):
		return true
	case bytes.HasPrefix(d, []byte(`{"object"`)):
		return gjson.GetBytes(d, "object").Str == "error"
	}
	return false
}

// whole says whether the answer ended as a whole answer ends: [DONE], or every choice
// finished.
func (a *answer) whole() bool { return a.done || a.finished }

// tokens is the answer's output tokens so far: its token events (vLLM and SGLang stream one
// token a chunk), or the engine's usage when it counts more.
func (a *answer) tokens() int64 { return max(a.events, a.usage.Completion) }

// readEvent reads the next server-sent event from src: its raw bytes (its lines and the blank
// line that ends it) and its data (the first data line's value; nil for an event of comments
// only), both in *buf, which it reuses and which the next call overwrites. A line longer than
// the reader's buffer is read whole. At the stream's end it returns io.EOF (an event cut off by
// the end, without its blank line, is returned first); any other read error as it is.
func readEvent(src *bufio.Reader, buf *[]byte) (raw, data []byte, err error) {
	b := (*buf)[:0]
	defer func() { *buf = b[:0] }()
	dStart, dEnd := -1, -1
	for {
		ls := len(b)
		for {
			var line []byte
			line, err = src.ReadSlice('\n')
			b = append(b, line...)
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		if err != nil && err != io.EOF {
			return nil, nil, err
		}
		t := bytes.TrimRight(b[ls:], "\r\n")
		if dStart < 0 && bytes.HasPrefix(t, []byte("data:")) {
			dStart, dEnd = ls+5, ls+len(t)
			if dStart < dEnd && b[dStart] == ' ' {
				dStart++
			}
		}
		if (len(t) == 0 && len(b) > ls) || (err == io.EOF && len(b) > 0) {
			if len(bytes.TrimSpace(b)) > 0 {
				if dStart >= 0 {
					data = b[dStart:dEnd]
				}
				return b, data, nil
			}
			b, dStart = b[:0], -1
		}
		if err == io.EOF {
			return nil, nil, io.EOF
		}
	}
}
