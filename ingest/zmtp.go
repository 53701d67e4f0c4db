package ingest

// A guard beneath zmq4: every connection kvrouterd dials to an engine passes through a
// guardConn, which reads the ZMTP 3 stream ahead of zmq4 and hands it only bytes whose frame
// headers it has checked. zmq4 (v0.17) allocates whatever length a frame header claims, before
// a byte of the body has arrived: one 11-byte header from a hostile or broken peer panics the
// process (2^62), exhausts its memory (2^36), or wedges the subscription waiting for a body
// that never comes (2^30). The guard refuses, before zmq4 sees the header:
//
//   - a message (the sum of its frames) over the configured maximum, or of more than
//     zmtpMaxFrames frames, and a command frame over zmtpMaxCommand: ErrZMQMessageTooLarge;
//   - a peer silent for StallTimeout in the middle of a message, or before its handshake is
//     done: ErrZMQStalled.
//
// Either error ends the connection (zmq4 returns it from Recv, or from Dial during the
// handshake); the subscription counts it and dials again with backoff.
//
// Memory. zmq4 queues up to ten received messages per socket ahead of its reader. The guard
// also bounds what is queued: the data bytes it has let through and the socket's reader has not
// yet released (zmtpLimit.release, once a message is handled) stay within the maximum, one
// message of any allowed size always passing. So one subscription holds at most about the
// maximum, plus ten small commands and the guard's read buffer.
//
// The guard also buffers reads: zmq4 reads a frame's header and body with separate calls,
// which unbuffered cost several system calls per message.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// ErrZMQMessageTooLarge is returned (wrapped) when an engine's connection announces a message
// over EngineConfig.MaxMessageBytes; the connection is dropped.
var ErrZMQMessageTooLarge = errors.New("ingest: zmq message over the size limit")

// ErrZMQStalled is returned (wrapped) when an engine's connection stops in the middle of a
// message, or of its handshake, for EngineConfig.StallTimeout; the connection is dropped.
var ErrZMQStalled = errors.New("ingest: zmq peer stalled")

// errZMTP is wrapped by the guard's other refusals: frames that break ZMTP's rules.
var errZMTP = errors.New("ingest: zmq protocol")

const (
	zmtpGreeting   = 64       // ZMTP 3 greeting: signature, version, mechanism, as-server, filler
	zmtpMaxFrames  = 64       // frames in one message; engines send 3, replay replies 2 to 4
	zmtpMaxCommand = 64 << 10 // a command frame (READY, SUBSCRIBE, PING, ERROR) is small
	guardBufSize   = 32 << 10

	zmtpMore    = 1 << 0
	zmtpLong    = 1 << 1
	zmtpCommand = 1 << 2
)

// The schemes under which the guarded transports are registered with zmq4; guardedEndpoint
// rewrites an engine endpoint to them.
const (
	guardTCP = "kvrtcp"
	guardIPC = "kvripc"
)

func init() {
	for scheme, network := range map[string]string{guardTCP: "tcp", guardIPC: "unix"} {
		if err := zmq4.RegisterTransport(scheme, guardTransport{transport.New(network)}); err != nil {
			panic(err)
		}
	}
}

// guardedEndpoint is ep (tcp://… or ipc://…) under the guarded transport's scheme.
func guardedEndpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return guardTCP + "://" + rest
	}
	if rest, ok := strings.CutPrefix(ep, "ipc://"); ok {
		return guardIPC + "://" + rest
	}
	return ep // refused by zmq4 as an unknown transport: EngineSource.Validate allows no other
}

// limitKey is the context key under which a socket's *zmtpLimit reaches the transport: zmq4
// dials with the context the socket was made with.
type limitKey struct{}

// withLimit returns ctx carrying lim, for zmq4.NewSub or NewDealer.
func withLimit(ctx context.Context, lim *zmtpLimit) context.Context {
	return context.WithValue(ctx, limitKey{}, lim)
}

// guardTransport dials like zmq4's own transport and wraps the connection in a guardConn with
// the limit found in the socket's context.
type guardTransport struct{ transport.Transport }

