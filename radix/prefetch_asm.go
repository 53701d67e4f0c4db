//go:build amd64 || arm64

package radix

// prefetch asks the CPU to start loading the given buckets' cache lines. A prefetch retires at once and
// never faults, unlike a load, so a walk can have the next window's misses in flight while it
// works on the current one; Go has no portable way to say this.
//
//go:noescape
func prefetch(buckets []*bucket)
