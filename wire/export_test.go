package wire

import "testing"

// ForcePortable makes the package take its portable byte-by-byte paths until the test ends, so
// that they stay covered on little-endian machines. Tests that call it must not run in parallel.
func ForcePortable(tb testing.TB) {
	old := nativeLE
	nativeLE = false
	tb.Cleanup(func() { nativeLE = old })
}

// NativeLE reports whether the fast paths are in use.
func NativeLE() bool { return nativeLE }

// The two ways of filling a []uint32 from wire bytes, for benchmarks and tests.
var (
	CopyU32sNative   = copyU32sNative
	CopyU32sPortable = copyU32sPortable
	CopyU64sNative   = copyU64sNative
	CopyU64sPortable = copyU64sPortable
)

const CandidateNative = candidateNative
