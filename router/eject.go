package router

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Passive outlier ejection, as Envoy's outlier detection does it: whoever sends requests to the
// workers (the front door) reports each failure and each success of a (worker, rank), and a rank
// that fails Consecutive times in a row (ConsecutiveConnect refused connections) leaves routing
// for a while. An ejection lasts BaseTime × the times the rank was ejected, at most MaxTime; the
// multiplier decays by one for each BaseTime the rank spends in routing afterwards. At most
// MaxPercent of a model's ranks are out at once (one always may be), and when every candidate of
// a request is out, the request is routed among them anyway (panic mode, as Envoy's): the
// router never refuses a request for its workers' health.
//
// A rank that failed is suspect until it answers a request: it loses every tie (the cheapest
// workers at equal cost; in least_loaded mode, equal request counts), so that a worker that
// holds nothing, and so wins the "fewest blocks" tie-break, does not draw every fresh request
// while it is down or just back.
//
// With a prober attached (SetProber: the front door's, which GETs each due rank's /health),
// an ejected rank stays out past its time until the probe says: ProbeOK puts it back in routing
// (still suspect), ProbeFailed ejects it again, for longer. Without one, or when the probe's
// verdict is late by more than the grace SetProber gave, it comes back when its time is up.
//
// Cost: the route path reads one atomic counter of the model (marked ranks) and, while it is
// zero, nothing else. While some rank of the model is marked it reads the clock and the
// model's latest ejection end: while a rank is out, routes of that model take the general
// path (route.go), which reads each rank's ejection time and suspect flag; otherwise the fast
// path, which reads the suspect flags of the ranks tied for the choice.

// EjectConfig configures outlier ejection (eject.go). Zero values take the defaults listed.
type EjectConfig struct {
	// Off turns ejection off: failures are counted, and nothing leaves routing or loses a tie.
	Off bool
	// Consecutive is the failures in a row (5xx answers, resets, timeouts, failed /tokenize
	// calls) that eject a rank (3).
	Consecutive int
	// ConsecutiveConnect is the refused connections in a row that eject a rank (1): a worker
	// that cannot be reached cannot serve, and each try costs a request a connection attempt.
	ConsecutiveConnect int
	// BaseTime is the first ejection's length, and each later one's step (10 s); MaxTime caps
	// an ejection (300 s, Envoy's max_ejection_time).
	BaseTime time.Duration
	MaxTime  time.Duration
	// MaxPercent is the most of a model's ranks out at once, in percent (50); the first
	// ejection of a model is always allowed. An ejection over it is refused (counted), and the
	// rank stays suspect.
	MaxPercent int
}

func (c *EjectConfig) defaults() {
	if c.Consecutive <= 0 {
		c.Consecutive = 3
	}
	if c.ConsecutiveConnect <= 0 {
		c.ConsecutiveConnect = 1
	}
	if c.BaseTime <= 0 {
		c.BaseTime = 10 * time.Second
	}
	if c.MaxTime <= 0 {
		c.MaxTime = 300 * time.Second
	}
	c.MaxTime = max(c.MaxTime, c.BaseTime)
	if c.MaxPercent <= 0 || c.MaxPercent > 100 {
		c.MaxPercent = 50
	}
}

// FailureReasons are the reasons UpstreamFailed takes, as metrics label them; any other is
// counted as "other".
var FailureReasons = [...]string{"connect", "reset", "5xx", "tokenize", "timeout", "probe", "other"}

const (
	reasonConnect = iota
	reasonReset
	reason5xx
	reasonTokenize
	reasonTimeout
	reasonProbe
	reasonOther
	numReasons
)

func reasonIndex(s string) int {
	for i, n := range FailureReasons {
		if n == s {
			return i
		}
	}
	return reasonOther
}

// rankHealth is one rank's health. out and suspect are read lock-free by the route path; the
// rest, and every change, under routerHealth.mu.
type rankHealth struct {
	// out is the Config.Now until which routing skips the rank, 0 when it is in routing (a
	// time past means it is back, whatever the other fields say).
	out atomic.Int64
	// suspect: the rank failed since it last answered (it loses ties, and is counted in the
	// model's and the router's marked).
	suspect atomic.Bool

	failures int   // in a row, since the last success or ejection
	times    int   // the ejection multiplier, decayed
	due      int64 // Config.Now when the current ejection's time is up (probe due)
	back     int64 // Config.Now when it last came back into routing
	last     int   // reason of the last failure
	dropped  bool  // unregistered: nothing changes it any more
}

