package server

import (
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// The open-file limit is shared with everything else the daemon holds: the embedded NATS
// server's clients and store, Pebble's tables and logs, ZMQ sockets, the listeners. The default
// connection limit leaves them fileReserve plus an eighth of the limit, and stops at
// maxDefaultConns: a connection that has been answered keeps its read and write buffers (80 KiB
// by default) while it stays open, 1.25 GiB for 16,384 of them, whatever the file limit (often
// 2^20 in containers).
const (
	fileReserve     = 256
	maxDefaultConns = 1 << 14
	minDefaultConns = 64
)

// DefaultMaxConns is the connection limit derived from an open-file limit: nofile minus a
// reserve of 256 plus nofile/8 for the daemon's other files, between 64 and 16,384.
func DefaultMaxConns(nofile uint64) int {
	reserve := fileReserve + nofile/8
	if nofile <= reserve+minDefaultConns {
		return minDefaultConns
	}
	return int(min(nofile-reserve, maxDefaultConns))
}

// FileLimit is the process's soft open-file limit (RLIMIT_NOFILE), which Go raises to the hard
// limit when the process starts; 1024 if it cannot be read.
func FileLimit() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur == 0 {
		return 1024
	}
	return l.Cur
}

// refusal is the answer to a connection refused for a limit: fasthttp's own overflow answers
// are 503 and 429 with a line of text; this one tells a client it may retry.
var refusal = []byte("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n" +
	"Retry-After: 1\r\nContent-Length: 21\r\n\r\ntoo many connections\n")

// Accept back-off bounds while the process is out of files (the delays net/http uses).
const (
	minAcceptDelay = 5 * time.Millisecond
	maxAcceptDelay = time.Second
)

// evictSample is how many open connections an eviction looks at; it closes the one idle
// longest among them. An exact order would cost a shared list update on every request.
const evictSample = 16

// logEvery bounds the refusal and accept-error log lines to one per kind in this period.
const logEvery = 10 * time.Second

// Reasons a connection is refused, the label values of the refusal counter.
const (
	refusedLimit = iota // the total limit, with no idle connection to close instead
	refusedPerIP        // the client address's limit
	numRefusals
)

var refusalNames = [numRefusals]string{"limit", "per_ip"}

// The listeners that share a Server's connection limits, the label values of the per-listener
// connection metrics: the API (Serve), the selection service (ServeSelection) and the front door
// (ServeFrontDoor). One set of limits for all of them, as they draw on one open-file limit: a
// flood on one listener makes room by closing the idle connections of any, so that another
// listener's health probe still gets in.
const (
	lnAPI = iota
	lnSelection
	lnFrontDoor
	lnSlotTracker
	numListeners
)

var listenerNames = [numListeners]string{"api", "selection", "frontdoor", "slot_tracker"}

// listenerStats are one listener's connection counters.
type listenerStats struct {
	open                            int // REQUIRES conns.mu
	accepted, evicted, acceptErrors atomic.Uint64
	refused                         [numRefusals]atomic.Uint64
}

// conns bounds the Server's open connections, in total and per client address, and rides out
// accept errors of a process out of files. At the total limit, or out of files, it closes the
// connection that has waited longest for a request (as nginx reuses its idle connections), so
// that a new client, a health probe for one, gets in while idle connections hold every slot;
// beyond a client address's limit it refuses. Accept runs on the Serve goroutine of each
// listener; close and the state hook on the connections' goroutines; all under mu or atomic.
type conns struct {
	max, maxPerIP int
	// maxBody is the request-body limit of the servers on its listeners (Config.MaxBodyBytes),
	// which a connection tells an error handler that has no other way to know it.
	maxBody int
	log     *slog.Logger
	// epoch counts admissions from 1: a connection's idle word holds the epoch when it began
	// waiting, which orders idle connections as finely as evictions need (one per admission)
	// for an atomic load per request, where a clock reading costs more than the rest together.
	epoch atomic.Int64

	mu    sync.Mutex
	open  []*conn // every admitted connection not closed yet; conn.slot is its index
	perIP map[netip.Addr]int

	// The totals over every listener, and each listener's share (byLn).
	accepted, evicted atomic.Uint64
	refused           [numRefusals]atomic.Uint64
	acceptErrors      atomic.Uint64
	byLn              [numListeners]listenerStats
	lastLog           [numRefusals + 3]atomic.Int64 // refusals, eviction, out of files, other accept errors
}

