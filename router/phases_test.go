package router

import (
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// phaseSums is a PhaseObserver that counts the requests it is told of and sums their phases,
// with a few atomic adds per request as a metrics histogram costs.
type phaseSums struct {
	n                            atomic.Int64
	hash, seq, match, sched, neg atomic.Int64
}

func (p *phaseSums) ObserveRoutePhases(ph RoutePhases) {
	p.n.Add(1)
	p.hash.Add(int64(ph.BlockHashing))
	p.seq.Add(int64(ph.SeqHashing))
	p.match.Add(int64(ph.FindMatches))
	p.sched.Add(int64(ph.Scheduling))
	if ph.BlockHashing < 0 || ph.SeqHashing < 0 || ph.FindMatches < 0 || ph.Scheduling < 0 {
		p.neg.Add(1)
	}
}

// TestRoutePhases: routed requests are timed, one in Config.PhaseSample, each told to the
// observer once with every phase measured; matches, refused routes and a router without an
// observer time nothing.
func TestRoutePhases(t *testing.T) {
	route := func(r *Router, id string) error {
		return r.Route(&wire.RouteRequest{RequestID: id, Model: "m", Tokens: familyPrompt(3)}, &wire.RouteResponse{})
	}
	t.Run("every", func(t *testing.T) {
		r := New(Config{Shards: 1, Logger: quiet(), PhaseSample: 1})
		t.Cleanup(r.Close)
		if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
		if err := route(r, "unobserved"); err != nil {
			t.Fatal(err)
		}
		obs := &phaseSums{}
		r.SetPhaseObserver(obs)
		for _, id := range []string{"a", "b", "c"} {
			if err := route(r, id); err != nil {
				t.Fatal(err)
			}
		}
		if err := route(r, "a"); err == nil {
			t.Fatal("a duplicate id was routed")
		}
		if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: familyPrompt(3)}, &wire.RouteResponse{}); err != nil {
			t.Fatal(err)
		}
		if n := obs.n.Load(); n != 3 {
			t.Fatalf("%d requests observed, want the 3 routed", n)
		}
		if obs.neg.Load() != 0 {
			t.Fatal("a phase took a negative time")
		}
		// 3 requests of 128 blocks: hashing them takes some time on any clock that moves.
		if obs.hash.Load() == 0 && obs.seq.Load() == 0 && obs.match.Load() == 0 && obs.sched.Load() == 0 {
			t.Fatal("no phase took any time")
		}
		r.SetPhaseObserver(nil)
		if err := route(r, "d"); err != nil {
			t.Fatal(err)
		}
		if n := obs.n.Load(); n != 3 {
			t.Fatalf("%d requests observed after the observer was removed, want 3", n)
		}
	})
	t.Run("sampled", func(t *testing.T) {
		r := New(Config{Shards: 1, Logger: quiet()})
		t.Cleanup(r.Close)
		if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
		obs := &phaseSums{}
		r.SetPhaseObserver(obs)
		// One in 16 drawn at random: 1,600 routes time 100 on average, with a standard deviation
		// of 9.7; the bounds are five of them away.
		for i := range 1600 {
			if err := route(r, strconv.Itoa(i)); err != nil {
				t.Fatal(err)
			}
			if err := r.Complete(strconv.Itoa(i)); err != nil {
				t.Fatal(err)
			}
		}
		if n := obs.n.Load(); n < 50 || n > 150 {
			t.Fatalf("%d of 1,600 routes timed, want about 100 (one in 16)", n)
		}
	})
	t.Run("disagg", func(t *testing.T) {
		r := New(Config{Shards: 1, Logger: quiet(), PhaseSample: 1})
		t.Cleanup(r.Close)
		for id, role := range map[uint64]Role{1: RolePrefill, 2: RoleDecode} {
			if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 16, Role: role}); err != nil {
				t.Fatal(err)
			}
		}
		obs := &phaseSums{}
		r.SetPhaseObserver(obs)
		if err := r.Route(&wire.RouteRequest{RequestID: "x", Model: "m", Tokens: familyPrompt(3), Disagg: true}, &wire.RouteResponse{}); err != nil {
			t.Fatal(err)
		}
		if n := obs.n.Load(); n != 1 {
			t.Fatalf("a disaggregated request observed %d times, want once", n)
		}
	})
}

// TestRoutePhasesAllocs: a route timed phase by phase allocates nothing.
func TestRoutePhasesAllocs(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet(), PhaseSample: 1})
	t.Cleanup(r.Close)
	for id := uint64(1); id <= 4; id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
	}
	obs := &phaseSums{}
	r.SetPhaseObserver(obs)
	req := wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: familyPrompt(3)}
	var resp wire.RouteResponse
	step := func() {
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete(req.RequestID); err != nil {
			t.Fatal(err)
		}
	}
	allocFree(t, "a timed route", step)
	if n := obs.n.Load(); n != 202 { // AllocsPerRun's warm-up run, and step's first
		t.Fatalf("%d requests observed, want 202", n)
	}
}
