package router

import (
	"container/heap"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// The router queue (Dynamo's "router queue"): when every rank a request may go to is busy, the
// request waits in its model's queue instead of piling onto a worker that is already prefilling
// more than it can batch; the queue is served by policy and priority as capacity frees.
//
// A (worker, rank) is busy when the prompt tokens booked on it and not yet prefilled exceed
// Threshold × its max batched tokens (registered, or from its load reports; unknown counts as
// 10,000,000, so a rank that never said is never busy). A request waits when its model's queue
// already holds requests (no overtaking) or every eligible rank is busy: a pinned request's
// eligible rank is its own; a request restricted to some workers without a pin bypasses the
// queue, as in Dynamo. The queue is a heap served highest key first, key = (strict priority,
// policy score) with pj = max(priority jump, 0) seconds and arrival in seconds since the router
// started:
//
//	fcfs: pj − arrival
//	lcfs: pj + arrival
//	wspt: (1 + pj) / max(1, ISL − the best cached prefix among the eligible ranks, in tokens)
//
// equal keys in arrival order. The head blocks the line: it is admitted when a rank it may go to
// has room, and nothing behind it passes it. Admission re-scores the request against the index
// and books it as Route does. The queue drains on every prefill-done, completion, registration,
// removal and load report, and on a periodic recheck.

// QueuePolicy orders a model's queue.
type QueuePolicy uint8

// Queue policies.
const (
	FCFS QueuePolicy = iota // first come first served: the best tail TTFT
	WSPT                    // weighted shortest processing time: the best mean TTFT
	LCFS                    // last come first served, for comparison only
)

var queuePolicyNames = [...]string{"fcfs", "wspt", "lcfs"}

func (p QueuePolicy) String() string {
	if int(p) < len(queuePolicyNames) {
		return queuePolicyNames[p]
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// ParseQueuePolicy parses fcfs, wspt or lcfs.
func ParseQueuePolicy(s string) (QueuePolicy, error) {
	for i, n := range queuePolicyNames {
		if strings.EqualFold(s, n) {
			return QueuePolicy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown queue policy %q (want fcfs, wspt or lcfs)", s)
}

// QueueConfig turns the router queue on (Config.Queue). Zero values take the defaults listed.
type QueueConfig struct {
	// Threshold: a rank is busy when its active prefill tokens exceed Threshold × its max
	// batched tokens. 0 is valid (busy as soon as anything is prefilling).
	Threshold float64
	// Policy orders the queue (FCFS).
	Policy QueuePolicy
	// MaxRequests bounds each model's queue; a request that finds it full is refused at once
	// with ErrQueueFull (1,024).
	MaxRequests int
	// MaxWait is how long a request may wait when it does not say (30 s); past it, RouteWait
	// refuses it with ErrQueueTimeout.
	MaxWait time.Duration
	// Recheck is the period of the drain that does not wait for an event (100 ms).
	Recheck time.Duration
	// TTFTSLO, if > 0, also holds a request back while no rank it may go to is predicted to
	// give it its first token within TTFTSLO (scoring.Params.PredictTTFT, with its cached
	// prefix on each rank): a rank under the threshold but predicted past the objective is
	// busy for it. A request that would miss the objective even on an idle worker holding its
	// longest cached prefix is not held for it: waiting cannot help it.
	TTFTSLO time.Duration
	// Classes, if set, splits the queues of the models it has a profile for into policy
	// classes (policyclass.go).
	Classes *PolicyConfig
}

func (c *QueueConfig) defaults() {
	if c.MaxRequests <= 0 {
		c.MaxRequests = 1024
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 30 * time.Second
	}
	if c.Recheck <= 0 {
		c.Recheck = 100 * time.Millisecond
	}
}

// defaultMaxTokens is a rank's max batched tokens when it never said: never busy in practice
// (Dynamo's DEFAULT_MAX_BATCHED_TOKENS).
const defaultMaxTokens = 10_000_000

// Errors of the queue.
var (
	// ErrQueueFull: the model's queue holds Config.Queue.MaxRequests requests (HTTP 429).
	ErrQueueFull = errors.New("router: queue full")
	// ErrQueueTimeout: the request waited its longest wait without a rank freeing (HTTP 503).
	ErrQueueTimeout = errors.New("router: queue wait timed out")
	// ErrGone: the client left while its request waited.
	ErrGone = errors.New("router: client gone")
)

// Ticket is a request waiting in a model's queue, from Enqueue until its done function runs
// (admitted: Err nil and the response filled; refused: Err set). Its request and response
// belong to the router until then: the caller must not touch them.
type Ticket struct {
	// Err is the outcome once done has run: nil (routed and booked), or the error Route would
	// have returned at admission.
	Err error

	req  *wire.RouteRequest
	resp *wire.RouteResponse
	enc  *[]byte
	done func(*Ticket)
	m    *model

	strict  uint32
	score   float64
	seq     uint64
	arrival int64 // Config.Now at enqueue
	high    bool  // priority class for metrics: strict priority or a priority jump
	idx     int   // heap position, -1 once out of the heap
	pool    int   // the pool it waits for (poolOf)

	// Policy classes: the class's index (-1 for none), the DRR cost (uncached prompt tokens,
	// at least 1), and what it adds to its class's use.
	class             int
	cost, raw, cached int64
}

// modelQueue is one model's queue. REQUIRES mu for everything but the atomics.
type modelQueue struct {
	mu   sync.Mutex
	h    ticketHeap
	seq  uint64
	n    atomic.Int64 // len(h), readable without mu
	high atomic.Int64 // of them, the high-priority class
	// byPool is len(h) by the pool its requests wait for (poolOf): a request waits behind
	// those of its own pool only, so that a busy prefill pool holds back no request served
	// whole, nor the reverse.
	byPool  [2]atomic.Int64
	skipped []*Ticket // drainModel's, reused

	// Policy classes, nil for the single queue: the profile, a queue per class, the DRR ring
	// cursor, the class with credit left to look at first (-1 for none), and nextDRR's scratch.
	profile *PolicyProfile
	classes []*classQueue
	cursor  int
	carry   int
	costs   []int64

	// counters, for metrics
	queued, admitted, full, timedOut, gone atomic.Int64
	failed                                 atomic.Int64    // admitted, then refused by the route (e.g. every worker overloaded)
	waitNs                                 [2]atomic.Int64 // total wait of admitted requests by class
	waits                                  [2]atomic.Int64
}

type ticketHeap []*Ticket

func (h ticketHeap) Len() int { return len(h) }
func (h ticketHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.strict != b.strict {
		return a.strict > b.strict
	}
	if a.score != b.score {
		return a.score > b.score
	}
	return a.seq < b.seq
}
func (h ticketHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *ticketHeap) Push(x any)   { t := x.(*Ticket); t.idx = len(*h); *h = append(*h, t) }
func (h *ticketHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.idx = -1
	return t
}

// queueKey computes a request's key under policy: strict priority first, then the policy's
// score (see the comment at the top of this file).
func queueKey(policy QueuePolicy, req *wire.RouteRequest, arrival int64, isl, cachedTokens int) (uint32, float64) {
	pj := req.PriorityJump
	if !(pj > 0) {
		pj = 0
	}
	at := float64(arrival) / 1e9
	switch policy {
	case LCFS:
		return req.StrictPriority, pj + at
	case WSPT:
		return req.StrictPriority, (1 + pj) / float64(max(1, isl-cachedTokens))
	}
	return req.StrictPriority, pj - at
}

// queueing reports whether req goes through its model's queue: the queue is on and the request
// is not restricted to some workers without a pin.
func (r *Router) queueing(m *model, req *wire.RouteRequest) bool {
	return m != nil && m.queue != nil && (req.HasPinned || len(req.Allowed) == 0)
}

// busy reports whether every rank req may go to is busy (all), and whether it may go to any
// (eligible): its pinned or session's rank, or any of its pool's. A request with no eligible
// rank is not busy: Route refuses it at once rather than the queue keeping it.
//
// The pool is the stage that prefills (role.go): the serve pool for a request served whole, the
// prefill pool for a disaggregated one (its decode stage never waits: it prefills nothing).
// Under a load-aware conditional policy a disaggregated request waits only while the serve
// pool is busy too, since the policy serves it whole while the prefill pool is busy. A pin
// applies to the pool that holds its rank.
func (r *Router) busy(m *model, req *wire.RouteRequest) (all, eligible bool) {
	return r.busyBy(m, req, busyRule{tokens: -1, frac: r.cfg.Queue.Threshold})
}

// busyRule says when a rank is busy: past tokens prefill tokens (tokens ≥ 0), or past frac × its
// max batched tokens (frac ≥ 0). The single queue's is --router-queue-threshold's; a policy
// class has its own.
type busyRule struct {
	tokens int64
	frac   float64
}

func (b busyRule) over(prefill int64, w *rankWorker) bool {
	return b.tokens >= 0 && prefill > b.tokens || b.frac >= 0 && prefillOver(prefill, b.frac, w)
}

// busyBy is busy by rule.
func (r *Router) busyBy(m *model, req *wire.RouteRequest, rule busyRule) (all, eligible bool) {
	full := m.list.Load()
	k, pinned := r.pin(m, req)
	pools := [2]*workerList{full.serve}
	if req.Disagg && full.prefill != nil {
		pools[0] = full.prefill
		if p := r.cfg.Disagg.Policy; p == DisaggPrefillLoad || p == DisaggISLOrLoad {
			pools[1] = full.serve
		}
	}
	var slo *sloCheck
	if r.cfg.Queue.TTFTSLO > 0 {
		slo = r.sloCheck(m, req)
		defer slo.release(r)
	}
	for i, list := range pools {
		if list == nil {
			break
		}
		pin := pinned && (list != full.prefill || rankAt(list, k) >= 0)
		a, e := r.poolBusy(list, k, pin, slo, rule)
		if !a && e {
			return false, true
		}
		if i == 0 {
			all, eligible = a, e // the pool that prefills decides, when both are busy
		}
	}
	return all, eligible
}

// poolBusy is busy for one pool, with the pin k if pinned, and slo's objective if set.
func (r *Router) poolBusy(list *workerList, k radix.WorkerKey, pinned bool, slo *sloCheck, rule busyRule) (all, eligible bool) {
	for i, w := range list.ws {
		if pinned && w.key != k {
			continue
		}
		if !rule.over(list.loads[i].ActivePrefill(), w) && !slo.misses(list, i) {
			return false, true
		}
		eligible = true
	}
	return eligible, eligible
}

// sloCheck is one request's predicted time to first token on the ranks it may go to, for
// QueueConfig.TTFTSLO: its match against the index, and the parameters to predict with.
type sloCheck struct {
	s   *scratch
	p   scoring.Params
	slo float64 // ms
	off bool    // the request misses the objective even on an idle rank: not held for it
}

// sloCheck prepares req's check, nil if req does not route (Route refuses it then).
func (r *Router) sloCheck(m *model, req *wire.RouteRequest) *sloCheck {
	c := &sloCheck{s: r.scratch.Get(), slo: float64(r.cfg.Queue.TTFTSLO) / 1e6}
	if err := r.params(m, req, false, &c.p); err != nil {
		c.off = true
		return c
	}
	c.p.Step, c.p.Now, c.p.Decay = *m.step.Load(), r.cfg.Now(), true
	fleet := r.tracker.FleetSlowness()
	c.p.Step.RequestMs = r.tracker.MeanLifetime() / fleet
	c.s.match(r, m, req, &c.p, nil)
	best := int32(0)
	for _, d := range c.s.m.Depth {
		best = max(best, d)
	}
	c.off = c.p.PredictTTFT(best, 0, scoring.TierExt{}, 0, 0, 0)*fleet > c.slo
	return c
}

// misses reports whether the rank at position i of list is predicted to give the request its
// first token later than the objective; false without an objective.
func (c *sloCheck) misses(list *workerList, i int) bool {
	if c == nil || c.off {
		return false
	}
	l := list.loads[i]
	cached := int32(0)
	for j, slot := range c.s.m.Slots { // the ranks holding a prefix: few
		if slot == list.slots[i] {
			cached = c.s.m.Depth[j]
			break
		}
	}
	ahead := c.s.activePrefill(l, &c.p)
	return c.p.PredictTTFT(cached, 0, scoring.TierExt{}, l.ActiveBlocks(), ahead, l.Requests())*l.Slowness() > c.slo
}

func (c *sloCheck) release(r *Router) {
	if c != nil {
		r.scratch.Put(c.s)
	}
}

// allBusy reports whether every rank req may go to is busy (see busy).
func (r *Router) allBusy(m *model, req *wire.RouteRequest) bool {
	all, _ := r.busy(m, req)
	return all
}

// rankAt returns the position of rank k in list, -1 if it is not there.
func rankAt(list *workerList, k radix.WorkerKey) int {
	for i, key := range list.keys {
		if key == k {
			return i
		}
	}
	return -1
}

// Enqueue routes req as Route does, or, when the router queue holds it back, queues it. Routed
// at once, it returns a nil Ticket and Route's error. Queued, it returns the Ticket and nil:
// done(t) runs once, on the goroutine that admits or refuses it (a prefill-done, a completion,
// the periodic recheck, or Cancel's caller), never under a lock of the router; t.Err is the
// outcome. Without the queue (Config.Queue nil) it is Route. req's strings must stay valid
// while it waits.
func (r *Router) Enqueue(req *wire.RouteRequest, resp *wire.RouteResponse, done func(*Ticket)) (*Ticket, error) {
	return r.enqueue(req, resp, nil, "", done)
}

func (r *Router) enqueue(req *wire.RouteRequest, resp *wire.RouteResponse, enc *[]byte, class string, done func(*Ticket)) (*Ticket, error) {
	m := r.model(req.Model)
	if r.queueing(m, req) && m.queue.classes != nil {
		return r.enqueueClass(m, req, resp, enc, class, done)
	}
	if !r.queueing(m, req) || m.queue.byPool[poolOf(m, req)].Load() == 0 && !r.allBusy(m, req) {
		return nil, r.route(req, resp, true, enc)
	}
	if r.refusing.Load() {
		return nil, fieldErr(ErrClosed, "request", "the router is shutting down and queues no request")
	}
	// Check the request as Route would, and find its best cached prefix for wspt.
	cached, err := r.bestCached(m, req)
	if err != nil {
		return nil, err
	}
	q := m.queue
	q.mu.Lock()
	if r.refusing.Load() { // RefuseWaiting ran meanwhile: this request would never be released
		q.mu.Unlock()
		return nil, fieldErr(ErrClosed, "request", "the router is shutting down and queues no request")
	}
	pool := poolOf(m, req)
	if all, eligible := r.busy(m, req); q.byPool[pool].Load() == 0 && !all || !eligible {
		q.mu.Unlock()
		return nil, r.route(req, resp, true, enc)
	}
	if len(q.h) >= r.cfg.Queue.MaxRequests {
		q.mu.Unlock()
		q.full.Add(1)
		r.log.Warn("request refused: queue full", "request", strings.Clone(req.RequestID), "model", m.name, "queued", r.cfg.Queue.MaxRequests)
		return nil, fieldErr(ErrQueueFull, "model", "the router queue of model %q holds %d requests, its limit; retry later", m.name, r.cfg.Queue.MaxRequests)
	}
	now := r.cfg.Now()
	t := &Ticket{req: req, resp: resp, enc: enc, done: done, m: m, arrival: now, pool: pool, class: -1}
	t.strict, t.score = queueKey(r.cfg.Queue.Policy, req, now, isl(req, m), cached)
	t.high = req.StrictPriority > 0 || req.PriorityJump > 0
	q.seq++
	t.seq = q.seq
	heap.Push(&q.h, t)
	q.n.Add(1)
	q.byPool[pool].Add(1)
	if t.high {
		q.high.Add(1)
	}
	q.queued.Add(1)
	r.queued.Add(1)
	q.mu.Unlock()
	r.log.Debug("request waits: every eligible rank is busy or requests wait before it",
		"request", strings.Clone(req.RequestID), "model", m.name, "queued", q.n.Load(),
		"strict_priority", t.strict, "score", t.score, "policy", r.cfg.Queue.Policy.String())
	return t, nil
}

// isl is the prompt length of a request Route accepted.
func isl(req *wire.RouteRequest, m *model) int {
	if req.ByHash {
		if req.ISL != 0 {
			return int(req.ISL)
		}
		return len(req.Hashes) * m.blockSize
	}
	return len(req.Tokens)
}

// bestCached checks req as Route would and returns the longest prefix, in tokens, that one of
// the ranks it may go to holds.
func (r *Router) bestCached(m *model, req *wire.RouteRequest) (int, error) {
	if err := checkBookID(req.RequestID); err != nil {
		return 0, err
	}
	s := r.scratch.Get()
	defer r.scratch.Put(s)
	var p scoring.Params
	if err := r.params(m, req, false, &p); err != nil {
		return 0, err
	}
	s.match(r, m, req, &p, nil)
	list := m.list.Load()
	best := int32(0)
	pk, pinned := r.pin(m, req)
	for i, slot := range s.m.Slots {
		if pinned {
			if int(slot) >= len(list.bySlot) || list.bySlot[slot] < 0 || list.keys[list.bySlot[slot]] != pk {
				continue
			}
		}
		best = max(best, s.m.Depth[i])
	}
	return int(best) * m.blockSize, nil
}

// Cancel takes t out of its queue if it still waits there, without running its done function,
// and reports whether it did. False means t's outcome is decided: its done function has run or
// is about to.
func (r *Router) Cancel(t *Ticket) bool {
	q := t.m.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	if t.idx < 0 {
		return false
	}
	q.remove(t)
	r.queued.Add(-1)
	return true
}

// remove takes t out of the heap. REQUIRES q.mu.
func (q *modelQueue) remove(t *Ticket) {
	if t.class >= 0 {
		c := q.classes[t.class]
		heap.Remove(&c.h, t.idx)
		c.take(t)
	} else {
		heap.Remove(&q.h, t.idx)
	}
	q.n.Add(-1)
	q.byPool[t.pool].Add(-1)
	if t.high {
		q.high.Add(-1)
	}
}

// drain admits, in every model with requests waiting, the heads whose ranks have room.
func (r *Router) drain() {
	if r.queued.Load() == 0 {
		return
	}
	for _, m := range *r.models.Load() {
		if m.queue != nil && m.queue.n.Load() > 0 {
			r.drainModel(m)
		}
	}
}

// admit routes queued ticket t, now leaving q (REQUIRES q.mu), and counts the outcome: routed
// (with its wait, by priority) or failed.
func (r *Router) admit(q *modelQueue, t *Ticket) {
	r.queued.Add(-1)
	t.Err = r.route(t.req, t.resp, true, t.enc)
	if t.Err != nil {
		q.failed.Add(1)
		return
	}
	c := 0
	if t.high {
		c = 1
	}
	q.admitted.Add(1)
	q.waitNs[c].Add(r.cfg.Now() - t.arrival)
	q.waits[c].Add(1)
}

// drainModel admits m's heads while a rank they may go to has room. Admission is serialized
// per model (each pick sees the bookings of the one before); done functions run after the
// queue's lock is released.
func (r *Router) drainModel(m *model) {
	q := m.queue
	if q.classes != nil {
		r.drainClasses(m)
		return
	}
	var ready []*Ticket
	var blocked [2]bool // a head of the pool found busy: the pool's other requests wait too
	q.mu.Lock()
	skipped := q.skipped[:0]
	for len(q.h) > 0 {
		t := q.h[0]
		if blocked[t.pool] || r.allBusy(m, t.req) {
			// Its pool is busy: set it aside, and look on only while the other pool has
			// requests not yet looked at.
			blocked[t.pool] = true
			heap.Pop(&q.h)
			skipped = append(skipped, t)
			o := 1 - t.pool
			if blocked[o] || q.byPool[o].Load() == 0 {
				break
			}
			continue
		}
		heap.Pop(&q.h)
		q.n.Add(-1)
		q.byPool[t.pool].Add(-1)
		if t.high {
			q.high.Add(-1)
		}
		r.admit(q, t)
		ready = append(ready, t)
	}
	for _, t := range skipped {
		heap.Push(&q.h, t)
	}
	clear(skipped)
	q.skipped = skipped[:0]
	q.mu.Unlock()
	for _, t := range ready {
		t.done(t)
	}
}

// queueLoop drains the queues periodically, for capacity that frees without an event this
// router sees (a load report of another replica's completions, a clock).
func (r *Router) queueLoop() {
	t := time.NewTicker(r.cfg.Queue.Recheck)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			r.RefuseWaiting()
			return
		case <-t.C:
			r.drain()
		}
	}
}

// RefuseWaiting refuses every request waiting in the router queue with ErrClosed, and every one
// that would wait from now on: a shutdown need not wait out their deadlines. Routes that find
// room go on as before. Close does it too.
func (r *Router) RefuseWaiting() {
	if r.cfg.Queue == nil {
		return
	}
	r.refusing.Store(true)
	r.refuseQueued()
}

// refuseQueued refuses every waiting request with ErrClosed. REQUIRES r.refusing set, so that
// none is queued after.
func (r *Router) refuseQueued() {
	for _, m := range *r.models.Load() {
		if m.queue == nil {
			continue
		}
		q := m.queue
		q.mu.Lock()
		ts := append([]*Ticket(nil), q.h...)
		for _, c := range q.classes {
			ts = append(ts, c.h...)
		}
		for _, t := range ts {
			q.remove(t)
			r.queued.Add(-1)
			t.Err = ErrClosed
		}
		q.mu.Unlock()
		for _, t := range ts {
			t.done(t)
		}
	}
}

// RouteWait is Route through the router queue: when the queue holds the request back it waits
// until the request is admitted (and routed), its longest wait passes (req.MaxWaitMs, else
// Config.Queue.MaxWait: ErrQueueTimeout), or gone, polled every 50 ms while it waits, reports
// that the client left (ErrGone; nil gone never does). A request refused leaves nothing booked.
// With nothing waiting and a rank with room it is Route, and allocates nothing.
func (r *Router) RouteWait(req *wire.RouteRequest, resp *wire.RouteResponse, gone func() bool) error {
	return r.RouteWaitClass(req, resp, "", gone)
}

// RouteWaitClass is RouteWait for a request of policy class class ("" for its model's default;
// see policyclass.go). A model without policy classes ignores class.
func (r *Router) RouteWaitClass(req *wire.RouteRequest, resp *wire.RouteResponse, class string, gone func() bool) error {
	if r.admitNow(req, class) {
		return r.route(req, resp, true, nil)
	}
	return r.wait(req, resp, nil, class, gone)
}

// AppendRouteWait is RouteWait answering in the binary format, as AppendRoute is Route.
func (r *Router) AppendRouteWait(dst []byte, req *wire.RouteRequest, resp *wire.RouteResponse, gone func() bool) ([]byte, error) {
	return r.AppendRouteWaitClass(dst, req, resp, "", gone)
}

// AppendRouteWaitClass is AppendRouteWait for a request of policy class class, as
// RouteWaitClass.
func (r *Router) AppendRouteWaitClass(dst []byte, req *wire.RouteRequest, resp *wire.RouteResponse, class string, gone func() bool) ([]byte, error) {
	if r.admitNow(req, class) {
		return r.appendAnswer(dst, req, resp, true)
	}
	out := new([]byte) // the ticket keeps it while the request waits
	*out = dst
	if err := r.wait(req, resp, out, class, gone); err != nil {
		return dst, err
	}
	return *out, nil
}

// admitNow reports whether req is routed without looking at the queue: the queue is off, or
// nothing waits in it and a rank req may go to has room.
func (r *Router) admitNow(req *wire.RouteRequest, class string) bool {
	if r.cfg.Queue == nil {
		return true
	}
	m := r.model(req.Model)
	if !r.queueing(m, req) {
		return true
	}
	if m.queue.classes != nil {
		return r.classAdmitNow(m, req, class)
	}
	return m.queue.n.Load() == 0 && !r.allBusy(m, req)
}

func (r *Router) wait(req *wire.RouteRequest, resp *wire.RouteResponse, enc *[]byte, class string, gone func() bool) error {
	m := r.model(req.Model)
	ch := make(chan struct{})
	t, err := r.enqueue(req, resp, enc, class, func(*Ticket) { close(ch) })
	if t == nil {
		return err
	}
	maxWait := r.cfg.Queue.MaxWait
	if req.MaxWaitMs > 0 {
		maxWait = time.Duration(req.MaxWaitMs) * time.Millisecond
	}
	if t.class >= 0 {
		// A class's deadline is its slo_ms from arrival; a request's own shorter wait still
		// holds.
		if slo := m.queue.classes[t.class].cl.SLO; req.MaxWaitMs <= 0 || slo < maxWait {
			maxWait = slo
		}
	}
	deadline := time.NewTimer(maxWait)
	defer deadline.Stop()
	var poll <-chan time.Time
	if gone != nil {
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		poll = tk.C
	}
	q := m.queue
	for {
		select {
		case <-ch:
			return t.Err
		case <-deadline.C:
			if r.Cancel(t) {
				if t.class >= 0 {
					return r.pastDeadline(m, t)
				}
				q.timedOut.Add(1)
				r.log.Warn("request refused: waited its longest wait in the queue", "request", strings.Clone(req.RequestID), "model", m.name, "max_wait", maxWait)
				return fieldErr(ErrQueueTimeout, "max_wait_ms", "waited %v in the router queue of model %q without a worker freeing; retry later", maxWait, m.name)
			}
			<-ch
			return t.Err
		case <-poll:
			if !gone() {
				continue
			}
			if r.Cancel(t) {
				q.gone.Add(1)
				r.log.Debug("queued request left: the client disconnected", "request", strings.Clone(req.RequestID), "model", m.name)
				return fieldErr(ErrGone, "request", "the client disconnected while its request waited")
			}
			<-ch
			if t.Err == nil {
				// Admitted as the client left: nobody will complete it.
				_ = r.Complete(req.RequestID)
				q.gone.Add(1)
				return fieldErr(ErrGone, "request", "the client disconnected while its request waited")
			}
			return t.Err
		}
	}
}

// QueueStats is one model's queue, for metrics.
type QueueStats struct {
	Model string
	// Pending is the requests waiting now, by priority class: [0] normal, [1] high (a strict
	// priority or a priority jump).
	Pending [2]int64
	// Queued counts the requests that waited; Admitted those admitted from the queue and
	// routed, Failed those whose route then failed (every worker overloaded, say); Full,
	// TimedOut and Gone those refused for a full queue, a wait past its longest, a client that
	// left.
	Queued, Admitted, Failed, Full, TimedOut, Gone int64
	// WaitSeconds and Waits sum the waits of admitted requests, by class.
	WaitSeconds [2]float64
	Waits       [2]int64
	// Classes is the model's policy classes, in the profile's order; nil for the single queue.
	Classes []ClassStats
}

// QueueStats appends each model's queue statistics to dst (none without the queue).
func (r *Router) QueueStats(dst []QueueStats) []QueueStats {
	if r.cfg.Queue == nil {
		return dst
	}
	for _, m := range *r.models.Load() {
		q := m.queue
		if q == nil {
			continue
		}
		n, high := q.n.Load(), q.high.Load()
		st := QueueStats{Model: m.name, Pending: [2]int64{n - high, high},
			Queued: q.queued.Load(), Admitted: q.admitted.Load(), Failed: q.failed.Load(), Full: q.full.Load(),
			TimedOut: q.timedOut.Load(), Gone: q.gone.Load()}
		for c := range 2 {
			st.WaitSeconds[c] = float64(q.waitNs[c].Load()) / 1e9
			st.Waits[c] = q.waits[c].Load()
		}
		st.Classes = q.classStats()
		dst = append(dst, st)
	}
	return dst
}

// poolOf is the pool req waits for in its model's queue: 1 for a disaggregated request while the
// model has a prefill worker (the prefill pool), else 0 (the serve pool).
func poolOf(m *model, req *wire.RouteRequest) int {
	if req.Disagg && m.list.Load().prefill != nil {
		return 1
	}
	return 0
}