func newConns(max, maxPerIP int, log *slog.Logger) *conns {
	c := &conns{max: max, maxPerIP: maxPerIP, log: log, perIP: map[netip.Addr]int{}}
	c.epoch.Store(1)
	return c
}

// conn is one admitted connection. idle is the epoch when it began waiting for a request
// (accepted, or its last answer written), 0 from the request's first byte until its answer is
// written. fasthttp reports a new connection active before reading anything, and a kept-alive one
// once a byte has come, so the first request is seen by Read and the next ones by the state hook
// (also those already buffered behind a pipelined one, which Read never sees).
type conn struct {
	net.Conn
	c      *conns
	ip     netip.Addr // invalid for a listener without IP addresses: no per-address limit
	ln     uint8      // the listener that accepted it: lnAPI, …
	idle   atomic.Int64
	served bool // an answer was written; owned by the connection's goroutine
	once   sync.Once
	slot   int // REQUIRES: c.mu
}

// NetConn returns the connection it wraps (peer.Gone looks at its socket).
func (cn *conn) NetConn() net.Conn { return cn.Conn }

// Idle reports whether no byte of a request has come since the connection was admitted or its
// last answer written: an error fasthttp reports on it then is the connection's timeout or
// close, not a request's, and an error handler answers it without counting or logging it
// (which a flood of idle connections would turn into a flood).
func (cn *conn) Idle() bool { return cn.idle.Load() != 0 }

// MaxBodyBytes is the request-body limit the connection is served under (--max-body-bytes; an
// endpoint of the API may have a lower one).
func (cn *conn) MaxBodyBytes() int { return cn.c.maxBody }

// Read marks the connection busy when its first request arrives.
func (cn *conn) Read(p []byte) (int, error) {
	n, err := cn.Conn.Read(p)
	if n > 0 && cn.idle.Load() != 0 {
		cn.idle.Store(0)
	}
	return n, err
}

// Close closes the connection once and gives back its places.
func (cn *conn) Close() error {
	_, err := cn.closeOnce()
	return err
}

// closeOnce closes the connection, and reports whether this call did.
func (cn *conn) closeOnce() (closed bool, err error) {
	err = net.ErrClosed
	cn.once.Do(func() {
		cn.c.release(cn)
		closed, err = true, cn.Conn.Close()
	})
	return closed, err
}

func (c *conns) release(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	last := len(c.open) - 1
	c.open[cn.slot] = c.open[last]
	c.open[cn.slot].slot = cn.slot
	c.open[last] = nil
	c.open = c.open[:last]
	c.byLn[cn.ln].open--
	if cn.ip.IsValid() {
		if n := c.perIP[cn.ip] - 1; n > 0 {
			c.perIP[cn.ip] = n
		} else {
			delete(c.perIP, cn.ip)
		}
	}
}

// connState is the fasthttp.Server's ConnState hook: it keeps each connection's idle word
// for evictions.
func (c *conns) connState(nc net.Conn, st fasthttp.ConnState) {
	cn, ok := nc.(*conn)
	if !ok {
		return
	}
	switch st {
	case fasthttp.StateActive:
		if cn.served {
			cn.idle.Store(0)
		}
	case fasthttp.StateIdle:
		cn.served = true
		cn.idle.Store(c.epoch.Load())
	}
}

// admit returns nc as an admitted connection, or nil once it has refused and closed it.
// ln is the listener that accepted it. Called by one Accept at a time per listener; several
// listeners may call it concurrently.
func (c *conns) admit(nc net.Conn, ln uint8) net.Conn {
	var ip netip.Addr
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		ip = a.AddrPort().Addr().Unmap()
	}
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		if ip.IsValid() && c.perIP[ip] >= c.maxPerIP {
			c.mu.Unlock()
			c.refuse(nc, ln, refusedPerIP)
			return nil
		}
		if len(c.open) < c.max {
			cn := &conn{Conn: nc, c: c, ip: ip, ln: ln, slot: len(c.open)}
			cn.idle.Store(c.epoch.Add(1))
			c.open = append(c.open, cn)
			c.byLn[ln].open++
			if ip.IsValid() {
				c.perIP[ip]++
			}
			c.mu.Unlock()
			c.accepted.Add(1)
			c.byLn[ln].accepted.Add(1)
			return cn
		}
		var victim *conn
		if attempt < 2 { // a second try only if another listener took the room
			victim = c.idlestLocked()
		}
		c.mu.Unlock()
		if victim == nil {
			break
		}
		c.evict(victim, "the connection limit")
	}
	c.refuse(nc, ln, refusedLimit)
	return nil
}

