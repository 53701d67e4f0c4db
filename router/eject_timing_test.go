package router

import (
	"fmt"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// BenchmarkRouteEjected is BenchmarkRoute in outlier ejection's degraded states (eject.go):
// with one worker out of routing and another suspect, the model's routes take the general path,
// which filters the ejected rank and makes the suspect one lose ties; with a suspect worker
// alone they keep the fast path, which reads the clock and the tied ranks' suspect flags.
// BenchmarkRoute is the common path's.
func BenchmarkRouteEjected(b *testing.B) {
	for _, n := range []int{8, 1000} {
		for _, state := range []string{"out", "suspect"} {
			b.Run(fmt.Sprintf("workers=%d/state=%s", n, state), func(b *testing.B) {
				r := fleet(b, n)
				r.SetPhaseObserver(&phaseSums{})
				if state == "out" {
					r.UpstreamFailed(1, 0, "connect")
				}
				r.UpstreamFailed(2, 0, "5xx")
				var reqs [][]byte
				for i := range 64 {
					reqs = append(reqs, wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "r", Model: "m", Tokens: familyPrompt(i % 16)}))
				}
				routeLoop(b, r, reqs, nil)
			})
		}
	}
}
