// Package hostile holds peers that misbehave on purpose, for the tests of kvrouterd's
// defences: a ZMTP publisher that lies about frame lengths, sends garbage and stalls. Only tests
// import it; nothing in it is safe to point at anything but loopback.
package hostile

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Publisher is a TCP listener on loopback that greets each connection as a ZMTP 3 PUB socket
// would and then runs a script on it. Safe for concurrent use.
type Publisher struct {
	ln     net.Listener
	script func(n int, c *Conn)
	conns  atomic.Int64
	wg     sync.WaitGroup

	mu   sync.Mutex
	open map[net.Conn]struct{}
}

// NewPublisher listens on 127.0.0.1 and runs script on every connection accepted, n counting
// them from 0. The connection is closed when script returns.
func NewPublisher(script func(n int, c *Conn)) (*Publisher, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Publisher{ln: ln, script: script, open: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *Publisher) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		n := int(p.conns.Add(1) - 1)
		p.mu.Lock()
		p.open[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() {
				p.mu.Lock()
				delete(p.open, c)
				p.mu.Unlock()
				c.Close()
			}()
			p.script(n, &Conn{Conn: c})
		}()
	}
}

// Endpoint is the tcp:// endpoint to subscribe to.
func (p *Publisher) Endpoint() string { return "tcp://" + p.ln.Addr().String() }

// Connections counts the connections accepted so far.
func (p *Publisher) Connections() int64 { return p.conns.Load() }

// Close stops listening, closes every connection and waits for the scripts to return.
func (p *Publisher) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.open {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Conn is one accepted connection, for its script's goroutine.
type Conn struct{ net.Conn }

// Greeting returns a ZMTP 3.0 greeting with the NULL mechanism.
func Greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
	copy(g[12:32], "NULL")
	return g
}

// Ready returns the body of a READY command naming socketType.
func Ready(socketType string) []byte {
	b := append([]byte{5}, "READY"...)
	b = append(b, byte(len("Socket-Type")))
	b = append(b, "Socket-Type"...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(socketType)))
	return append(b, socketType...)
}

// Handshake exchanges greetings, sends READY as socketType with the given body (Ready's when
// nil), and reads the peer's greeting and READY.
func (c *Conn) Handshake(socketType string, ready []byte) error {
	if _, err := c.Write(Greeting()); err != nil {
		return err
	}
	var g [64]byte
	if _, err := io.ReadFull(c, g[:]); err != nil {
		return err
	}
	if g[0] != 0xFF || g[9] != 0x7F {
		return errors.New("hostile: peer greeting has no ZMTP signature")
	}
	if ready == nil {
		ready = Ready(socketType)
	}
	if err := c.Frame(0x04, ready); err != nil {
		return err
	}
	_, err := c.ReadFrame()
	return err
}

// Header writes a frame header with the given flags (0x01 more, 0x04 command) announcing size
// body bytes, in the long form when size does not fit a byte or long is set; no body follows.
func (c *Conn) Header(flags byte, size uint64, long bool) error {
	var h []byte
	if size > 255 || long {
		h = binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
	} else {
		h = []byte{flags, byte(size)}
	}
	_, err := c.Write(h)
	return err
}

// Frame writes one frame: header and body.
func (c *Conn) Frame(flags byte, body []byte) error {
	if err := c.Header(flags, uint64(len(body)), false); err != nil {
		return err
	}
	_, err := c.Write(body)
	return err
}

// Message writes a message of the given frames.
func (c *Conn) Message(frames ...[]byte) error {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = 0x01
		}
		if err := c.Frame(flags, f); err != nil {
			return err
		}
	}
	return nil
}

// ReadFrame reads one frame from the peer and returns its body.
func (c *Conn) ReadFrame() ([]byte, error) {
	var h [9]byte
	if _, err := io.ReadFull(c, h[:2]); err != nil {
		return nil, err
	}
	size := uint64(h[1])
	if h[0]&0x02 != 0 {
		if _, err := io.ReadFull(c, h[2:9]); err != nil {
			return nil, err
		}
		size = binary.BigEndian.Uint64(h[1:9])
	}
	if size > 1<<20 {
		return nil, errors.New("hostile: peer frame over 1 MiB")
	}
	b := make([]byte, size)
	_, err := io.ReadFull(c, b)
	return b, err
}

// Hold keeps the connection open, reading and dropping whatever the peer sends, until the peer
// closes it or d passes.
func (c *Conn) Hold(d time.Duration) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, _ = io.Copy(io.Discard, c)
}
