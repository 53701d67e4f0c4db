package router

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestRouteBooksSharedOnce: under the default cost a request books its prompt less the blocks
// a request ahead of it on the worker has booked, which the engine computes once; under
// Dynamo's formulas it books its prompt less the device's cache alone, as Dynamo does.
func TestRouteBooksSharedOnce(t *testing.T) {
	prompt := seq(0, 18) // 4 full blocks of 4 tokens and 2 more
	for _, c := range []struct {
		name string
		cost scoring.CostModel
		want int64 // active prefill tokens after both requests
	}{
		{"ttft", scoring.CostTTFT, 18 + 2},
		{"v1", scoring.CostV1, 18 + 18},
		{"main", scoring.CostMain, 18 + 18},
	} {
		r := oneWorker(t, Config{Cost: c.cost})
		var resp wire.RouteResponse
		for _, id := range []string{"a", "b"} {
			if err := r.Route(&wire.RouteRequest{RequestID: id, Model: "m", Tokens: prompt}, &resp); err != nil {
				t.Fatal(err)
			}
		}
		if got := r.Workers()[0].ActivePrefill; got != c.want {
			t.Errorf("%s: active prefill %d, want %d", c.name, got, c.want)
		}
		if err := r.Complete("a"); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete("b"); err != nil {
			t.Fatal(err)
		}
		if got := r.Workers()[0].ActivePrefill; got != 0 {
			t.Errorf("%s: %d prefill tokens left after both completed", c.name, got)
		}
	}
}
