package ingest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/hostile"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// hostileSub subscribes to a hostile publisher whose first connection runs attack and whose
// later ones behave: they publish one valid batch (sequence 0) and hold the connection. It
// returns the subscriber, the sink and the lines the valid batch must produce.
func hostileSub(t *testing.T, attack func(c *hostile.Conn)) (*Subscriber, *recSink, *hostile.Publisher, []string) {
	t.Helper()
	b := engineBatch(-1, stored(0, 11, 12))
	payload := wire.AppendEngineBatch(nil, b, wire.EngineForm{})
	pub, err := hostile.NewPublisher(func(n int, c *hostile.Conn) {
		if n == 0 {
			attack(c)
			return
		}
		if c.Handshake("PUB", nil) != nil {
			return
		}
		// Wait for the subscription, which follows READY, so the batch is not published
		// before the subscriber listens.
		if _, err := c.ReadFrame(); err != nil {
			return
		}
		if c.Message([]byte("kv"), be8(0), payload) != nil {
			return
		}
		c.Hold(30 * time.Second)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	sink := &recSink{}
	src := EngineSource{Worker: 9, Model: "m", Endpoint: pub.Endpoint(), Ranks: 1}
	sub := startSub(t, src, sink, EngineConfig{MaxMessageBytes: 1 << 20, StallTimeout: 200 * time.Millisecond,
		RedialMax: 100 * time.Millisecond, DialTimeout: time.Second})
	return sub, sink, pub, lines(0, b)
}

// TestHostileZMQ: a publisher that lies about frame lengths, breaks ZMTP's rules, stalls or sends
// garbage costs its connection only. The subscriber counts why, dials again, and takes the next
// connection's batch; nothing is allocated for what the peer merely announces (a 2^62 claim
// used to panic the process, 2^36 to exhaust its memory, 2^30 to wedge the subscription).
func TestHostileZMQ(t *testing.T) {
	handshake := func(c *hostile.Conn) bool { return c.Handshake("PUB", nil) == nil }
	claim := func(size uint64) func(c *hostile.Conn) {
		return func(c *hostile.Conn) {
			if handshake(c) && c.Header(0x00, size, true) == nil {
				c.Hold(10 * time.Second)
			}
		}
	}
	cases := []struct {
		name    string
		attack  func(c *hostile.Conn)
		counter string
	}{
		{"claims 2^62 bytes", claim(1 << 62), "oversized"},
		{"claims 2^63+1 bytes", claim(1<<63 + 1), "oversized"},
		{"claims 2^36 bytes", claim(1 << 36), "oversized"},
		{"claims 2^30 bytes", claim(1 << 30), "oversized"},
		{"claims 2^62 bytes in the third frame", func(c *hostile.Conn) {
			if handshake(c) && c.Frame(0x01, []byte("kv")) == nil && c.Frame(0x01, be8(0)) == nil && c.Header(0, 1<<62, true) == nil {
				c.Hold(10 * time.Second)
			}
		}, "oversized"},
		{"frames adding up past the maximum", func(c *hostile.Conn) {
			big := make([]byte, 600<<10)
			if handshake(c) && c.Frame(0x01, big) == nil && c.Frame(0x00, big) == nil {
				c.Hold(10 * time.Second)
			}
		}, "oversized"},
		{"a message of 1,000 empty frames", func(c *hostile.Conn) {
			if handshake(c) {
				for range 1000 {
					if c.Frame(0x01, nil) != nil {
						return
					}
				}
				c.Hold(10 * time.Second)
			}
		}, "oversized"},
		{"a command of 2^40 bytes", func(c *hostile.Conn) {
			if handshake(c) && c.Header(0x04, 1<<40, true) == nil {
				c.Hold(10 * time.Second)
			}
		}, "oversized"},
		{"a READY of 2^40 bytes", func(c *hostile.Conn) {
			if _, err := c.Write(hostile.Greeting()); err == nil && c.Header(0x04, 1<<40, true) == nil {
				c.Hold(10 * time.Second)
			}
		}, "oversized"},
		{"stalls in the middle of a message", func(c *hostile.Conn) {
			if handshake(c) && c.Header(0x00, 100, false) == nil {
				_, _ = c.Write(make([]byte, 10))
				c.Hold(10 * time.Second)
			}
		}, "stalled"},
		{"stalls between the frames of a message", func(c *hostile.Conn) {
			if handshake(c) && c.Frame(0x01, []byte("kv")) == nil {
				c.Hold(10 * time.Second)
			}
		}, "stalled"},
		{"sends nothing after connecting", func(c *hostile.Conn) { c.Hold(10 * time.Second) }, "stalled"},
		{"stalls in its greeting", func(c *hostile.Conn) {
			_, _ = c.Write(hostile.Greeting()[:20])
			c.Hold(10 * time.Second)
		}, "stalled"},
		{"a command inside a message", func(c *hostile.Conn) {
			if handshake(c) && c.Frame(0x01, []byte("kv")) == nil && c.Frame(0x04, []byte("\x04PING")) == nil {
				c.Hold(10 * time.Second)
			}
		}, "protocol"},
		{"READY whose metadata ends inside a property", func(c *hostile.Conn) {
			// zmq4 slices the property's value length out of range and panics in Dial.
			ready := append([]byte{5}, "READY"...)
			ready = append(ready, 11)
			ready = append(ready, "Socket-Type"...)
			_ = c.Handshake("PUB", ready)
			c.Hold(10 * time.Second)
		}, "panics"},
		{"garbage after the handshake", func(c *hostile.Conn) {
			if handshake(c) {
				g := make([]byte, 4096)
				for i := range g {
					g[i] = byte(rand.Uint32())
				}
				g[0] = 0x02 // a long frame header: 8 random length bytes follow
				g[1] = 0x40
				_, _ = c.Write(g)
				c.Hold(10 * time.Second)
			}
		}, "oversized"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub, sink, pub, want := hostileSub(t, tc.attack)
			waitEvents(t, sink, want)
			if n := pub.Connections(); n < 2 {
				t.Fatalf("%d connections: the subscription did not dial again", n)
			}
			st := sub.Stats()
			got := map[string]int64{"oversized": st.Oversized, "stalled": st.Stalled, "protocol": st.ProtocolErrors, "panics": st.Panics}
			if got[tc.counter] < 1 {
				t.Fatalf("counters %v: want %s ≥ 1", got, tc.counter)
			}
			if r := st.Ranks[0].Counters; r.Oversized != st.Oversized || r.Stalled != st.Stalled || r.Panics != st.Panics {
				t.Fatalf("rank 0's counters %+v differ from the subscription's %+v", r, st)
			}
		})
	}
}

// TestHostileZMQPanicInSink: a panic while the events are handed on is recovered; the
// connection is dialled again and the worker cleared before its next batch, since the batch the
// panic cut short may be half applied.
func TestHostileZMQPanicInSink(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{})
	sink := &panicSink{panicOn: 2}
	sub := startSub(t, source(t, eng, 4, "m"), sink, EngineConfig{RedialMax: 50 * time.Millisecond})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))
	b1, b2, b3 := engineBatch(-1, stored(0, 1)), engineBatch(-1, stored(1, 2)), engineBatch(-1, stored(2, 3))
	r.Publish(b1, wire.EngineForm{})
	r.Publish(b2, wire.EngineForm{}) // panics in the sink
	eventually(t, "the panic", func() bool { return sub.Stats().Panics == 1 })
	// Batch 3, repeated until the new connection has it (the repeats are duplicates).
	payload := wire.AppendEngineBatch(nil, b3, wire.EngineForm{})
	seq := r.Record(payload)
	for before := sub.Stats().Batches; sub.Stats().Batches == before; time.Sleep(2 * time.Millisecond) {
		r.Send(nil, be8(seq), payload)
	}
	waitEvents(t, &sink.recSink, slices.Concat(lines(0, b1), []string{cleared(0)}, lines(0, b3)))
}