// outAt says whether routing skips the rank at now.
func (h *rankHealth) outAt(now int64) bool {
	o := h.out.Load()
	return o != 0 && now < o
}

// modelHealth is a model's share of the health state.
type modelHealth struct {
	marked atomic.Int32 // its suspect ranks (every ejected rank is suspect)
	// outMax is the latest rankHealth.out of its ranks (written under routerHealth.mu): while
	// Config.Now is past it no rank is out, and routes may take the fast path.
	outMax atomic.Int64
}

// routerHealth is the Router's health state: the lock of every rank's transitions and the
// counters.
type routerHealth struct {
	// mu orders every rankHealth change. Lock order: Router.mu, then mu.
	mu     sync.Mutex
	marked atomic.Int32 // suspect ranks, every model's
	// suspects is the suspect ranks by key, copy-on-write (written under mu): UpstreamOK of a
	// healthy rank looks it up without a lock and returns.
	suspects  atomic.Pointer[map[radix.WorkerKey]*rankWorker]
	grace     atomic.Int64 // SetProber's grace in nanoseconds; 0: no prober attached
	failures  [numReasons]atomic.Int64
	ejections [numReasons]atomic.Int64
	refused   atomic.Int64 // ejections MaxPercent refused
	panics    atomic.Int64 // routes made among ejected ranks, as every candidate was
}

// HealthStats are the outlier ejection's counters, by reason (indexes of FailureReasons).
type HealthStats struct {
	Failures  [numReasons]int64 // failures reported
	Ejections [numReasons]int64 // ejections, by the reason of the failure that made each
	// Refused counts ejections that MaxPercent refused; Panics the routes made among ejected
	// ranks because every candidate was; Ejected the ranks out of routing now.
	Refused, Panics, Ejected int64
}

// HealthStats returns the outlier ejection's counters. Safe for concurrent use.
func (r *Router) HealthStats() HealthStats {
	var st HealthStats
	for i := range st.Failures {
		st.Failures[i] = r.health.failures[i].Load()
		st.Ejections[i] = r.health.ejections[i].Load()
	}
	st.Refused, st.Panics = r.health.refused.Load(), r.health.panics.Load()
	if r.health.marked.Load() > 0 {
		now := r.cfg.Now()
		for _, m := range *r.models.Load() {
			if m.health.marked.Load() == 0 {
				continue
			}
			for _, w := range m.list.Load().ws {
				if w.health.outAt(now) {
					st.Ejected++
				}
			}
		}
	}
	return st
}

// UpstreamFailed reports that a request to worker's rank failed before answering, for reason:
// "connect" (the connection was refused, or could not be made in time), "reset", "5xx",
// "tokenize" (its /tokenize call failed), "timeout" (no answer in time). A refused connection
// and a failed /tokenize concern the worker's HTTP endpoint, which all its ranks share: they
// count against every rank of the worker. The rank becomes suspect (it loses ties until
// UpstreamOK), and after EjectConfig's failures in a row it leaves routing (eject.go). An
// unknown worker or rank is ignored. Safe for concurrent use; it takes the registry's lock.
func (r *Router) UpstreamFailed(worker uint64, rank uint32, reason string) {
	ri := reasonIndex(reason)
	r.health.failures[ri].Add(1)
	if r.cfg.Eject.Off {
		return
	}
	var buf [1]*rankWorker
	ws := r.healthRanks(worker, rank, ri == reasonConnect || ri == reasonTokenize, buf[:0])
	if len(ws) == 0 {
		return
	}
	now := r.cfg.Now()
	var evs [1]ejectEvent
	out := evs[:0]
	r.health.mu.Lock()
	for _, w := range ws {
		if e, ok := r.failLocked(w, ri, now, false); ok {
			out = append(out, e)
		}
	}
	r.health.mu.Unlock()
	r.logEjects(out)
}

// UpstreamOK reports that worker's rank answered a request: it is no longer suspect, its
// failures in a row start again from none, and if it was out of routing (a request reached it
// in panic mode), it is back. Safe for concurrent use; for a rank that has not failed since its
// last success it takes no lock: one atomic load, and a map lookup while some rank has.
func (r *Router) UpstreamOK(worker uint64, rank uint32) {
	ms := r.health.suspects.Load()
	if ms == nil {
		return
	}
	w := (*ms)[radix.WorkerKey{ID: worker, Rank: rank}]
	if w == nil {
		return
	}
	h := &w.health
	now := r.cfg.Now()
	r.health.mu.Lock()
	if h.dropped {
		r.health.mu.Unlock()
		return
	}
	h.failures = 0
	wasOut := h.outAt(now)
	r.returnLocked(w, now)
	r.unmarkLocked(w)
	r.health.mu.Unlock()
	if wasOut {
		r.log.Info("worker rank back in routing: it answered a request", "worker", worker, "dp_rank", rank, "model", w.reg.model.name)
	}
}

