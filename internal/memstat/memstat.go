// Package memstat measures the heap for memory benchmarks. Safe for concurrent use, but a
// measurement means something only while nothing else allocates.
package memstat

import "runtime"

// HeapInUse returns the bytes of live heap objects after two full collections (the second
// sweeps what finalizers and the first left).
func HeapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
