package router

import (
	"fmt"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// BenchmarkRouteEjected is BenchmarkRoute while one worker of the fleet is out of routing
// (outlier ejection, eject.go) and another suspect: the model's routes take the general path,
// which filters the ejected rank and makes the suspect one lose ties. It is the price of the
// degraded mode, which lasts while some rank of the model has failed since its last answer;
// BenchmarkRoute is the common path's.
func BenchmarkRouteEjected(b *testing.B) {
	for _, n := range []int{8, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			r := fleet(b, n)
			r.SetPhaseObserver(&phaseSums{})
			r.UpstreamFailed(1, 0, "connect")
			r.UpstreamFailed(2, 0, "5xx")
			var reqs [][]byte
			for i := range 64 {
				reqs = append(reqs, wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "r", Model: "m", Tokens: familyPrompt(i % 16)}))
			}
			routeLoop(b, r, reqs, nil)
		})
	}
}
