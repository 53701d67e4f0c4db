//go:build (amd64 || arm64) && !noprefetch

package prefetch

import "unsafe"

// Lines starts loading the cache lines that hold each of ps.
//
//go:noescape
func Lines(ps []unsafe.Pointer)
