package server

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// fakeConn is a connection from a client address that records what the server writes and
// whether it closed it; Read returns one byte, as a request's arrival.
type fakeConn struct {
	remote  net.Addr
	mu      sync.Mutex
	written bytes.Buffer
	closed  bool
}

func newFakeConn(ip string, port int) *fakeConn {
	return &fakeConn{remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}}
}

func (f *fakeConn) Read(p []byte) (int, error) { p[0] = 'G'; return 1, nil }
func (f *fakeConn) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.written.Write(p)
}
func (f *fakeConn) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}
func (f *fakeConn) isClosed() bool                   { f.mu.Lock(); defer f.mu.Unlock(); return f.closed }
func (f *fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8090} }
func (f *fakeConn) RemoteAddr() net.Addr             { return f.remote }
func (f *fakeConn) SetDeadline(time.Time) error      { return nil }
func (f *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (f *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// fakeListener's Accept returns its queued results in order, then blocks until Close.
type fakeListener struct {
	mu      sync.Mutex
	results []any // net.Conn or error
	closed  chan struct{}
}

func newFakeListener(results ...any) *fakeListener {
	return &fakeListener{results: results, closed: make(chan struct{})}
}

func (l *fakeListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.results) == 0 {
		l.mu.Unlock()
		<-l.closed
		return nil, net.ErrClosed
	}
	r := l.results[0]
	l.results = l.results[1:]
	l.mu.Unlock()
	if err, ok := r.(error); ok {
		return nil, err
	}
	return r.(net.Conn), nil
}

func (l *fakeListener) Close() error   { close(l.closed); return nil }
func (l *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8090} }

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// emfile is accept4's error when the process is out of files, as package net returns it.
func emfile() error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

// TestListenerOutOfFiles: Accept rides out EMFILE and ENFILE, and any other error but the
// listener's close (fasthttp's Serve takes each for fatal), counting them, and returns the
// connection that comes next.
func TestListenerOutOfFiles(t *testing.T) {
	c := newConns(10, 10, quietLog())
	want := newFakeConn("10.0.0.1", 1)
	enfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.ENFILE)}
	other := errors.New("listener broken")
	ln := c.listener(newFakeListener(emfile(), emfile(), enfile, other, emfile(), want, net.ErrClosed), lnFrontDoor)
	got, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept after EMFILE: %v", err)
	}
	if got.(*conn).Conn != want || c.acceptErrors.Load() != 5 || c.openCount() != 1 {
		t.Fatalf("got %v, accept errors %d, open %d; want the queued connection, 5, 1", got, c.acceptErrors.Load(), c.openCount())
	}
	if st := &c.byLn[lnFrontDoor]; st.acceptErrors.Load() != 5 || st.accepted.Load() != 1 || c.byLn[lnAPI].accepted.Load() != 0 {
		t.Fatalf("front door: %d accept errors, %d accepted; API %d accepted", st.acceptErrors.Load(), st.accepted.Load(), c.byLn[lnAPI].accepted.Load())
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the listener closed: got %v, want net.ErrClosed", err)
	}

	// Out of files with an idle connection open: that one is closed to free a file, and the
	// pending connection is accepted.
	next := newFakeConn("10.0.0.2", 1)
	ln = c.listener(newFakeListener(emfile(), next), lnAPI)
	if got, err := ln.Accept(); err != nil || got.(*conn).Conn != next {
		t.Fatalf("Accept: %v %v", got, err)
	}
	if !want.isClosed() || c.evicted.Load() != 1 || c.openCount() != 1 {
		t.Fatalf("idle connection closed %v, evicted %d, open %d; want true, 1, 1", want.isClosed(), c.evicted.Load(), c.openCount())
	}
	// The front door's connection made room for the API's, each counted under its listener.
	c.mu.Lock()
	fdOpen, apiOpen := c.byLn[lnFrontDoor].open, c.byLn[lnAPI].open
	c.mu.Unlock()
	if c.byLn[lnFrontDoor].evicted.Load() != 1 || fdOpen != 0 || apiOpen != 1 {
		t.Fatalf("front door: evicted %d, open %d; API open %d; want 1, 0, 1", c.byLn[lnFrontDoor].evicted.Load(), fdOpen, apiOpen)
	}

	// Close ends an Accept waiting out EMFILE with nothing idle to close.
	busy := newConns(10, 10, quietLog())
	results := []any{}
	for range 1000 {
		results = append(results, emfile())
	}
	ln = busy.listener(newFakeListener(results...), lnAPI)
	done := make(chan error, 1)
	go func() { _, err := ln.Accept(); done <- err }()
	for busy.acceptErrors.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ln.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waiting 10 s after Close")
	}
}

