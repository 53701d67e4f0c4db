//go:build unix

package peer

import (
	"errors"
	"net"
	"syscall"
)

// Gone reports whether the peer of c has closed or reset the connection: a peek at c's socket,
// which consumes nothing and does not block, finds the end of the stream or an error. Data
// waiting to be read (a pipelined request) means the peer is there. A connection that is not
// a socket, or one Gone cannot look at (TLS, say), is never reported gone. A peer that has only
// shut down its writing side is reported gone too: HTTP clients do not, while awaiting an answer.
func Gone(c net.Conn) bool {
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true // closed already
	}
	gone := false
	var buf [1]byte
	// Control, not Read: Read first checks the connection's read deadline, and a server's read
	// timeout set for the request long past (fasthttp's ReadTimeout stays on the connection while
	// the handler runs) would make every client look gone once it passed.
	err = raw.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n > 0:
		case err == nil: // n == 0: the end of the stream
			gone = true
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK), errors.Is(err, syscall.EINTR):
		default: // reset, or another error the next read would meet
			gone = true
		}
	})
	return gone || err != nil // err: the connection is closed
}
