package router

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/wire"
)

var evictSink byte

// evict writes a byte of every cache line of buf: what a loaded server's network stack and its
// other connections' buffers do to a core's caches between two of its routes.
func evict(buf []byte) {
	for i := 0; i < len(buf); i += 64 {
		buf[i]++
	}
	if len(buf) > 0 {
		evictSink += buf[0]
	}
}

// BenchmarkRouteCold is BenchmarkRoute's 1,000-worker route on one goroutine, timed alone: its
// route-ns/op is one route's time, not a throughput over GOMAXPROCS goroutines. With cache=cold
// 2 MiB are written between routes (more than a core's L2 on the machines it was written on), so
// that the route finds its data where it does under network load (docs/performance.md compares
// it with kvrload's whole-process profile). ns/op includes the eviction.
func BenchmarkRouteCold(b *testing.B) {
	for _, cache := range []string{"cold", "warm"} {
		b.Run("cache="+cache, func(b *testing.B) {
			r := fleet(b, 1000)
			r.SetPhaseObserver(&phaseSums{})
			var reqs [][]byte
			for i := range 64 {
				reqs = append(reqs, wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "r", Model: "m", Tokens: familyPrompt(i % 16)}))
			}
			var buf []byte
			if cache == "cold" {
				buf = make([]byte, 2<<20)
			}
			n := 0
			f := newInFlight(func() string { n++; return "c" + strconv.Itoa(n) })
			var spent time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				evict(buf)
				f.next(b, r, reqs, i)
				t0 := time.Now()
				f.route(b, r)
				spent += time.Since(t0)
			}
			b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N), "route-ns/op")
		})
	}
}