type panicSink struct {
	recSink
	calls   int
	panicOn int
}

func (s *panicSink) Ingest(worker uint64, model string, events []kvevent.Event) error {
	s.calls++
	if s.calls == s.panicOn && events[0].Kind != kvevent.Cleared {
		panic("sink failure")
	}
	return s.recSink.Ingest(worker, model, events)
}

// TestZMTPLimit: the guard lets a reader hold at most the maximum of received, unreleased data
// bytes, always lets one message of any allowed size through, and wakes a waiting read on
// release and on close.
func TestZMTPLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(peer)
			return
		}
		peer <- c
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	lim := newLimit(1000, 0)
	g := lim.wrap(raw)
	defer g.Close()
	p := <-peer
	defer p.Close()
	// The peer: greeting, READY, then four one-frame messages of 400 bytes and one of 1,000.
	var out bytes.Buffer
	out.Write(hostile.Greeting())
	ready := hostile.Ready("PUB")
	out.Write([]byte{0x04, byte(len(ready))})
	out.Write(ready)
	for _, n := range []int{400, 400, 400, 400, 1000} {
		out.Write(binary.BigEndian.AppendUint64([]byte{0x02}, uint64(n)))
		out.Write(bytes.Repeat([]byte{byte(n)}, n))
	}
	go func() { _, _ = p.Write(out.Bytes()) }()

	read := func(n int) {
		t.Helper()
		if _, err := io.ReadFull(g, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	frame := func(size int) { read(9); read(size) } // one message, as zmq4 reads it
	read(64)
	read(2 + len(ready))
	frame(400)
	frame(400)
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(g, make([]byte, 9+400))
		done <- err
	}()
	waiting := func() bool {
		lim.mu.Lock()
		defer lim.mu.Unlock()
		return lim.waiting == 1
	}
	eventually(t, "the third message to wait for a release", waiting)
	lim.release(400)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Held: 800. The fourth waits; releasing everything lets it, then the 1,000-byte one, through.
	go func() {
		_, err := io.ReadFull(g, make([]byte, 9+400))
		done <- err
	}()
	eventually(t, "the fourth message to wait", waiting)
	lim.release(800)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := io.ReadFull(g, make([]byte, 9+1000))
		done <- err
	}()
	eventually(t, "the last message to wait", waiting)
	g.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v, want net.ErrClosed", err)
	}
}

