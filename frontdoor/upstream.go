package frontdoor

import (
	"bufio"
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
	host string // host:port
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

// upBody is an answer's body: reading it to its end, or to its whole answer's end (Whole),
// makes the connection reusable, and closing it releases the call (without reading the rest:
// a worker's stream may be long).
type upBody struct {
	call  *upCall
	body  io.ReadCloser
	keep  bool // the worker did not ask to close the connection
	ended bool
	whole bool
}

// Whole says that the answer is whole although its body has not ended: an event stream's
// "data: [DONE]" was read. The rest is read by the connection's next call.
func (b *upBody) Whole() { b.whole = true }

func (b *upBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.ended = true
	}
	return n, err
}

func (b *upBody) Close() error {
	var rest io.Reader
	if !b.ended && b.whole {
		rest = b.body
	}
	b.call.release((b.ended || b.whole) && b.keep, rest)
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
func (u *upstream) do(addr, host, path string, o *outgoing, deadline time.Time, attach func(func())) (*http.Response, error) {
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
		resp, stale, err := conn.roundTrip(host, path, o)
		if err == nil {
			resp.Body = &upBody{call: call, body: resp.Body, keep: !resp.Close}
			return resp, nil
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
func (c *upConn) roundTrip(host, path string, o *outgoing) (resp *http.Response, stale bool, err error) {
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
		if resp, err = http.ReadResponse(c.br, nil); err != nil {
			return nil, false, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue // 100 Continue and the like: the answer follows
		}
		return resp, false, nil
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
