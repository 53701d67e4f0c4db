package frontdoor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// upstream is the front door's HTTP/1.1 client for the requests it forwards to the workers'
// http:// APIs. A call runs on its caller's goroutine from the request's write to the answer's
// last byte, where net/http's client hands each request to a writing goroutine and its answer
// back from a reading one: on a loopback worker those hand-offs were a large part of what the
// front door adds to a request. Any call can be cancelled at any moment, before the answer's
// headers as during its body, by its cancel function: it interrupts the connection's reads and
// writes and the connection is closed, which ends the engine's request. Connections are kept
// per worker for the next call while idle for less than upIdleTimeout. Safe for concurrent use.
type upstream struct {
	dialer net.Dialer
	mu     sync.Mutex
	idle   map[string][]*upConn // by host:port, the most recently used last
	sweep  *time.Timer          // closes connections idle for too long; nil when none are idle
}

const (
	upIdleTimeout    = time.Minute
	upMaxIdlePerHost = 1024
)

// upConn is one connection to a worker, owned by one call at a time or by the idle pool.
type upConn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	hdr  fasthttp.ResponseHeader // the answer's in reading: fasthttp's parser allocates nothing
	host string                  // host:port
	used time.Time
	// rest is the end of an answer that was whole before its body ended (an event stream's
	// "data: [DONE]" seen; its last chunk and trailer to come): read by the connection's next
	// call before it sends, so that the answer's reader did not wait for it.
	rest io.Reader
}

// upRestWait bounds the wait for an answer's rest: it comes right after the answer's last
// event, long before the connection's next call.
const upRestWait = 20 * time.Millisecond

// upCall is one call's hold of its connection. cancel may come from any goroutine; release
// ends the hold.
type upCall struct {
	u         *upstream
	mu        sync.Mutex
	conn      *upConn            // nil while dialing
	dial      context.CancelFunc // the dial in progress's
	cancelled bool
	released  bool
}

// aLongTimeAgo is a deadline that interrupts a connection's reads and writes at once.
var aLongTimeAgo = time.Unix(1, 0)

func (c *upCall) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released || c.cancelled {
		return
	}
	c.cancelled = true
	if c.conn != nil {
		_ = c.conn.c.SetDeadline(aLongTimeAgo)
	}
	if c.dial != nil {
		c.dial()
	}
}

// release ends the call: its connection goes back to the pool when reuse says it may (the
// answer was read to its end, or is whole with rest to read, and the worker keeps the
// connection open) and the call was not cancelled, else it is closed. It may be called more
// than once.
func (c *upCall) release(reuse bool, rest io.Reader) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.released = true
	conn, keep := c.conn, reuse && !c.cancelled
	c.mu.Unlock()
	if conn == nil {
		return
	}
	if keep {
		conn.rest = rest
		c.u.put(conn)
	} else {
		_ = conn.c.Close()
	}
}

// upAnswer is a worker's answer: its status and headers, and its body still to read.
type upAnswer struct {
	status int
	ctype  string                   // Content-Type
	hdr    *fasthttp.ResponseHeader // http:// workers: good until Body is closed
	hh     http.Header              // https:// workers
	Body   io.ReadCloser
}

// Body framings.
const (
	bodyChunked = iota // Transfer-Encoding: chunked
	bodyLength         // Content-Length
	bodyClose          // to the connection's end
)

// upBody is an answer's body, unframed from the connection as it is read. Reading it to its
// end, or to its whole answer's end (Whole), makes the connection reusable, and closing it
// releases the call (without reading the rest: a worker's stream may be long).
type upBody struct {
	call    *upCall
	br      *bufio.Reader
	framing int
	n       int64 // bytes left: of the current chunk, or of a Content-Length body
	inChunk bool  // a chunk's data begun, its CRLF to come
	err     error // once the body ended: io.EOF, or why it broke off
	keep    bool  // the worker did not ask to close the connection
	whole   bool
}

// Whole says that the answer is whole although its body has not ended: an event stream's
// "data: [DONE]" was read. The rest is read by the connection's next call.
func (b *upBody) Whole() { b.whole = true }