// idlestLocked returns the connection idle longest among a sample of the open ones, nil if
// none of them is idle. REQUIRES: c.mu.
func (c *conns) idlestLocked() *conn {
	var best *conn
	var since int64
	n := len(c.open)
	for i := range min(n, evictSample) {
		j := i
		if n > evictSample {
			j = rand.IntN(n)
		}
		cn := c.open[j]
		if t := cn.idle.Load(); t != 0 && (best == nil || t < since) {
			best, since = cn, t
		}
	}
	return best
}

// evict closes an idle connection to make room; a request that arrives on it as it closes
// meets a closed connection, as with any server's idle timeout, and HTTP clients retry it.
func (c *conns) evict(cn *conn, why string) {
	if closed, _ := cn.closeOnce(); !closed {
		return // it closed itself meanwhile
	}
	c.evicted.Add(1)
	c.byLn[cn.ln].evicted.Add(1)
	if c.logDue(numRefusals) {
		c.log.Warn("idle HTTP connection closed to admit a new one", "why", why, "listener", listenerNames[cn.ln], "remote", cn.RemoteAddr().String(),
			"evicted_total", c.evicted.Load(), "open", c.openCount())
	}
}

// refuse answers nc with 503 and closes it. The answer fits an empty socket buffer; the
// deadline only keeps a broken socket from holding the accept loop.
func (c *conns) refuse(nc net.Conn, ln uint8, reason int) {
	c.refused[reason].Add(1)
	c.byLn[ln].refused[reason].Add(1)
	_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = nc.Write(refusal)
	_ = nc.Close()
	if c.logDue(reason) {
		c.log.Warn("HTTP connection refused", "reason", refusalNames[reason], "listener", listenerNames[ln], "remote", nc.RemoteAddr().String(),
			"max_conns", c.max, "max_conns_per_ip", c.maxPerIP, "refused_total", c.refused[reason].Load())
	}
}

// logDue reports whether a line of kind k may be logged now: one per logEvery.
func (c *conns) logDue(k int) bool {
	now := time.Now().UnixNano()
	last := c.lastLog[k].Load()
	return (last == 0 || now-last >= int64(logEvery)) && c.lastLog[k].CompareAndSwap(last, now)
}

func (c *conns) openCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.open)
}

// shutdownGrace is how long a shutdown waits before it closes the connections waiting for a
// request: one accepted just before the listener closed has the time to send its request.
const shutdownGrace = time.Second

