package router

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// BenchmarkRoute measures the request path without the network: decode a binary request of a
// 128-block (2048-token) prompt, hash, match, score every worker, book, encode the answer
// (AppendRoute, as the server does), complete. Each goroutine keeps inFlight requests booked,
// completing the oldest before it routes the next, so that the active-load terms are those of a
// loaded router (kvrload keeps 32 in flight; with GOMAXPROCS=2 so does this).
func BenchmarkRoute(b *testing.B) {
	for _, bc := range []struct{ workers, max int }{{8, 0}, {1000, 0}, {1000, 8}} {
		name := fmt.Sprintf("workers=%d", bc.workers)
		if bc.max > 0 {
			name += fmt.Sprintf("/candidates=%d", bc.max)
		}
		b.Run(name, func(b *testing.B) {
			r := fleet(b, bc.workers)
			var reqs [][]byte
			for i := range 64 {
				reqs = append(reqs, wire.AppendRouteRequest(nil, &wire.RouteRequest{
					RequestID: "r", Model: "m", Tokens: familyPrompt(i % 16), MaxCandidates: uint16(bc.max),
				}))
			}
			routeLoop(b, r, reqs, nil)
		})
	}
}

// BenchmarkRouteDisagg is BenchmarkRoute's 8-worker fleet, with workers 1 to 4 prefill workers
// and 5 to 8 decode workers, every request asking for a disaggregated decision: two picks and
// two bookings per request, the prefill stage completed by its prefill done.
func BenchmarkRouteDisagg(b *testing.B) {
	r := fleet(b, 8)
	for id := uint64(1); id <= 4; id++ {
		if err := r.Register(Registration{ID: id, Model: "m", Role: RolePrefill}); err != nil {
			b.Fatal(err)
		}
	}
	var reqs [][]byte
	for i := range 64 {
		reqs = append(reqs, wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "r", Model: "m", Tokens: familyPrompt(i % 16), Disagg: true}))
	}
	routeLoop(b, r, reqs, r.PrefillDone)
}

// routeLoop routes the encoded requests reqs in turn from every benchmark goroutine, each
// keeping inFlight of them booked (completing the oldest before it routes the next), and calls
// after, if set, on each request once routed.
func routeLoop(b *testing.B, r *Router, reqs [][]byte, after func(id string) error) {
	const inFlight = 16
	var g atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// Ids must be unique among requests in flight: inFlight per goroutine, each
		// completed before it is used again.
		var ids [inFlight]string
		for k := range ids {
			ids[k] = "g" + strconv.FormatInt(g.Add(1), 10)
		}
		var req wire.RouteRequest
		var resp wire.RouteResponse
		var out []byte
		i := 0
		for pb.Next() {
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
			var err error
			if out, err = r.AppendRoute(out[:0], &req, &resp); err != nil {
				b.Fatal(err)
			}
			if after != nil {
				if err := after(id); err != nil {
					b.Fatal(err)
				}
			}
			i++
		}
	})
}