func (t guardTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	lim, _ := ctx.Value(limitKey{}).(*zmtpLimit)
	if lim == nil {
		return nil, errors.New("ingest: guarded zmq transport dialled without a limit")
	}
	conn, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return lim.wrap(conn), nil
}

func (guardTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("ingest: the guarded zmq transport only dials")
}

// zmtpLimit is one socket's bound on what its peer may make it hold, shared by the guardConn
// that reads the peer (zmq4's reader goroutine) and the goroutine that receives the socket's
// messages (release). Safe for concurrent use.
type zmtpLimit struct {
	max   int64         // bytes in one message, and held unreleased
	stall time.Duration // silence allowed mid-message and during the handshake

	mu      sync.Mutex
	cond    sync.Cond
	held    int64 // data bytes let through and not released; REQUIRES mu
	waiting int   // reads waiting for a release (0 or 1); REQUIRES mu
	closed  bool  // the connection was closed: nothing waits any more; REQUIRES mu
}

func newLimit(max int64, stall time.Duration) *zmtpLimit {
	l := &zmtpLimit{max: max, stall: stall}
	l.cond.L = &l.mu
	return l
}

// release returns the n data bytes of a message the socket's reader has handled.
func (l *zmtpLimit) release(n int64) {
	l.mu.Lock()
	l.held = max(0, l.held-n)
	l.mu.Unlock()
	l.cond.Broadcast()
}

// releaseMsg releases msg's data bytes; commands were never counted.
func (l *zmtpLimit) releaseMsg(msg zmq4.Msg) {
	if msg.Type == zmq4.CmdMsg {
		return
	}
	var n int64
	for _, f := range msg.Frames {
		n += int64(len(f))
	}
	l.release(n)
}

// acquire waits until n more data bytes of a message of which cur are already held may be let
// through, and holds them. It waits only while other messages' bytes are held, so a message
// within the maximum always passes eventually. false once the connection is closed.
func (l *zmtpLimit) acquire(n, cur int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.closed && l.held+n > l.max && l.held > cur {
		l.waiting++
		l.cond.Wait()
		l.waiting--
	}
	if l.closed {
		return false
	}
	l.held += n
	return true
}

func (l *zmtpLimit) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cond.Broadcast()
}

func (l *zmtpLimit) wrap(c net.Conn) *guardConn {
	g := &guardConn{Conn: c, lim: l, buf: make([]byte, guardBufSize), pass: zmtpGreeting}
	if l.stall > 0 {
		// The handshake (greeting and the peer's first command) must complete in time: zmq4
		// reads it inside Dial with no deadline of its own.
		_ = c.SetReadDeadline(time.Now().Add(l.stall))
		g.deadline = true
	}
	return g
}

// guardPhase is how far a connection has come.
type guardPhase uint8

const (
	phaseGreeting  guardPhase = iota // the peer's 64-byte greeting is being read
	phaseHandshake                   // its first command (READY) is expected
	phaseRunning
)

// guardConn is a net.Conn whose Read hands out only bytes whose ZMTP frame headers passed the
// checks in the file comment. Read is called by one goroutine at a time (zmq4's handshake, then
// its reader); Close may be called by any.
type guardConn struct {
	net.Conn
	lim *zmtpLimit

	buf  []byte // read ahead from the peer: buf[r:w]
	r, w int

	pass     int64 // bytes from buf[r:] on (then the connection) that Read may hand out unchecked
	phase    guardPhase
	final    bool  // the frame being handed out is its message's last
	inMsg    bool  // a message has begun and not ended
	cur      int64 // data bytes of the current message, all held
	frames   int   // frames of the current message
	deadline bool  // a read deadline is set
	err      error // sticky: the connection is finished
}