func (b *upBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	switch b.framing {
	case bodyChunked:
		if b.n == 0 {
			if err := b.nextChunk(); err != nil {
				b.err = err
				return 0, err
			}
		}
	case bodyLength:
		if b.n == 0 {
			b.err = io.EOF
			return 0, io.EOF
		}
	case bodyClose:
		n, err := b.br.Read(p)
		if err != nil {
			b.err = err
		}
		return n, err
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.br.Read(p)
	b.n -= int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

var errChunk = errors.New("frontdoor: malformed chunked encoding in the worker's answer")

// nextChunk reads up to the next chunk's data: the CRLF that ends the last, the next's size
// line, and at the last chunk its trailer (io.EOF then).
func (b *upBody) nextChunk() error {
	if b.inChunk {
		line, err := b.line()
		if err != nil {
			return err
		}
		if len(line) != 0 {
			return errChunk
		}
		b.inChunk = false
	}
	line, err := b.line()
	if err != nil {
		return err
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i] // chunk extensions
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return errChunk
	}
	var size int64
	for _, c := range line {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return errChunk
		}
		size = size<<4 | int64(c)
	}
	if size > 0 {
		b.n, b.inChunk = size, true
		return nil
	}
	for { // the trailer, up to its blank line
		line, err := b.line()
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return io.EOF
		}
	}
}

// line reads a line of the chunked framing, without its CRLF.
func (b *upBody) line() ([]byte, error) {
	line, err := b.br.ReadSlice('\n')
	switch {
	case err == io.EOF:
		return nil, io.ErrUnexpectedEOF
	case err == bufio.ErrBufferFull:
		return nil, errChunk
	case err != nil:
		return nil, err
	}
	return bytes.TrimRight(line, "\r\n"), nil
}

func (b *upBody) Close() error {
	ended := b.err == io.EOF
	var rest io.Reader
	if !ended && b.whole {
		rest = b
	}
	b.call.release((ended || b.whole) && b.keep, rest)
	return nil
}

// splitEndpoint returns an http:// endpoint's host:port to dial, its Host header and its path
// prefix; ok is false for any other scheme.
func splitEndpoint(endpoint string) (addr, host, prefix string, ok bool) {
	rest, ok := strings.CutPrefix(endpoint, "http://")
	if !ok {
		return "", "", "", false
	}
	host, prefix = rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		host, prefix = rest[:i], strings.TrimRight(rest[i:], "/")
	}
	if host == "" {
		return "", "", "", false
	}
	addr = host
	if _, _, err := net.SplitHostPort(host); err != nil {
		addr = net.JoinHostPort(strings.Trim(host, "[]"), "80")
	}
	return addr, host, prefix, true
}

// do posts o to the worker at addr (Host host, path) and returns its answer with the body
// still to read, under a call whose cancel it gives to attach before anything is sent; the
// answer's body is the call's, and closing it releases the call. Reads and writes end at
// deadline, when it is set. A request that failed on a reused connection before any byte of its
// answer came (the worker had closed it meanwhile) is sent again once, on a new connection.
func (u *upstream) do(addr, host, path string, o *outgoing, deadline time.Time, attach func(func())) (*upAnswer, error) {
	call := &upCall{u: u}
	attach(call.cancel)
	for try := 0; ; try++ {
		conn, reused, err := u.conn(call, addr, deadline, try > 0)
		if err != nil {
			call.release(false, nil)
			return nil, err
		}
		if err := conn.c.SetDeadline(deadline); err != nil {
			call.release(false, nil)
			return nil, err
		}
		a, stale, err := conn.roundTrip(call, host, path, o)
		if err == nil {
			return a, nil
		}
		call.mu.Lock()
		call.conn = nil
		cancelled := call.cancelled
		call.mu.Unlock()
		_ = conn.c.Close()
		if cancelled || !reused || !stale || try > 0 {
			call.release(false, nil)
			return nil, err
		}
	}
}

