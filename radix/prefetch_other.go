//go:build !amd64 && !arm64

package radix

// prefetch is a no-op where no assembly is provided: the walk is correct, only slower on a cold
// index.
func prefetch(buckets []*bucket) {}
