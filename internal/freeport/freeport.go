// Package freeport hands out loopback addresses for a process to bind later: tests and bench
// tools that start a daemon on an address chosen in advance.
//
// An address taken from the kernel (listen on port 0, close) is in the ephemeral range, and the
// kernel may give the same port to the next socket that binds port 0 or connects out before the
// daemon binds it: a test that starts an engine or opens a connection in between then finds its
// daemon's port taken. Addr hands out ports below Linux's default ephemeral range (32768-60999),
// which the kernel never assigns on its own, walking them from a start drawn per process so
// that concurrent test processes take different ones, and never the same port twice in a
// process. Each port is checked free (TCP bound and released) when handed out.
//
// Addr and TB are safe for concurrent use.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

const (
	lo = 20000 // first port handed out
	hi = 32768 // Linux's default first ephemeral port, never handed out
)

var state struct {
	sync.Mutex
	next int // 0 until the first call
}

// Addr returns 127.0.0.1:port with a port that was free when checked, that this process has not
// handed out before, and that the kernel does not assign to sockets binding port 0.
func Addr() (string, error) {
	state.Lock()
	defer state.Unlock()
	if state.next == 0 {
		state.next = lo + rand.IntN(hi-lo)
	}
	for range hi - lo {
		p := state.next
		if state.next++; state.next == hi {
			state.next = lo
		}
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		return addr, nil
	}
	return "", fmt.Errorf("freeport: no free loopback port in %d-%d", lo, hi-1)
}

// TB is Addr for a test: it fails tb when no port is free.
func TB(tb testing.TB) string {
	tb.Helper()
	addr, err := Addr()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}
