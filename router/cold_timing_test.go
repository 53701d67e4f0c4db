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
// 2 MiB are written between routes (more than this machine's L2 per core), so that the route
// finds its data where it does under network load; kvrload's whole-process profile put the
// route at 11.5 µs a request there, against the 5.4 µs a core pair of BenchmarkRoute reports.
// ns/op includes the eviction.
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
			const inFlight = 16
			var ids [inFlight]string
			for k := range ids {
				ids[k] = "c" + strconv.Itoa(k)
			}
			var req wire.RouteRequest
			var resp wire.RouteResponse
			var out []byte
			var spent time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				evict(buf)
				if err := wire.DecodeRouteRequest(reqs[i%len(reqs)], &req); err != nil {
					b.Fatal(err)
				}
				id := ids[i%inFlight]
				if i >= inFlight {
					if err := r.Complete(id); err != nil {
						b.Fatal(err)
					}
				}
				req.RequestID = id
				t0 := time.Now()
				var err error
				if out, err = r.AppendRoute(out[:0], &req, &resp); err != nil {
					b.Fatal(err)
				}
				spent += time.Since(t0)
			}
			b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N), "route-ns/op")
		})
	}
}