func (g *guardConn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if g.pass == 0 {
		if err := g.next(); err != nil {
			g.err = err
			return 0, err
		}
	}
	n := int(min(int64(len(p)), g.pass))
	var k int
	switch {
	case g.r < g.w:
		k = copy(p[:n], g.buf[g.r:g.w])
		g.r += k
	case n >= guardBufSize/2:
		// A large body with nothing buffered goes straight into zmq4's slice, uncopied.
		var err error
		if k, err = g.readConn(p[:n]); k == 0 {
			g.err = err
			return 0, err
		}
	default:
		if err := g.fill(1); err != nil {
			g.err = err
			return 0, err
		}
		k = copy(p[:n], g.buf[g.r:g.w])
		g.r += k
	}
	g.pass -= int64(k)
	if g.pass == 0 {
		g.frameDone()
	}
	return k, nil
}

// frameDone moves on after the last byte of a frame (or of the greeting) was handed out.
func (g *guardConn) frameDone() {
	switch {
	case g.phase == phaseGreeting:
		g.phase = phaseHandshake
		return
	case !g.final:
		return
	}
	g.inMsg, g.cur, g.frames = false, 0, 0
	if g.phase == phaseHandshake {
		g.phase = phaseRunning
	}
	if g.deadline {
		// Between messages an engine may be silent as long as it likes.
		_ = g.Conn.SetReadDeadline(time.Time{})
		g.deadline = false
	}
}

// next reads and checks the next frame header, and lets it and its body through.
func (g *guardConn) next() error {
	if err := g.fill(2); err != nil {
		return err
	}
	flags := g.buf[g.r]
	hdr, size := int64(2), uint64(g.buf[g.r+1])
	if flags&zmtpLong != 0 {
		if err := g.fill(9); err != nil {
			return err
		}
		hdr, size = 9, binary.BigEndian.Uint64(g.buf[g.r+1:])
	}
	more := flags&zmtpMore != 0
	if flags&zmtpCommand != 0 {
		switch {
		case g.inMsg:
			return fmt.Errorf("%w: a command frame inside a message", errZMTP)
		case more:
			return fmt.Errorf("%w: a command frame flagged as followed by more", errZMTP)
		case size > zmtpMaxCommand:
			return fmt.Errorf("%w: a command frame of %d bytes, max %d", ErrZMQMessageTooLarge, size, zmtpMaxCommand)
		}
	} else {
		switch {
		case g.frames >= zmtpMaxFrames:
			return fmt.Errorf("%w: more than %d frames in one message", ErrZMQMessageTooLarge, zmtpMaxFrames)
		case size > uint64(g.lim.max-g.cur):
			return fmt.Errorf("%w: a frame of %d bytes after %d of its message, max %d per message",
				ErrZMQMessageTooLarge, size, g.cur, g.lim.max)
		}
		if !g.lim.acquire(int64(size), g.cur) {
			return net.ErrClosed
		}
		g.cur += int64(size)
		g.frames++
	}
	g.inMsg, g.final = more, !more
	g.pass = hdr + int64(size)
	return nil
}

// fill reads from the peer until at least n bytes are buffered (n ≤ len(buf)).
func (g *guardConn) fill(n int) error {
	if g.w-g.r >= n {
		return nil
	}
	if g.r > 0 {
		g.w = copy(g.buf, g.buf[g.r:g.w])
		g.r = 0
	}
	for g.w < n {
		k, err := g.readConn(g.buf[g.w:])
		g.w += k
		if err != nil && g.w < n {
			return err
		}
	}
	return nil
}

// readConn reads from the peer, with a deadline while the peer owes the rest of a message or
// of its handshake.
func (g *guardConn) readConn(p []byte) (int, error) {
	if g.lim.stall > 0 && (g.inMsg || g.pass > 0 || g.phase != phaseRunning) {
		_ = g.Conn.SetReadDeadline(time.Now().Add(g.lim.stall))
		g.deadline = true
	}
	k, err := g.Conn.Read(p)
	if ne, ok := err.(net.Error); ok && ne.Timeout() && g.deadline {
		what := "a message"
		if g.phase != phaseRunning {
			what = "the handshake"
		}
		err = fmt.Errorf("%w: nothing received for %v in the middle of %s", ErrZMQStalled, g.lim.stall, what)
	}
	return k, err
}

// Close closes the connection and wakes a Read waiting for the socket's reader to release.
func (g *guardConn) Close() error {
	g.lim.close()
	return g.Conn.Close()
}
