package router

import (
	"math"
	"testing"

	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// oneWorker is a Router with worker 1 of model m, blocks of 4 tokens.
func oneWorker(t *testing.T, cfg Config) *Router {
	t.Helper()
	cfg.BlockSize, cfg.Shards, cfg.Logger = 4, 1, quiet()
	r := New(cfg)
	t.Cleanup(r.Close)
	if err := r.Register(Registration{ID: 1, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	return r
}

func activeBlocks(r *Router) int64 { return r.Workers()[0].ActiveBlocks }

// TestRouteAssumeReuse: with reuse assumed, two concurrent requests with one prompt share its
// blocks; without (the router's setting or the request's), each books its own, as Dynamo books
// random hashes.
func TestRouteAssumeReuse(t *testing.T) {
	prompt := seq(0, 16) // 4 blocks
	f := func(noReuse bool, opt wire.Opt, want int64) {
		t.Helper()
		r := oneWorker(t, Config{NoAssumeReuse: noReuse})
		var resp wire.RouteResponse
		for _, id := range []string{"a", "b"} {
			if err := r.Route(&wire.RouteRequest{RequestID: id, Model: "m", Tokens: prompt, AssumeReuse: opt}, &resp); err != nil {
				t.Fatal(err)
			}
		}
		if got := activeBlocks(r); got != want {
			t.Errorf("router no-reuse %v, request %v: %d active blocks, want %d", noReuse, opt, got, want)
		}
		// The second request's decode blocks: shared ones not counted again, or all of them.
		if c := resp.Candidates[0]; int64(c.ActiveBlocks) != want {
			t.Errorf("router no-reuse %v, request %v: answer's active blocks %d, want %d", noReuse, opt, c.ActiveBlocks, want)
		}
		for _, id := range []string{"a", "b"} {
			if err := r.Complete(id); err != nil {
				t.Fatal(err)
			}
		}
		if got := activeBlocks(r); got != 0 {
			t.Errorf("%d active blocks left", got)
		}
	}
	f(false, wire.Unset, 4)
	f(true, wire.Unset, 8)
	f(false, wire.False, 8)
	f(true, wire.True, 4)
}

// TestRouteTrackPrefillOverride: the request's track_prefill_tokens wins over the router's.
func TestRouteTrackPrefillOverride(t *testing.T) {
	f := func(noTrack bool, opt wire.Opt, want int64) {
		t.Helper()
		r := oneWorker(t, Config{NoTrackPrefill: noTrack})
		if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(0, 10), TrackPrefill: opt}, &wire.RouteResponse{}); err != nil {
			t.Fatal(err)
		}
		if got := r.Workers()[0].ActivePrefill; got != want {
			t.Errorf("router untracked %v, request %v: %d prefill tokens booked, want %d", noTrack, opt, got, want)
		}
	}
	f(false, wire.Unset, 10)
	f(false, wire.False, 0)
	f(true, wire.Unset, 0)
	f(true, wire.True, 10)
}

// TestRouteOutputTokens: with output tracking, the output a gateway reports grows the booking
// block by block, decayed toward the request's expected length; without, it books nothing.
func TestRouteOutputTokens(t *testing.T) {
	for _, track := range []bool{false, true} {
		r := oneWorker(t, Config{TrackOutputBlocks: track})
		// 10 tokens: 2 full blocks booked, ⌈10/4⌉ = 3 counted; 20 output tokens expected.
		if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(0, 10), ExpectedOSL: 20}, &wire.RouteResponse{}); err != nil {
			t.Fatal(err)
		}
		want := func(n int64, blocks int64) {
			t.Helper()
			if err := r.OutputTokens("a", n); err != nil {
				t.Fatal(err)
			}
			if !track {
				blocks = 2
			}
			if got := activeBlocks(r); got != blocks {
				t.Errorf("tracking %v, %d generated: %d active blocks, want %d", track, n, got, blocks)
			}
		}
		want(2, 2)  // ⌈12/4⌉ = 3: no new block
		want(3, 3)  // ⌈13/4⌉ = 4: one, weight 1 − 3/20 = 0.85 on it and the prompt's 2: 3 − 0.45 → 3
		want(10, 2) // ⌈20/4⌉ = 5: a second output block; weight 0.5 on the 4 blocks: 4 − 2 = 2
		if err := r.OutputTokens("zz", 1); err == nil {
			t.Error("an unknown request's output taken")
		}
		if err := r.Complete("a"); err != nil {
			t.Fatal(err)
		}
		if got := activeBlocks(r); got != 0 {
			t.Errorf("%d active blocks left", got)
		}
	}
}

