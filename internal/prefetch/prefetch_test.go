package prefetch

import (
	"testing"
	"unsafe"
)

// Prefetching real, nil and dangling-looking addresses must neither fault nor change memory.
func TestLines(t *testing.T) {
	buf := make([]uint64, 1024)
	for i := range buf {
		buf[i] = uint64(i)
	}
	ps := []unsafe.Pointer{unsafe.Pointer(&buf[0]), unsafe.Pointer(&buf[512]), nil}
	Lines(ps)
	Lines(nil)
	for i, v := range buf {
		if v != uint64(i) {
			t.Fatalf("buf[%d] changed to %d", i, v)
		}
	}
	if n := testing.AllocsPerRun(100, func() { Lines(ps) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}