// ProbeOK reports that worker's rank, ejected, passed a health probe: it is back in routing,
// suspect (it loses ties) until it answers a request. Safe for concurrent use.
func (r *Router) ProbeOK(worker uint64, rank uint32) {
	var buf [1]*rankWorker
	ws := r.healthRanks(worker, rank, false, buf[:0])
	if len(ws) == 0 {
		return
	}
	w := ws[0]
	now := r.cfg.Now()
	r.health.mu.Lock()
	back := !w.health.dropped && w.health.outAt(now)
	if !w.health.dropped {
		r.returnLocked(w, now)
	}
	r.health.mu.Unlock()
	if back {
		r.log.Info("worker rank back in routing: its health probe passed", "worker", worker, "dp_rank", rank, "model", w.reg.model.name)
	}
}

// ProbeFailed reports that worker's rank, ejected, failed a health probe: it is ejected again,
// for longer (the multiplier grows). A rank back in routing meanwhile is left as it is. Safe
// for concurrent use.
func (r *Router) ProbeFailed(worker uint64, rank uint32) {
	r.health.failures[reasonProbe].Add(1)
	var buf [1]*rankWorker
	ws := r.healthRanks(worker, rank, false, buf[:0])
	if len(ws) == 0 {
		return
	}
	now := r.cfg.Now()
	var evs [1]ejectEvent
	out := evs[:0]
	r.health.mu.Lock()
	if w := ws[0]; !w.health.dropped && w.health.out.Load() != 0 {
		if e, ok := r.failLocked(w, reasonProbe, now, true); ok {
			out = append(out, e)
		}
	}
	r.health.mu.Unlock()
	r.logEjects(out)
}

// SetProber says whether a prober watches the ejected ranks (ProbeOK, ProbeFailed): with grace
// > 0, an ejected rank stays out of routing past its time until the probe's verdict, or grace
// after its time at the most; 0 detaches the prober, and every ejection, made already or
// later, ends with its time. Safe for concurrent use.
func (r *Router) SetProber(grace time.Duration) {
	grace = max(grace, 0)
	if r.health.grace.Swap(int64(grace)) == 0 || grace > 0 {
		return
	}
	// No verdict is coming: the ranks waiting for one come back at their time.
	r.mu.Lock()
	r.health.mu.Lock()
	for _, reg := range r.workers {
		for _, w := range reg.ranks {
			if h := &w.health; h.out.Load() > h.due {
				h.out.Store(h.due)
			}
		}
	}
	for _, m := range *r.models.Load() {
		outMaxLocked(m)
	}
	r.health.mu.Unlock()
	r.mu.Unlock()
}

// EjectedRank is a rank out of routing (OutRanks), or one whose ejection's time is up, for the
// prober to check (DueProbes).
type EjectedRank struct {
	Worker uint64
	Rank   uint32
	Model  string
	// Endpoint is the worker's HTTP API base URL (Registration.HTTPEndpoint), "" for none.
	Endpoint string
}

// DueProbes appends to dst the ejected ranks whose time is up and whose worker has an HTTP
// endpoint, by worker and rank, and returns it. Safe for concurrent use; while no rank has
// failed since its last success it reads one atomic counter and returns.
func (r *Router) DueProbes(dst []EjectedRank) []EjectedRank {
	return r.appendRanks(dst, true, func(h *rankHealth, now int64) bool { return h.out.Load() != 0 && now >= h.due })
}

// OutRanks appends to dst the ranks out of routing now, by worker and rank, and returns it.
// Safe for concurrent use; cheap while no rank has failed since its last success.
func (r *Router) OutRanks(dst []EjectedRank) []EjectedRank {
	return r.appendRanks(dst, false, func(h *rankHealth, now int64) bool { return h.outAt(now) })
}