// TestRouteCostMainOverrides: under Dynamo main's cost, the request's credit and prefill load
// scale override the router's, and a request's overlap_score_weight is read as Dynamo main
// reads it: the prefill load scale, and 0 also zeroes the credit.
func TestRouteCostMainOverrides(t *testing.T) {
	r := oneWorker(t, Config{Cost: scoring.CostMain})
	prompt := seq(0, 16)
	logit := func(req wire.RouteRequest) float64 {
		t.Helper()
		req.Model, req.Tokens = "m", prompt
		var resp wire.RouteResponse
		if err := r.Match(&req, &resp); err != nil {
			t.Fatal(err)
		}
		return resp.Candidates[0].Logit
	}
	// Nothing cached, nothing active: raw = 16/4 = 4 blocks, decode 4.
	f := func(name string, req wire.RouteRequest, want float64) {
		t.Helper()
		if got := logit(req); math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: logit %v, want %v", name, got, want)
		}
	}
	f("defaults", wire.RouteRequest{}, 8)
	f("scale 2", wire.RouteRequest{HasLoadScale: true, PrefillLoadScale: 2}, 12)
	f("weight 0.5 is the scale", wire.RouteRequest{HasWeight: true, Weight: 0.5, HasLoadScale: true, PrefillLoadScale: 2}, 6)
	f("weight 0", wire.RouteRequest{HasWeight: true, Weight: 0}, 4)
	// Nothing is cached, so a credit above 1 (Dynamo's agentic preset gives 2) changes nothing.
	f("credit 2", wire.RouteRequest{HasCredit: true, OverlapCredit: 2}, 8)
	for _, bad := range []float64{-0.5, math.Inf(1), math.NaN()} {
		if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: prompt, HasCredit: true, OverlapCredit: bad}, &wire.RouteResponse{}); err == nil {
			t.Errorf("credit %v taken", bad)
		}
	}
}

// TestRouteAllocsLoadModel: the route path with every switch of the load model on (Dynamo
// main's cost with its decay and request weight, no reuse, output tracking, a request's
// overrides) and the output reports allocate nothing once warm.
func TestRouteAllocsLoadModel(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet(), Cost: scoring.CostMain, NoAssumeReuse: true, TrackOutputBlocks: true,
		Terms: &scoring.Terms{Credit: 0.8, CreditDecay: 1, LoadScale: 1.5, RequestWeight: 0.5}})
	t.Cleanup(r.Close)
	for id := uint64(1); id <= 4; id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
	}
	// One request stays in flight, so that a worker is busy.
	if err := r.Route(&wire.RouteRequest{RequestID: "other", Model: "m", Tokens: familyPrompt(1)}, &wire.RouteResponse{}); err != nil {
		t.Fatal(err)
	}
	req := wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: familyPrompt(1), ExpectedOSL: 64,
		TrackPrefill: wire.True, HasCredit: true, OverlapCredit: 0.5}
	var resp wire.RouteResponse
	step := func() {
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		for n := int64(1); n < 40; n += 7 {
			if err := r.OutputTokens(req.RequestID, n); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Complete(req.RequestID); err != nil {
			t.Fatal(err)
		}
	}
	allocFree(t, "route with the load model", step)
	req.MaxCandidates = 2
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("capped route with the load model allocates %v times per request", n)
	}
}

// TestRouteTTFTOverrides: under the default cost (CostTTFT) a request that sets one of
// Dynamo's weights is scored by that weight's formula, as Dynamo scores it: v1 for
// overlap_score_weight, main for overlap_score_credit or prefill_load_scale; the others are
// scored in time, with a prediction.
func TestRouteTTFTOverrides(t *testing.T) {
	r := oneWorker(t, Config{Cost: scoring.CostTTFT})
	prompt := seq(0, 16) // 4 blocks, nothing cached, nothing active
	f := func(name string, req wire.RouteRequest, want float64, predicted bool) {
		t.Helper()
		req.Model, req.Tokens = "m", prompt
		var resp wire.RouteResponse
		if err := r.Match(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if got := resp.Candidates[0].Logit; want > 0 && math.Abs(got-want) > 1e-12 || want == 0 && !(got > 16) {
			t.Errorf("%s: logit %v, want %v", name, got, want)
		}
		req.RequestID = name
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if (resp.PredictedTTFT > 0) != predicted {
			t.Errorf("%s: predicted TTFT %v", name, resp.PredictedTTFT)
		}
		if err := r.Complete(name); err != nil {
			t.Fatal(err)
		}
	}
	f("default", wire.RouteRequest{}, 0, true) // ms: more than the step's fixed 16.5
	f("weight 2 is v1's", wire.RouteRequest{HasWeight: true, Weight: 2}, 2*4+4, false)
	f("scale 2 is main's", wire.RouteRequest{HasLoadScale: true, PrefillLoadScale: 2}, 2*4+4, false)
	f("credit 1 is main's", wire.RouteRequest{HasCredit: true, OverlapCredit: 1}, 4+4, false)
}