// TestConnLimits: beyond a client address's limit a connection is refused with 503; at the
// total limit it takes the place of the connection idle longest, and is refused only when none
// is idle; closing a connection gives its places back.
func TestConnLimits(t *testing.T) {
	c := newConns(3, 2, quietLog())
	admit := func(f *fakeConn) *conn {
		t.Helper()
		nc := c.admit(f, lnAPI)
		if nc == nil {
			t.Fatalf("%v refused: %q", f.remote, f.written.String())
		}
		return nc.(*conn)
	}
	refused := func(f *fakeConn, reason string) {
		t.Helper()
		if nc := c.admit(f, lnAPI); nc != nil {
			t.Fatalf("%v admitted, want refused (%s)", f.remote, reason)
		}
		if !f.isClosed() || !bytes.HasPrefix(f.written.Bytes(), []byte("HTTP/1.1 503 ")) {
			t.Fatalf("%v: closed %v, answer %q; want closed after a 503", f.remote, f.isClosed(), f.written.String())
		}
	}
	busy := func(cn *conn) { cn.Read(make([]byte, 1)) } // a request's first byte
	served := func(cn *conn) { c.connState(cn, fasthttp.StateIdle) }

	a1, a2 := admit(newFakeConn("10.0.0.1", 1)), admit(newFakeConn("10.0.0.1", 2))
	refused(newFakeConn("10.0.0.1", 3), "per_ip")
	refused(newFakeConn("::ffff:10.0.0.1", 4), "per_ip") // the same address, IPv4-mapped
	b1 := admit(newFakeConn("2001:db8::1", 1))
	for _, cn := range []*conn{a1, a2, b1} {
		busy(cn)
	}
	// fasthttp says a new connection is active before it reads anything: still idle.
	c.connState(b1, fasthttp.StateActive)
	refused(newFakeConn("10.0.0.3", 1), "limit")
	if got := c.refused[refusedPerIP].Load(); got != 2 {
		t.Fatalf("per-address refusals %d, want 2", got)
	}
	if got := c.refused[refusedLimit].Load(); got != 1 {
		t.Fatalf("limit refusals %d, want 1", got)
	}

	// a2 answers, then a1: a1 is now the only idle one, and a new client takes its place.
	served(a2)
	c.connState(a2, fasthttp.StateActive) // its next request has come
	served(a1)
	c3 := admit(newFakeConn("10.0.0.3", 2))
	if !a1.Conn.(*fakeConn).isClosed() || a2.Conn.(*fakeConn).isClosed() || c.evicted.Load() != 1 || c.openCount() != 3 {
		t.Fatalf("a1 closed %v, a2 closed %v, evicted %d, open %d; want a1 alone closed, 1, 3",
			a1.Conn.(*fakeConn).isClosed(), a2.Conn.(*fakeConn).isClosed(), c.evicted.Load(), c.openCount())
	}
	// a1's place for its address is free again; the server's own Close of a1 changes nothing.
	if err := a1.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	// c3 has sent nothing yet, so it is the idle one now.
	a3 := admit(newFakeConn("10.0.0.1", 5))
	if !c3.Conn.(*fakeConn).isClosed() || c.openCount() != 3 {
		t.Fatalf("c3 closed %v, open %d", c3.Conn.(*fakeConn).isClosed(), c.openCount())
	}
	busy(a3)
	b1.Close()
	admit(newFakeConn("10.0.0.4", 1)) // b1's place
	if c.evicted.Load() != 2 {
		t.Fatalf("evicted %d, want 2", c.evicted.Load())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.perIP) != 2 || c.perIP[mustAddr("10.0.0.1")] != 2 || c.perIP[mustAddr("10.0.0.4")] != 1 {
		t.Fatalf("per-address counts %v", c.perIP)
	}
	for i, cn := range c.open {
		if cn.slot != i {
			t.Fatalf("open[%d] says slot %d", i, cn.slot)
		}
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestDefaultMaxConns(t *testing.T) {
	f := func(nofile uint64, want int) {
		t.Helper()
		if got := DefaultMaxConns(nofile); got != want {
			t.Fatalf("DefaultMaxConns(%d) = %d, want %d", nofile, got, want)
		}
	}
	f(0, 64)
	f(256, 64)
	f(1024, 1024-256-128)
	f(10000, 10000-256-1250)
	f(20000, 1<<14)
	f(1<<20, 1<<14)
	if FileLimit() == 0 {
		t.Fatal("FileLimit 0")
	}
}

// TestCloseIdle: a shutdown closes the connections waiting for a request, and leaves those
// serving one.
func TestCloseIdle(t *testing.T) {
	c := newConns(10, 10, quietLog())
	idle, busy, answered := newFakeConn("10.0.0.1", 1), newFakeConn("10.0.0.1", 2), newFakeConn("10.0.0.1", 3)
	c.admit(idle, lnAPI)
	c.admit(busy, lnAPI).Read(make([]byte, 1))
	cn := c.admit(answered, lnAPI).(*conn)
	cn.Read(make([]byte, 1))
	c.connState(cn, fasthttp.StateIdle)
	stop := make(chan struct{})
	close(stop)
	c.closeIdle(stop, time.Hour) // stopped in its grace: closes nothing
	if idle.isClosed() || answered.isClosed() {
		t.Fatal("closed during the grace")
	}
	c.closeIdle(stop, 0) // one pass
	if !idle.isClosed() || busy.isClosed() || !answered.isClosed() || c.openCount() != 1 {
		t.Fatalf("closed: never used %v, busy %v, answered %v; open %d; want the busy one alone open",
			idle.isClosed(), busy.isClosed(), answered.isClosed(), c.openCount())
	}
}

// request is what one kept-alive request costs the connection bookkeeping: the first byte's
// Read, and fasthttp's active and idle states.
func request(c *conns, cn *conn, buf []byte) {
	cn.Read(buf)
	c.connState(cn, fasthttp.StateActive)
	c.connState(cn, fasthttp.StateIdle)
}

// TestConnBookkeepingAllocs: the bookkeeping on the request path allocates nothing.
func TestConnBookkeepingAllocs(t *testing.T) {
	c := newConns(10, 10, quietLog())
	cn := c.admit(newFakeConn("10.0.0.1", 1), lnAPI).(*conn)
	buf := make([]byte, 1)
	if n := testing.AllocsPerRun(1000, func() { request(c, cn, buf) }); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}

func BenchmarkConnsRequest(b *testing.B) {
	c := newConns(10, 10, quietLog())
	cn := c.admit(newFakeConn("10.0.0.1", 1), lnAPI).(*conn)
	buf := make([]byte, 1)
	b.ReportAllocs()
	for b.Loop() {
		request(c, cn, buf)
	}
}

// TestKeepAccepting: an Accept error but the listener's close is retried, never returned (net/http
// and fasthttp end their Serve on it); Close ends an Accept in its back-off.
func TestKeepAccepting(t *testing.T) {
	want := newFakeConn("10.0.0.1", 1)
	ln := KeepAccepting(newFakeListener(errors.New("accept broken"), emfile(), want, net.ErrClosed), "admin", quietLog())
	if got, err := ln.Accept(); err != nil || got != want {
		t.Fatalf("Accept: %v %v; want the queued connection", got, err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on a closed listener: %v, want net.ErrClosed", err)
	}
	// A listener outside package net says it is closed as fasthttp's Serve expects.
	ln = KeepAccepting(newFakeListener(fasthttputil.ErrInmemoryListenerClosed), "admin", quietLog())
	if _, err := ln.Accept(); err != fasthttputil.ErrInmemoryListenerClosed {
		t.Fatalf("Accept on a closed in-memory listener: %v", err)
	}

	results := []any{}
	for range 1000 {
		results = append(results, errors.New("accept broken"))
	}
	ln = KeepAccepting(newFakeListener(results...), "admin", quietLog())
	done := make(chan error, 1)
	go func() { _, err := ln.Accept(); done <- err }()
	time.Sleep(20 * time.Millisecond)
	ln.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waiting 10 s after Close")
	}
}
