package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestAddr: the ports handed out are distinct, outside the kernel's ephemeral range, and
// bindable.
func TestAddr(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		addr := TB(t)
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := strconv.Atoi(port); p < lo || p >= hi {
			t.Fatalf("port %d outside %d-%d", p, lo, hi-1)
		}
	}
	ln, err := net.Listen("tcp", TB(t))
	if err != nil {
		t.Fatalf("a handed-out port does not bind: %v", err)
	}
	ln.Close()
}