// appendRanks appends to dst the ranks of which pick is true (REQUIRES r.health.mu), those of
// workers with an HTTP endpoint only if probed, by worker and rank.
func (r *Router) appendRanks(dst []EjectedRank, probed bool, pick func(h *rankHealth, now int64) bool) []EjectedRank {
	if r.health.marked.Load() == 0 {
		return dst
	}
	start := len(dst)
	now := r.cfg.Now()
	r.mu.Lock()
	r.health.mu.Lock()
	for id, reg := range r.workers {
		if reg.model.health.marked.Load() == 0 {
			continue
		}
		var ep string
		if u := reg.http.Load(); u != nil {
			ep = *u
		} else if probed {
			continue
		}
		for _, w := range reg.ranks {
			if pick(&w.health, now) {
				dst = append(dst, EjectedRank{Worker: id, Rank: w.key.Rank, Model: reg.model.name, Endpoint: ep})
			}
		}
	}
	r.health.mu.Unlock()
	r.mu.Unlock()
	slices.SortFunc(dst[start:], func(a, b EjectedRank) int {
		if c := cmp.Compare(a.Worker, b.Worker); c != 0 {
			return c
		}
		return cmp.Compare(a.Rank, b.Rank)
	})
	return dst
}

// healthRanks appends to dst worker's rank, or with every all of its ranks, if registered.
func (r *Router) healthRanks(worker uint64, rank uint32, every bool, dst []*rankWorker) []*rankWorker {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg := r.workers[worker]
	if reg == nil {
		return dst
	}
	if every {
		return append(dst, reg.ranks...)
	}
	if i, ok := slices.BinarySearchFunc(reg.ranks, rank, func(w *rankWorker, rank uint32) int {
		return cmp.Compare(w.key.Rank, rank)
	}); ok {
		dst = append(dst, reg.ranks[i])
	}
	return dst
}

// ejectEvent is an ejection, or one refused, to log once the lock is let go.
type ejectEvent struct {
	w        *rankWorker
	reason   int
	failures int
	times    int
	d        time.Duration
	refused  bool
}

// failLocked counts a failure of w for reason at now, and ejects w when they are enough (at
// once with probe: a failed probe of an ejected rank). It returns what to log. REQUIRES
// r.health.mu.
func (r *Router) failLocked(w *rankWorker, reason int, now int64, probe bool) (ejectEvent, bool) {
	h := &w.health
	if h.dropped {
		return ejectEvent{}, false
	}
	h.last = reason
	r.markLocked(w)
	if !probe && h.outAt(now) {
		return ejectEvent{}, false // out already: a panic-mode request's failure adds nothing
	}
	h.failures++
	need := r.cfg.Eject.Consecutive
	if reason == reasonConnect {
		need = r.cfg.Eject.ConsecutiveConnect
	}
	if !probe && h.failures < need {
		return ejectEvent{}, false
	}
	if !probe && !r.mayEjectLocked(w, now) {
		// Counted each time, logged the first: a rank refusing connections fails every
		// request that still reaches it.
		r.health.refused.Add(1)
		return ejectEvent{w: w, reason: reason, failures: h.failures, refused: true}, h.failures == need
	}
	cfg := &r.cfg.Eject
	o := h.out.Load()
	if o != 0 && now >= o {
		h.back, o = o, 0 // its last ejection ended with its time
		h.out.Store(0)
	}
	if o == 0 {
		// In routing since it came back: the multiplier decays by one per BaseTime of it.
		h.times = max(h.times-int((now-h.back)/int64(cfg.BaseTime)), 0)
	}
	h.times++
	d := min(time.Duration(h.times)*cfg.BaseTime, cfg.MaxTime)
	h.due = now + int64(d)
	h.out.Store(h.due + r.health.grace.Load())
	if m := &w.reg.model.health; h.out.Load() > m.outMax.Load() {
		m.outMax.Store(h.out.Load())
	}
	e := ejectEvent{w: w, reason: reason, failures: h.failures, times: h.times, d: d}
	h.failures = 0
	r.health.ejections[reason].Add(1)
	return e, true
}

// returnLocked puts w back in routing at now, if it was out. REQUIRES r.health.mu.
func (r *Router) returnLocked(w *rankWorker, now int64) {
	h := &w.health
	if o := h.out.Load(); o != 0 {
		h.back = min(now, o)
		h.out.Store(0)
		outMaxLocked(w.reg.model)
	}
}

// outMaxLocked sets m's outMax anew from its ranks. REQUIRES r.health.mu.
func outMaxLocked(m *model) {
	var v int64
	for _, w := range m.list.Load().ws {
		v = max(v, w.health.out.Load())
	}
	m.health.outMax.Store(v)
}