// FuzzZMTPGuard reads arbitrary bytes through the guard as zmq4 reads a connection (greeting,
// then frames: header, then a body allocated at the announced length) and checks that no frame
// the guard lets through announces more than the limit allows, alone or with its message's other
// frames, and that nothing panics.
func FuzzZMTPGuard(f *testing.F) {
	ready := hostile.Ready("PUB")
	base := append(hostile.Greeting(), append([]byte{0x04, byte(len(ready))}, ready...)...)
	f.Add(append(slices.Clone(base), 0x01, 2, 'k', 'v', 0x01, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0x00, 1, 0x90))
	f.Add(append(slices.Clone(base), 0x02, 0x40, 0, 0, 0, 0, 0, 0, 0))
	f.Add(append(slices.Clone(base), 0x03, 0, 0, 0, 0, 0, 0, 0x10, 0))
	f.Add(append(slices.Clone(base), 0x06, 0, 0, 0, 1, 0, 0, 0, 0))
	f.Add(append(slices.Clone(base), 0x01, 0, 0x05, 1, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		const max = 4096
		lim := newLimit(max, 0)
		g := lim.wrap(fakeConn{bytes.NewReader(data)})
		if _, err := io.ReadFull(g, make([]byte, zmtpGreeting)); err != nil {
			return
		}
		var msg int64
		for {
			var h [9]byte
			if _, err := io.ReadFull(g, h[:2]); err != nil {
				return
			}
			size := uint64(h[1])
			if h[0]&zmtpLong != 0 {
				if _, err := io.ReadFull(g, h[2:9]); err != nil {
					return
				}
				size = binary.BigEndian.Uint64(h[1:9])
			}
			cmd := h[0]&zmtpCommand != 0
			switch {
			case cmd && size > zmtpMaxCommand:
				t.Fatalf("a command of %d bytes let through", size)
			case !cmd && uint64(msg)+size > max:
				t.Fatalf("a frame of %d bytes after %d of its message let through, max %d", size, msg, max)
			}
			if _, err := io.ReadFull(g, make([]byte, size)); err != nil {
				return
			}
			if !cmd {
				msg += int64(size)
			}
			if h[0]&zmtpMore == 0 {
				lim.release(msg)
				msg = 0
			}
		}
	})
}

// fakeConn is a net.Conn reading from r; writes and deadlines do nothing.
type fakeConn struct{ r io.Reader }

func (c fakeConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (fakeConn) Write(p []byte) (int, error)      { return len(p), nil }
func (fakeConn) Close() error                     { return nil }
func (fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (fakeConn) SetDeadline(time.Time) error      { return nil }
func (fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (fakeConn) SetWriteDeadline(time.Time) error { return nil }
