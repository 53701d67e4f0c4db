package router

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/puzpuzpuz/xsync/v4"
)

// Session affinity: a request that carries a session id goes to the worker rank its session
// was first routed to, for a time to live that each request of the session renews. In hard
// mode it always does (while the worker is registered); in soft mode it leaves a rank that is
// overloaded (over the model's busy thresholds, overload.go; without them, busy under the
// router queue's threshold) for the best other one, and the session moves there. A request that names a worker itself is not bound. Bindings are shared
// between replicas through the replica channel (Config.Share), so that any replica honours a
// session another one started.

// AffinityMode says when a session leaves its worker.
type AffinityMode uint8

// Affinity modes (Dynamo's --router-session-affinity-mode).
const (
	AffinityHard AffinityMode = iota // only when the worker is gone
	AffinitySoft                     // also when it is overloaded
)

// ParseAffinityMode parses hard or soft.
func ParseAffinityMode(s string) (AffinityMode, error) {
	switch strings.ToLower(s) {
	case "hard":
		return AffinityHard, nil
	case "soft":
		return AffinitySoft, nil
	}
	return 0, fmt.Errorf("unknown session affinity mode %q (want hard or soft)", s)
}

func (m AffinityMode) String() string {
	if m == AffinitySoft {
		return "soft"
	}
	return "hard"
}

// AffinityConfig turns session affinity on (Config.Affinity).
type AffinityConfig struct {
	TTL  time.Duration // how long a binding lasts after its session's last request (> 0)
	Mode AffinityMode
}

type affKey struct{ model, session string }

type affBinding struct {
	worker  radix.WorkerKey
	expires int64 // Config.Now
	shared  int64 // Config.Now when it was last sent to the other replicas
}

// affinity is the bindings, safe for concurrent use.
type affinity struct {
	cfg                         AffinityConfig
	m                           *xsync.Map[affKey, affBinding]
	hits, misses, moved, remote atomic.Int64
}

func newAffinity(cfg AffinityConfig) *affinity {
	return &affinity{cfg: cfg, m: xsync.NewMap[affKey, affBinding]()}
}

// sticky returns the worker req's session is bound to in m, if the binding lives and the
// worker may take it: registered, among req's allowed workers if it names some, and in soft
// mode not overloaded. count says to count the outcome (a route does; the queue's look does
// not).
func (r *Router) sticky(m *model, req *wire.RouteRequest, count bool) (radix.WorkerKey, bool) {
	a := r.aff
	b, ok := a.m.Load(affKey{m.name, req.SessionID})
	if !ok || b.expires < r.cfg.Now() {
		if count {
			a.misses.Add(1)
		}
		return radix.WorkerKey{}, false
	}
	list := m.list.Load()
	at := rankAt(list, b.worker)
	// A session leaves a rank out of routing (eject.go): it would be pinned to it.
	if at < 0 || len(req.Allowed) > 0 && !slices.Contains(req.Allowed, b.worker.ID) ||
		a.cfg.Mode == AffinitySoft && r.softLeaves(m, list, at) || r.rankOut(list.ws[at]) {
		if count {
			a.moved.Add(1)
		}
		return radix.WorkerKey{}, false
	}
	if count {
		a.hits.Add(1)
	}
	return b.worker, true
}

// pin returns the (worker, rank) req goes to whatever the scores: its pinned one, or its
// session's. ok is false for a request free to go anywhere it is allowed.
func (r *Router) pin(m *model, req *wire.RouteRequest) (k radix.WorkerKey, ok bool) {
	if req.HasPinned {
		return radix.WorkerKey{ID: req.PinnedWorker, Rank: req.PinnedRank}, true
	}
	if req.SessionID != "" && r.aff != nil {
		return r.sticky(m, req, false)
	}
	return k, false
}

// bind records that session of model went to worker, and tells the other replicas when the
// binding is new, moved, or half its time to live old.
func (r *Router) bind(model, session string, worker radix.WorkerKey) {
	a := r.aff
	now := r.cfg.Now()
	ttl := int64(a.cfg.TTL)
	share := false
	// The session id may alias a request buffer that is reused: the map keeps a copy.
	a.m.Compute(affKey{model, strings.Clone(session)}, func(old affBinding, loaded bool) (affBinding, xsync.ComputeOp) {
		b := affBinding{worker: worker, expires: now + ttl, shared: old.shared}
		if !loaded || old.worker != worker || now-old.shared > ttl/2 {
			b.shared, share = now, true
		}
		return b, xsync.UpdateOp
	})
	if share && r.cfg.Share != nil {
		r.cfg.Share.SessionBound(model, session, worker, a.cfg.TTL)
	}
}

// BindRemote records another replica's session binding (a replica.Sink method): session of
// model goes to worker for ttl. Errors: ErrInvalid (replica, session id or ttl).
func (r *Router) BindRemote(replica, model, session string, worker radix.WorkerKey, ttl time.Duration) error {
	if err := checkRemote(replica, session); err != nil {
		return err
	}
	if r.aff == nil {
		return nil // affinity is off here: nothing to keep
	}
	if ttl <= 0 {
		return fieldErr(ErrInvalid, "ttl", "%v is not positive", ttl)
	}
	ttl = min(ttl, r.aff.cfg.TTL)
	now := r.cfg.Now()
	r.aff.m.Store(affKey{strings.Clone(model), strings.Clone(session)}, affBinding{worker: worker, expires: now + int64(ttl), shared: now})
	r.aff.remote.Add(1)
	return nil
}

// expireAffinity drops the bindings past their time to live.
func (r *Router) expireAffinity() {
	now := r.cfg.Now()
	r.aff.m.DeleteMatching(func(_ affKey, b affBinding) (bool, bool) { return b.expires < now, false })
}

// SessionAffinity reports whether session affinity is on (Config.Affinity).
func (r *Router) SessionAffinity() bool { return r.aff != nil }

// AffinityStats are session affinity's counters, for metrics.
type AffinityStats struct {
	Sessions                    int   // bindings held
	Hits, Misses, Moved, Remote int64 // requests sent to their session's worker, sessions without one, sessions moved off theirs, bindings from other replicas
}

// AffinityStats returns the counters; ok is false without affinity.
func (r *Router) AffinityStats() (AffinityStats, bool) {
	if r.aff == nil {
		return AffinityStats{}, false
	}
	a := r.aff
	return AffinityStats{Sessions: a.m.Size(), Hits: a.hits.Load(), Misses: a.misses.Load(), Moved: a.moved.Load(), Remote: a.remote.Load()}, true
}

// softLeaves reports whether a soft session leaves the rank at position at of list (m's)
// because it may take no more work now: over m's busy thresholds when they are set, else, with
// the router queue on, busy as the queue counts it.
func (r *Router) softLeaves(m *model, list *workerList, at int) bool {
	w := list.ws[at]
	if t := m.busy.Load(); t != nil {
		over, _ := rankOverloaded(t, w)
		return over
	}
	return r.cfg.Queue != nil && prefillOver(list.loads[at].ActivePrefill(), r.cfg.Queue.Threshold, w)
}
