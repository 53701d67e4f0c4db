package router

import (
	"math/rand/v2"
	"time"
)

// RoutePhases are the durations of one routed request's phases, split where Dynamo's router
// splits its overhead metrics (dynamo_router_overhead_*_ms), so that a dashboard made for it
// reads kvrouterd's the same way.
type RoutePhases struct {
	// BlockHashing: the prompt's full blocks hashed into local block hashes (a request by
	// hash brings them: copying them is all this phase does).
	BlockHashing time.Duration
	// SeqHashing: the local block hashes chained into sequence hashes.
	SeqHashing time.Duration
	// FindMatches: the sequence hashes matched against the model's index (and, with
	// predict-on-route, its side index).
	FindMatches time.Duration
	// Scheduling: the workers scored, one chosen and the request booked on it; both stages of
	// a disaggregated request. Time spent waiting in the router queue is not in it.
	Scheduling time.Duration
}

// PhaseObserver receives the phases of sampled routed requests (Config.PhaseSample). It is
// called on the route path, from many goroutines at once: it must be safe for concurrent use,
// quick, and allocate nothing.
type PhaseObserver interface {
	ObserveRoutePhases(RoutePhases)
}

// SetPhaseObserver makes o the receiver of sampled requests' phases (nil: none, and no request
// is timed). It replaces the one set before.
func (r *Router) SetPhaseObserver(o PhaseObserver) {
	if o == nil {
		r.phaseObs.Store(nil)
		return
	}
	r.phaseObs.Store(&o)
}

// PhaseSample is Config.PhaseSample: about one routed request in PhaseSample is timed.
func (r *Router) PhaseSample() int { return int(r.phaseMask) + 1 }

// phaseEpoch is the origin of monoNow's clock.
var phaseEpoch = time.Now()

// monoNow reads the monotonic clock, in nanoseconds since phaseEpoch.
func monoNow() int64 { return int64(time.Since(phaseEpoch)) }

// phaseClock is one timed request's phase boundaries on monoNow's clock: the hashing started,
// the local hashes done, the sequence hashes done, the match done.
type phaseClock [4]int64

// timePhases reports whether route times the phases of the request it is about to route with
// s: at random, one in Config.PhaseSample on average, while an observer is set. The runtime's
// generator is per P, so the draw writes nothing another core reads; a counter per scratch
// would not do, since the free list drops spare scratches at garbage collections.
func (r *Router) timePhases(s *scratch) *phaseClock {
	if rand.Uint32()&r.phaseMask != 0 || r.phaseObs.Load() == nil {
		return nil
	}
	return &s.clock
}

// observePhases hands the phases of the request timed in clk, whose scheduling ends now, to the
// observer.
func (r *Router) observePhases(clk *phaseClock) {
	end := monoNow()
	o := r.phaseObs.Load()
	if o == nil {
		return
	}
	(*o).ObserveRoutePhases(RoutePhases{
		BlockHashing: time.Duration(clk[1] - clk[0]),
		SeqHashing:   time.Duration(clk[2] - clk[1]),
		FindMatches:  time.Duration(clk[3] - clk[2]),
		Scheduling:   time.Duration(end - clk[3]),
	})
}
