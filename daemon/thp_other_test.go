//go:build !linux

package daemon

// thpOff: no such flag here.
func thpOff() (off, known bool) { return false, false }