// closeIdle closes, after grace and then every 100 ms until stop, the connections waiting
// for a request.
func (c *conns) closeIdle(stop <-chan struct{}, grace time.Duration) {
	if grace > 0 {
		wait := time.NewTimer(grace)
		defer wait.Stop()
		select {
		case <-stop:
			return
		case <-wait.C:
		}
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var idle []*conn
	for {
		c.mu.Lock()
		for _, cn := range c.open {
			if cn.idle.Load() != 0 {
				idle = append(idle, cn)
			}
		}
		c.mu.Unlock()
		for i, cn := range idle {
			cn.Close()
			idle[i] = nil
		}
		idle = idle[:0]
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// outOfFiles reports whether err is accept's failure for want of a file or buffer: the
// pending connection stays in the backlog, and accepting it again later succeeds.
func outOfFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// listenerClosed reports whether err is an Accept's on a closed listener: net.ErrClosed, or what
// fasthttp's Serve takes for one (io.EOF, "use of closed network connection", as listeners
// outside package net say it).
func listenerClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || strings.Contains(err.Error(), "use of closed network connection")
}

// listener is a net.Listener whose Accept admits through conns: it returns only connections
// within the limits, and no error but the listener's close: fasthttp's Serve takes any other for
// fatal, and ends the daemon with it. Accept is called by one goroutine (Serve's); Close by any.
type listener struct {
	net.Listener
	c     *conns
	ln    uint8 // which listener: lnAPI, …
	done  chan struct{}
	close sync.Once
}

func (c *conns) listener(ln net.Listener, which uint8) *listener {
	return &listener{Listener: ln, c: c, ln: which, done: make(chan struct{})}
}

// Accept waits for a connection within the limits. Out of files, it closes the connection idle
// longest and tries again at once, or, with none idle, waits 5 ms, doubling to 1 s; any other
// error but the listener's close is logged and retried after the same waits.
func (l *listener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		nc, err := l.Listener.Accept()
		if err == nil {
			delay = 0
			if cn := l.c.admit(nc, l.ln); cn != nil {
				return cn, nil
			}
			continue
		}
		if l.closed() {
			// Closed while the accept failed for another reason (out of files): the caller
			// must learn that the listener is closed, not retry.
			return nil, net.ErrClosed
		}
		if listenerClosed(err) {
			return nil, err
		}
		l.c.acceptErrors.Add(1)
		l.c.byLn[l.ln].acceptErrors.Add(1)
		if !outOfFiles(err) {
			if l.c.logDue(numRefusals + 2) {
				l.c.log.Error("HTTP accept failed, retrying", "listener", listenerNames[l.ln], "err", err,
					"accept_errors_total", l.c.acceptErrors.Load())
			}
		} else {
			l.c.mu.Lock()
			victim := l.c.idlestLocked()
			l.c.mu.Unlock()
			if l.c.logDue(numRefusals + 1) {
				l.c.log.Warn("HTTP accept failed, retrying: the process is out of files; lower --http-max-conns or raise the open-file limit",
					"listener", listenerNames[l.ln], "err", err, "open", l.c.openCount(), "max_conns", l.c.max,
					"accept_errors_total", l.c.acceptErrors.Load(), "closing_idle", victim != nil)
			}
			if victim != nil {
				l.c.evict(victim, "out of files")
				continue
			}
		}
		delay = min(max(2*delay, minAcceptDelay), maxAcceptDelay)
		select {
		case <-time.After(delay):
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

func (l *listener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// Close stops Accept, also in its back-off.
func (l *listener) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// KeepAccepting returns ln with an Accept that never fails but for ln's close: any other error
// is logged (at most once per 10 s) and retried after 5 ms, doubling to 1 s, as a listener
// that must never end the process needs. For a listener without connection limits (the admin
// one); Accept is called by one goroutine, Close by any.
func KeepAccepting(ln net.Listener, name string, log *slog.Logger) net.Listener {
	return &patientListener{Listener: ln, name: name, log: log, done: make(chan struct{})}
}

type patientListener struct {
	net.Listener
	name    string
	log     *slog.Logger
	errors  atomic.Uint64
	lastLog atomic.Int64
	done    chan struct{}
	close   sync.Once
}

func (l *patientListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		nc, err := l.Listener.Accept()
		if err == nil {
			return nc, nil
		}
		select {
		case <-l.done:
			return nil, err
		default:
		}
		if listenerClosed(err) {
			return nil, err
		}
		n := l.errors.Add(1)
		now, last := time.Now().UnixNano(), l.lastLog.Load()
		if (last == 0 || now-last >= int64(logEvery)) && l.lastLog.CompareAndSwap(last, now) {
			l.log.Error("accept failed, retrying", "listener", l.name, "err", err, "accept_errors", n)
		}
		delay = min(max(2*delay, minAcceptDelay), maxAcceptDelay)
		select {
		case <-time.After(delay):
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

func (l *patientListener) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// connCollector reads the connection counters at scrape time.
type connCollector struct{ c *conns }

var (
	descConnsOpen    = prometheus.NewDesc("kvrouterd_http_connections_open", "HTTP connections open.", nil, nil)
	descConnsMax     = prometheus.NewDesc("kvrouterd_http_connections_max", "The limits on open HTTP connections: in total, and per client address.", []string{"scope"}, nil)
	descConnsAcc     = prometheus.NewDesc("kvrouterd_http_connections_accepted_total", "HTTP connections admitted.", nil, nil)
	descConnsRefused = prometheus.NewDesc("kvrouterd_http_connections_refused_total", "HTTP connections refused with 503, by limit: the total (no idle connection to close instead), or the client address's.", []string{"reason"}, nil)
	descConnsEvicted = prometheus.NewDesc("kvrouterd_http_connections_evicted_total", "Idle HTTP connections closed to admit a new one, at the limit or out of files.", nil, nil)
	descAcceptErrors = prometheus.NewDesc("kvrouterd_http_accept_errors_total", "Accepts that failed and were retried: for want of files (EMFILE, ENFILE) or buffers, or any other error but the listener's close.", nil, nil)

	// Each listener's share of the totals above.
	lnLabel            = []string{"listener"}
	descLnConnsOpen    = prometheus.NewDesc("kvrouterd_http_listener_connections_open", "HTTP connections open, by listener (api, selection, frontdoor); they share kvrouterd_http_connections_max.", lnLabel, nil)
	descLnConnsAcc     = prometheus.NewDesc("kvrouterd_http_listener_connections_accepted_total", "HTTP connections admitted, by listener.", lnLabel, nil)
	descLnConnsRefused = prometheus.NewDesc("kvrouterd_http_listener_connections_refused_total", "HTTP connections refused with 503, by listener and limit.", []string{"listener", "reason"}, nil)
	descLnConnsEvicted = prometheus.NewDesc("kvrouterd_http_listener_connections_evicted_total", "Idle HTTP connections closed to admit a new one, by the listener of the connection closed.", lnLabel, nil)
	descLnAcceptErrors = prometheus.NewDesc("kvrouterd_http_listener_accept_errors_total", "Accepts that failed and were retried, by listener.", lnLabel, nil)
)

func (cc connCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnsOpen, descConnsMax, descConnsAcc, descConnsRefused, descConnsEvicted, descAcceptErrors,
		descLnConnsOpen, descLnConnsAcc, descLnConnsRefused, descLnConnsEvicted, descLnAcceptErrors} {
		ch <- d
	}
}

func (cc connCollector) Collect(ch chan<- prometheus.Metric) {
	c := cc.c
	ch <- prometheus.MustNewConstMetric(descConnsOpen, prometheus.GaugeValue, float64(c.openCount()))
	ch <- prometheus.MustNewConstMetric(descConnsMax, prometheus.GaugeValue, float64(c.max), "total")
	ch <- prometheus.MustNewConstMetric(descConnsMax, prometheus.GaugeValue, float64(c.maxPerIP), "per_ip")
	ch <- prometheus.MustNewConstMetric(descConnsAcc, prometheus.CounterValue, float64(c.accepted.Load()))
	for r := range numRefusals {
		ch <- prometheus.MustNewConstMetric(descConnsRefused, prometheus.CounterValue, float64(c.refused[r].Load()), refusalNames[r])
	}
	ch <- prometheus.MustNewConstMetric(descConnsEvicted, prometheus.CounterValue, float64(c.evicted.Load()))
	ch <- prometheus.MustNewConstMetric(descAcceptErrors, prometheus.CounterValue, float64(c.acceptErrors.Load()))
	var open [numListeners]int
	c.mu.Lock()
	for i := range open {
		open[i] = c.byLn[i].open
	}
	c.mu.Unlock()
	for i := range c.byLn {
		st, name := &c.byLn[i], listenerNames[i]
		ch <- prometheus.MustNewConstMetric(descLnConnsOpen, prometheus.GaugeValue, float64(open[i]), name)
		ch <- prometheus.MustNewConstMetric(descLnConnsAcc, prometheus.CounterValue, float64(st.accepted.Load()), name)
		for r := range numRefusals {
			ch <- prometheus.MustNewConstMetric(descLnConnsRefused, prometheus.CounterValue, float64(st.refused[r].Load()), name, refusalNames[r])
		}
		ch <- prometheus.MustNewConstMetric(descLnConnsEvicted, prometheus.CounterValue, float64(st.evicted.Load()), name)
		ch <- prometheus.MustNewConstMetric(descLnAcceptErrors, prometheus.CounterValue, float64(st.acceptErrors.Load()), name)
	}
}
