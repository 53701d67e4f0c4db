//go:build (!amd64 && !arm64) || noprefetch

package prefetch

import "unsafe"

// Lines does nothing: no assembly for this architecture, or built with -tags noprefetch (to
// measure what prefetching gains).
func Lines(ps []unsafe.Pointer) {}
