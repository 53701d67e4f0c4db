//go:build !amd64 && !arm64

package prefetch

import "unsafe"

// Lines does nothing on this architecture.
func Lines(ps []unsafe.Pointer) {}