// mayEjectLocked says whether MaxPercent lets w leave routing at now. REQUIRES r.health.mu.
func (r *Router) mayEjectLocked(w *rankWorker, now int64) bool {
	ws := w.reg.model.list.Load().ws
	out := 0
	for _, x := range ws {
		if x != w && x.health.outAt(now) {
			out++
		}
	}
	return out == 0 || (out+1)*100 <= r.cfg.Eject.MaxPercent*len(ws)
}

// forgetHealth takes a rank being unregistered out of the counts. Safe for concurrent use.
func (r *Router) forgetHealth(w *rankWorker) {
	r.health.mu.Lock()
	defer r.health.mu.Unlock()
	h := &w.health
	if h.dropped {
		return
	}
	r.unmarkLocked(w)
	h.dropped = true
	if h.out.Load() != 0 {
		h.out.Store(0)
		outMaxLocked(w.reg.model) // its model's list no longer holds it
	}
}

func (r *Router) logEjects(evs []ejectEvent) {
	for _, e := range evs {
		w := e.w
		if e.refused {
			r.log.Warn("worker rank not ejected: too many of its model's ranks are out already",
				"worker", w.key.ID, "dp_rank", w.key.Rank, "model", w.reg.model.name, "reason", FailureReasons[e.reason],
				"failures", e.failures, "max_percent", r.cfg.Eject.MaxPercent)
			continue
		}
		r.log.Warn("worker rank ejected from routing",
			"worker", w.key.ID, "dp_rank", w.key.Rank, "model", w.reg.model.name, "reason", FailureReasons[e.reason],
			"failures", e.failures, "for", e.d, "times_ejected", e.times, "probed", r.health.grace.Load() > 0)
	}
}

// markLocked makes w suspect, if it is not. REQUIRES r.health.mu.
func (r *Router) markLocked(w *rankWorker) {
	if w.health.suspect.Load() {
		return
	}
	w.health.suspect.Store(true)
	r.health.marked.Add(1)
	w.reg.model.health.marked.Add(1)
	old := r.health.suspects.Load()
	next := make(map[radix.WorkerKey]*rankWorker, len(suspectsOf(old))+1)
	for k, v := range suspectsOf(old) {
		next[k] = v
	}
	next[w.key] = w
	r.health.suspects.Store(&next)
}

// unmarkLocked makes w not suspect, if it is. REQUIRES r.health.mu.
func (r *Router) unmarkLocked(w *rankWorker) {
	if !w.health.suspect.Load() {
		return
	}
	w.health.suspect.Store(false)
	r.health.marked.Add(-1)
	w.reg.model.health.marked.Add(-1)
	old := suspectsOf(r.health.suspects.Load())
	if len(old) <= 1 {
		r.health.suspects.Store(nil)
		return
	}
	next := make(map[radix.WorkerKey]*rankWorker, len(old)-1)
	for k, v := range old {
		if v != w {
			next[k] = v
		}
	}
	r.health.suspects.Store(&next)
}

// suspectsOf is the map m points to, nil for none.
func suspectsOf(m *map[radix.WorkerKey]*rankWorker) map[radix.WorkerKey]*rankWorker {
	if m == nil {
		return nil
	}
	return *m
}

// rankOut says whether routing skips w now. Cheap while w's model has no marked rank.
func (r *Router) rankOut(w *rankWorker) bool {
	return w.reg.model.health.marked.Load() != 0 && w.health.outAt(r.cfg.Now())
}

// Health is a rank's health as listings show it (WorkerInfo.Health).
const (
	HealthOK      = "ok"      // in routing, no failure since its last success
	HealthSuspect = "suspect" // in routing, failed since its last success: loses ties
	HealthEjected = "ejected" // out of routing
)

// fillHealth fills x's health fields from w's at now (Config.Now) and wall. REQUIRES
// r.health.mu.
func (r *Router) fillHealthLocked(x *WorkerInfo, w *rankWorker, now int64, wall time.Time) {
	h := &w.health
	x.Health = HealthOK
	switch {
	case h.outAt(now):
		x.Health = HealthEjected
		x.EjectedUntil = wall.Add(time.Duration(max(h.due-now, 0))).UTC()
	case h.suspect.Load():
		x.Health = HealthSuspect
	}
	if h.times > 0 || h.failures > 0 || h.suspect.Load() {
		x.Ejections = h.times
		x.ConsecutiveFailures = h.failures
		if h.suspect.Load() {
			x.LastFailure = FailureReasons[h.last]
		}
	}
}

