package router

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// tierFleet is a Router (block size 4) with worker 1 holding the first 2 blocks of prompt
// seq(0, 40) on its device, and worker 2 holding the first block on its device and the next 5
// in its host tier (offloaded under the device block).
func tierFleet(t *testing.T, credit *scoring.TierCredit) *Router {
	t.Helper()
	r := New(Config{Shards: 2, Logger: quiet(), TierCredit: credit})
	t.Cleanup(r.Close)
	apply := func(id uint64, evs ...kvevent.Event) {
		t.Helper()
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
		oc, err := r.ApplyEvents(&wire.EventBatch{Worker: id, Model: "m", Events: evs}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range oc {
			if o.Status != shard.OK {
				t.Fatalf("worker %d: %v", id, o)
			}
		}
	}
	apply(1, stored(1, 0, 4, seq(0, 8), 0, 11, 12))
	host := stored(2, 0, 4, seq(4, 20), 21, 22, 23, 24, 25, 26)
	host.Tier = kvevent.Host
	apply(2, stored(1, 0, 4, seq(0, 4), 0, 21), host)
	return r
}

// TestRouteTiers: a host-tier extension of a worker's device prefix is credited in the choice
// (worker 2: 1 device block and 5 host blocks, credited 1 + 0.75×5 = 4.75, beats worker 1's
// 2 device blocks), reported per candidate, not credited with weights {0, 0}, and booked as
// the device's prefix alone; the path allocates nothing with lower tiers present.
func TestRouteTiers(t *testing.T) {
	r := tierFleet(t, nil)
	req := wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(0, 40)}
	var resp wire.RouteResponse
	if err := r.Route(&req, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Worker != 2 || resp.Cached != 1 {
		t.Fatalf("routed to worker %d with %d cached blocks; want worker 2, whose host tier extends 1 device block by 5", resp.Worker, resp.Cached)
	}
	if len(resp.Tiers) != len(resp.Candidates) {
		t.Fatalf("%d tier entries for %d candidates", len(resp.Tiers), len(resp.Candidates))
	}
	for i, c := range resp.Candidates {
		want := wire.CandidateTiers{}
		if c.Worker == 2 {
			want.Host = 5
		}
		if resp.Tiers[i] != want || c.CachedBlocks != map[uint64]uint32{1: 2, 2: 1}[c.Worker] {
			t.Errorf("worker %d: cached %d, tiers %+v; want tiers %+v", c.Worker, c.CachedBlocks, resp.Tiers[i], want)
		}
		if c.Worker == 2 && c.PrefillTokens != 36 {
			t.Errorf("worker 2: prefill tokens %d, want 40 − 1×4 = 36 (the device's)", c.PrefillTokens)
		}
	}
	if err := r.Complete("a"); err != nil {
		t.Fatal(err)
	}
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	step := func() {
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete("a"); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Errorf("a tiered route allocates %v times", n)
	}
	match := func() {
		if err := r.Match(&req, &resp); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(200, match); n != 0 {
		t.Errorf("a tiered match allocates %v times", n)
	}
}

// TestRouteTiersUncredited: with weights {0, 0} the host tier is indexed and reported but not
// credited: worker 1's 2 device blocks win.
func TestRouteTiersUncredited(t *testing.T) {
	r := tierFleet(t, &scoring.TierCredit{})
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: seq(0, 40)}, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Worker != 1 || len(resp.Tiers) == 0 {
		t.Fatalf("routed to worker %d (tiers %v); want worker 1, the host tier reported but not credited", resp.Worker, resp.Tiers)
	}
	if ms := r.Models(); ms[0].HostResidencies != 5 || ms[0].Residencies != 3 {
		t.Fatalf("model residencies %+v", ms[0])
	}
}
