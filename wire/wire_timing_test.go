package wire_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

func BenchmarkRouteRequestDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, c := range []struct {
		name string
		req  *wire.RouteRequest
	}{
		{"tokens=2048", randRequest(r, 2048, 0)},
		{"hashes=128", randRequest(r, 0, 128)},
	} {
		b.Run(c.name, func(b *testing.B) {
			msg := wire.AppendRouteRequest(nil, c.req)
			var req wire.RouteRequest
			_ = wire.DecodeRouteRequest(msg, &req) // grow req's slices
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if err := wire.DecodeRouteRequest(msg, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRouteRequestEncode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, c := range []struct {
		name string
		req  *wire.RouteRequest
	}{
		{"tokens=2048", randRequest(r, 2048, 0)},
		{"hashes=128", randRequest(r, 0, 128)},
	} {
		b.Run(c.name, func(b *testing.B) {
			buf := wire.AppendRouteRequest(nil, c.req)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf = wire.AppendRouteRequest(buf[:0], c.req)
			}
		})
	}
}

func BenchmarkRouteResponseEncode(b *testing.B) {
	for _, n := range []int{8, 1000} {
		b.Run(fmt.Sprintf("candidates=%d", n), func(b *testing.B) {
			resp := randResponse(rand.New(rand.NewPCG(2, uint64(n))), n)
			buf := wire.AppendRouteResponse(nil, resp)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf = wire.AppendRouteResponse(buf[:0], resp)
			}
		})
	}
}

func BenchmarkRouteResponseDecode(b *testing.B) {
	for _, n := range []int{8, 1000} {
		b.Run(fmt.Sprintf("candidates=%d", n), func(b *testing.B) {
			msg := wire.AppendRouteResponse(nil, randResponse(rand.New(rand.NewPCG(2, uint64(n))), n))
			var resp wire.RouteResponse
			_ = wire.DecodeRouteResponse(msg, &resp) // grow resp's slices
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if err := wire.DecodeRouteResponse(msg, &resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Event batches as an engine publishes them: mostly stored events of a few 16-token blocks,
// some removals, the odd clear. ns/event is the per-event overhead that matters for ingestion.
func BenchmarkEventBatchDecode(b *testing.B) {
	for _, n := range []int{1, 64, 1024} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			msg := wire.AppendEventBatch(nil, randBatch(rand.New(rand.NewPCG(3, uint64(n))), n, 8, 16))
			var out wire.EventBatch
			_ = wire.DecodeEventBatch(msg, &out) // grow out's memory
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if err := wire.DecodeEventBatch(msg, &out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}

func BenchmarkEventBatchEncode(b *testing.B) {
	for _, n := range []int{1, 64, 1024} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			batch := randBatch(rand.New(rand.NewPCG(3, uint64(n))), n, 8, 16)
			buf := wire.AppendEventBatch(nil, batch)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf = wire.AppendEventBatch(buf[:0], batch)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}

// BenchmarkArrayCopy compares the two ways of filling token and hash arrays from wire bytes:
// one memmove (little-endian machines) and the portable per-element loop (the others). The
// decoders use the memmove where they can.
func BenchmarkArrayCopy(b *testing.B) {
	src := make([]byte, 8*2048)
	for i := range 2048 {
		binary.LittleEndian.PutUint64(src[8*i:], uint64(i)*0x9e3779b97f4a7c15)
	}
	u32 := make([]uint32, 2048)
	u64 := make([]uint64, 128)
	for _, c := range []struct {
		name string
		fn   func()
		size int
	}{
		{"tokens=2048/memmove", func() { wire.CopyU32sNative(u32, src) }, 4 * len(u32)},
		{"tokens=2048/loop", func() { wire.CopyU32sPortable(u32, src) }, 4 * len(u32)},
		{"hashes=128/memmove", func() { wire.CopyU64sNative(u64, src) }, 8 * len(u64)},
		{"hashes=128/loop", func() { wire.CopyU64sPortable(u64, src) }, 8 * len(u64)},
	} {
		b.Run(c.name, func(b *testing.B) {
			if !wire.NativeLE() && c.name[len(c.name)-7:] == "memmove" {
				b.Skip("big-endian machine: the memmove would byte-swap nothing")
			}
			b.SetBytes(int64(c.size))
			for b.Loop() {
				c.fn()
			}
		})
	}
}