// conn gives the call a connection to addr: an idle one unless fresh, else a new one.
func (u *upstream) conn(call *upCall, addr string, deadline time.Time, fresh bool) (*upConn, bool, error) {
	if !fresh {
		if c := u.get(addr); c != nil {
			call.mu.Lock()
			call.conn = c
			cancelled := call.cancelled
			call.mu.Unlock()
			if cancelled {
				_ = c.c.SetDeadline(aLongTimeAgo)
			}
			return c, true, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(context.Background(), deadline)
	}
	defer cancel()
	call.mu.Lock()
	if call.cancelled {
		call.mu.Unlock()
		return nil, false, context.Canceled
	}
	call.dial = cancel
	call.mu.Unlock()
	nc, err := u.dialer.DialContext(ctx, "tcp", addr)
	call.mu.Lock()
	call.dial = nil
	if err == nil {
		c := &upConn{c: nc, br: bufio.NewReaderSize(nc, 4<<10), bw: bufio.NewWriterSize(nc, 4<<10), host: addr}
		call.conn = c
		if call.cancelled {
			_ = nc.SetDeadline(aLongTimeAgo)
		}
		call.mu.Unlock()
		return c, false, nil
	}
	call.mu.Unlock()
	return nil, false, err
}

// roundTrip writes the request and reads its answer's headers. stale says that it failed as a
// connection the worker had closed fails, before any byte of the answer came.
func (c *upConn) roundTrip(call *upCall, host, path string, o *outgoing) (a *upAnswer, stale bool, err error) {
	w := c.bw
	w.WriteString("POST ")
	w.WriteString(path)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(host)
	w.WriteString("\r\nUser-Agent: kvrouterd\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: ")
	var n [20]byte
	w.Write(strconv.AppendInt(n[:0], int64(len(o.body)), 10))
	if o.auth != "" {
		w.WriteString("\r\nAuthorization: ")
		w.WriteString(o.auth)
	}
	w.WriteString("\r\nX-Request-Id: ")
	w.WriteString(o.reqID)
	w.WriteString("\r\nX-Data-Parallel-Rank: ")
	w.Write(strconv.AppendUint(n[:0], uint64(o.rank), 10))
	w.WriteString("\r\n\r\n")
	w.Write(o.body)
	if err := w.Flush(); err != nil {
		return nil, isStale(err), err
	}
	for {
		if _, err := c.br.Peek(1); err != nil {
			return nil, isStale(err), err
		}
		h := &c.hdr
		if err := h.Read(c.br); err != nil {
			return nil, false, err
		}
		status := h.StatusCode()
		if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
			continue // 100 Continue and the like: the answer follows
		}
		b := &upBody{call: call, br: c.br, keep: !h.ConnectionClose()}
		switch n := h.ContentLength(); {
		case status == http.StatusNoContent || status == http.StatusNotModified:
			b.framing = bodyLength
		case n == -1:
			b.framing = bodyChunked
		case n >= 0:
			b.framing, b.n = bodyLength, int64(n)
		default:
			b.framing, b.keep = bodyClose, false
		}
		return &upAnswer{status: status, ctype: string(h.ContentType()), hdr: h, Body: b}, false, nil
	}
}

// isStale says whether err is what a connection the worker had closed gives.
func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (u *upstream) get(addr string) *upConn {
	u.mu.Lock()
	cs := u.idle[addr]
	for len(cs) > 0 {
		c := cs[len(cs)-1]
		cs[len(cs)-1] = nil
		cs = cs[:len(cs)-1]
		if time.Since(c.used) < upIdleTimeout {
			u.idle[addr] = cs
			u.mu.Unlock()
			if c.rest == nil || c.readRest() {
				return c
			}
			_ = c.c.Close()
			u.mu.Lock()
			cs = u.idle[addr]
			continue
		}
		_ = c.c.Close()
	}
	delete(u.idle, addr)
	u.mu.Unlock()
	return nil
}

// readRest reads the rest of the connection's last answer, and reports whether it ended as an
// answer ends.
func (c *upConn) readRest() bool {
	r := c.rest
	c.rest = nil
	if err := c.c.SetReadDeadline(time.Now().Add(upRestWait)); err != nil {
		return false
	}
	var buf [512]byte
	for {
		if _, err := r.Read(buf[:]); err != nil {
			return err == io.EOF && c.c.SetReadDeadline(time.Time{}) == nil
		}
	}
}

func (u *upstream) put(c *upConn) {
	_ = c.c.SetDeadline(time.Time{})
	c.used = time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.idle == nil {
		u.idle = make(map[string][]*upConn)
	}
	cs := u.idle[c.host]
	if len(cs) >= upMaxIdlePerHost {
		_ = c.c.Close()
		return
	}
	u.idle[c.host] = append(cs, c)
	if u.sweep == nil {
		u.sweep = time.AfterFunc(upIdleTimeout, u.sweepIdle)
	}
}

// sweepIdle closes the connections idle for upIdleTimeout, and comes again while some are
// idle.
func (u *upstream) sweepIdle() {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	for addr, cs := range u.idle {
		keep := cs[:0]
		for _, c := range cs {
			if now.Sub(c.used) < upIdleTimeout {
				keep = append(keep, c)
			} else {
				_ = c.c.Close()
			}
		}
		clear(cs[len(keep):])
		if len(keep) == 0 {
			delete(u.idle, addr)
		} else {
			u.idle[addr] = keep
		}
	}
	u.sweep = nil
	if len(u.idle) > 0 {
		u.sweep = time.AfterFunc(upIdleTimeout, u.sweepIdle)
	}
}

// closeIdle closes every idle connection.
func (u *upstream) closeIdle() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, cs := range u.idle {
		for _, c := range cs {
			_ = c.c.Close()
		}
	}
	clear(u.idle)
	if u.sweep != nil {
		u.sweep.Stop()
		u.sweep = nil
	}
}
