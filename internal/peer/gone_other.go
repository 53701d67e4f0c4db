//go:build !unix

package peer

import "net"

// Gone reports false: this platform has no way to look at a socket without reading it.
func Gone(c net.Conn) bool { return false }