// The route path's part (route.go's candidates, general): skip the ranks out, unless every
// candidate is (panic mode), and make suspect ranks lose ties.

// markOut sets s.out[i] for each rank of list out of routing at s.now and returns how many.
func (s *scratch) markOut(list *workerList) int {
	n := len(list.ws)
	s.isOut = slices.Grow(s.isOut[:0], n)[:n]
	k := 0
	for i, w := range list.ws {
		o := w.health.outAt(s.now)
		s.isOut[i] = o
		if o {
			k++
		}
	}
	return k
}

// avoidSuspect returns the candidate to take in place of chosen, the choice of p's mode among
// s.cands of list: chosen, unless it is suspect and a candidate that is not ties with it (at
// temperature 0 in kv mode: the same logit; in least_loaded mode: as many active requests),
// in which case one of those by scoring.TieBreak.
func (s *scratch) avoidSuspect(list *workerList, p *scoring.Params, chosen int, rng *rand.Rand) int {
	c := s.cands
	if !list.ws[s.worker(chosen)].health.suspect.Load() {
		return chosen
	}
	var tied func(i int) bool
	switch {
	case p.Mode == scoring.KV && p.Temperature == 0:
		l := c[chosen].Logit
		tied = func(i int) bool { return c[i].Logit == l }
	case p.Mode == scoring.LeastLoaded:
		n := c[chosen].ActiveRequests
		tied = func(i int) bool { return c[i].ActiveRequests == n }
	default:
		return chosen
	}
	var tb scoring.TieBreak
	found := false
	tree := func(i int) int64 {
		if p.Mode == scoring.LeastLoaded {
			return 0 // least_loaded breaks its ties at random
		}
		return c[i].Tree
	}
	for i := range c {
		if tied(i) && !list.ws[s.worker(i)].health.suspect.Load() {
			tb.Add(i, tree(i))
			found = true
		}
	}
	if !found {
		return chosen
	}
	if i, only := tb.Draw(rng); only {
		return i
	}
	for i := range c {
		if tied(i) && !list.ws[s.worker(i)].health.suspect.Load() && tb.Take(tree(i)) {
			return i
		}
	}
	return chosen
}

// setEject readies s for route's general path: eject says some rank of the model is marked.
func (s *scratch) setEject(r *Router, eject bool) {
	s.eject = eject
	if eject {
		s.now = r.cfg.Now()
	}
}

// ejecting says whether routes of m must mind the ranks' health: some rank of it is marked.
func (r *Router) ejecting(m *model) bool {
	return m.health.marked.Load() != 0 && !r.cfg.Eject.Off
}

// fillHealth fills the health fields of out, whose ranks are ws.
func (r *Router) fillHealth(out []WorkerInfo, ws []*rankWorker) {
	now, wall := r.cfg.Now(), time.Now()
	r.health.mu.Lock()
	defer r.health.mu.Unlock()
	for i := range out {
		r.fillHealthLocked(&out[i], ws[i], now, wall)
	}
}

// logHealth writes the decision log's health lines (debug level, beside logDecision's): each
// rank left out of the candidates as ejected, and the suspect candidate tied that lost the tie
// to chosen. tied is the mode's choice before the tie-break, chosen the one made.
func (s *scratch) logHealth(r *Router, req *wire.RouteRequest, list *workerList, tied, chosen int) {
	id := strings.Clone(req.RequestID)
	if !s.all {
		for i, w := range list.ws {
			if len(s.isOut) == len(list.ws) && s.isOut[i] && s.at[i] < 0 {
				r.log.Debug("candidate skipped: ejected", "request", id, "worker", w.key.ID, "dp_rank", w.key.Rank)
			}
		}
	}
	if tied != chosen {
		c, t := &s.cands[chosen], &s.cands[tied]
		r.log.Debug("tie lost: the worker failed since its last answer", "request", id,
			"worker", t.Worker, "dp_rank", t.Rank, "to_worker", c.Worker, "to_dp_rank", c.Rank)
	}
}

// loseTies drops from ties (scoreKV's, in position order) the suspect ranks of list, unless
// every one is: they lose ties, as avoidSuspect makes them on the general path.
func loseTies(ties []tie, list *workerList) []tie {
	k := 0
	for _, t := range ties {
		if !list.ws[t.pos].health.suspect.Load() {
			ties[k] = t
			k++
		}
	}
	if k == 0 {
		return ties // nothing was written over: every tied rank is suspect
	}
	return ties[:k]
}
