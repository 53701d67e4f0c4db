package router

import (
	"container/heap"
	"strings"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/wire"
)

// A model's router queue split into policy classes, served by deficit round robin; the rules are
// at the top of policyclass.go.

// classQueue is one policy class of a model's queue. REQUIRES the model queue's mu for all but
// the atomics.
type classQueue struct {
	cl      *PolicyClass
	h       ticketHeap
	deficit int64
	// what the class's queued requests hold: requests, prompt tokens, cached tokens
	reqs, raw, cached int64

	n                        atomic.Int64 // len(h), readable without mu
	limited, expired, queued atomic.Int64 // refused at a limit, past the deadline; queued
}

func newModelQueue(p *PolicyProfile) *modelQueue {
	q := &modelQueue{carry: -1}
	if p == nil {
		return q
	}
	q.profile = p
	q.classes = make([]*classQueue, len(p.Classes))
	q.costs = make([]int64, len(p.Classes))
	for i := range p.Classes {
		q.classes[i] = &classQueue{cl: &p.Classes[i]}
	}
	return q
}

func (c *classQueue) rule() busyRule { return busyRule{tokens: c.cl.BusyTokens, frac: c.cl.BusyFrac} }

// take removes t's share of the class's use (t is out of c.h already).
func (c *classQueue) take(t *Ticket) {
	c.reqs--
	c.raw -= t.raw
	c.cached -= t.cached
	c.n.Add(-1)
	if len(c.h) == 0 {
		c.deficit = 0
	}
}

// limit returns the refusal of a new request by the class's limits, nil if none is reached.
func (c *classQueue) limit(workers int64) *PolicyClassError {
	for _, l := range [...]struct {
		kind     string
		cur, per int64
	}{{"requests", c.reqs, c.cl.RequestLimit}, {"raw_isl_tokens", c.raw, c.cl.RawISLLimit}, {"cached_tokens", c.cached, c.cl.CachedLimit}} {
		if l.per < 0 {
			continue
		}
		if lim := l.per * workers; l.cur >= lim {
			return &PolicyClassError{Class: c.cl.Name, LimitKind: l.kind, Current: l.cur, Limit: lim, err: ErrPolicyClassLimit}
		}
	}
	return nil
}

// workerCount is the number of workers (not ranks) of m, the scale of per-worker limits.
func workerCount(m *model) int64 {
	list := m.list.Load()
	n := int64(0)
	var last uint64
	for i, k := range list.keys { // sorted by id, then rank
		if i == 0 || k.ID != last {
			n++
			last = k.ID
		}
	}
	return n
}

// classAdmitNow is admitNow for a model with policy classes: the request's class does not
// queue, or nothing of it waits and a rank it may go to is not busy by it. An unknown class is
// not admitted now: enqueueClass refuses it.
func (r *Router) classAdmitNow(m *model, req *wire.RouteRequest, class string) bool {
	i := m.queue.profile.resolve(class)
	if i < 0 {
		return false
	}
	c := m.queue.classes[i]
	return !c.cl.queues() || c.n.Load() == 0 && !r.allBusyBy(m, req, c.rule())
}

func (r *Router) allBusyBy(m *model, req *wire.RouteRequest, rule busyRule) bool {
	all, _ := r.busyBy(m, req, rule)
	return all
}

// enqueueClass is enqueue for a model with policy classes.
func (r *Router) enqueueClass(m *model, req *wire.RouteRequest, resp *wire.RouteResponse, enc *[]byte, class string, done func(*Ticket)) (*Ticket, error) {
	q := m.queue
	ci := q.profile.resolve(class)
	if ci < 0 {
		return nil, fieldErr(ErrUnknownPolicyClass, "policy_class", "unknown router policy class %q (model %q)", class, m.name)
	}
	c := q.classes[ci]
	if !c.cl.queues() || c.n.Load() == 0 && !r.allBusyBy(m, req, c.rule()) {
		return nil, r.route(req, resp, true, enc)
	}
	if r.refusing.Load() {
		return nil, fieldErr(ErrClosed, "request", "the router is shutting down and queues no request")
	}
	cached, err := r.bestCached(m, req)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	if r.refusing.Load() {
		q.mu.Unlock()
		return nil, fieldErr(ErrClosed, "request", "the router is shutting down and queues no request")
	}
	if all, eligible := r.busyBy(m, req, c.rule()); len(c.h) == 0 && !all || !eligible {
		q.mu.Unlock()
		return nil, r.route(req, resp, true, enc)
	}
	if e := c.limit(workerCount(m)); e != nil {
		q.mu.Unlock()
		c.limited.Add(1)
		r.log.Warn("request refused: policy class queue limit", "request", strings.Clone(req.RequestID), "model", m.name,
			"policy_class", c.cl.Name, "limit_kind", e.LimitKind, "current", e.Current, "limit", e.Limit)
		return nil, e
	}
	if int(q.n.Load()) >= r.cfg.Queue.MaxRequests {
		q.mu.Unlock()
		q.full.Add(1)
		return nil, fieldErr(ErrQueueFull, "model", "the router queue of model %q holds %d requests, its limit; retry later", m.name, r.cfg.Queue.MaxRequests)
	}
	now := r.cfg.Now()
	raw := int64(isl(req, m))
	cachedTok := min(int64(cached), raw)
	t := &Ticket{req: req, resp: resp, enc: enc, done: done, m: m, arrival: now, pool: poolOf(m, req),
		class: ci, cost: max(1, raw-cachedTok), raw: raw, cached: cachedTok}
	// Served in deadline order, arrival + slo_ms: arrival order within a class.
	t.score = -float64(now) / 1e9
	t.high = req.StrictPriority > 0 || req.PriorityJump > 0
	q.seq++
	t.seq = q.seq
	heap.Push(&c.h, t)
	c.reqs++
	c.raw += raw
	c.cached += cachedTok
	c.n.Add(1)
	c.queued.Add(1)
	q.n.Add(1)
	q.byPool[t.pool].Add(1)
	if t.high {
		q.high.Add(1)
	}
	q.queued.Add(1)
	r.queued.Add(1)
	q.mu.Unlock()
	r.log.Debug("request waits in its policy class", "request", strings.Clone(req.RequestID), "model", m.name,
		"policy_class", c.cl.Name, "class_queued", c.n.Load(), "cost", t.cost)
	return t, nil
}

// drainClasses is drainModel for a model with policy classes: it admits the requests deficit
// round robin picks while one can go.
func (r *Router) drainClasses(m *model) {
	q := m.queue
	var ready []*Ticket
	q.mu.Lock()
	for {
		t := r.nextDRR(m)
		if t == nil {
			break
		}
		r.admit(q, t)
		ready = append(ready, t)
	}
	q.mu.Unlock()
	for _, t := range ready {
		t.done(t)
	}
}

// nextDRR takes out of its class the request deficit round robin sends next, nil if no class's
// head can go. REQUIRES m.queue.mu.
func (r *Router) nextDRR(m *model) *Ticket {
	q := m.queue
	n := len(q.classes)
	head := func(i int) int64 { // the head's cost if it can go, else -1
		c := q.classes[i]
		if len(c.h) == 0 {
			c.deficit = 0
			return -1
		}
		if r.allBusyBy(m, c.h[0].req, c.rule()) {
			return -1
		}
		return c.h[0].cost
	}
	if i := q.carry; i >= 0 {
		q.carry = -1
		if cost := head(i); cost >= 0 && cost <= q.classes[i].deficit {
			return q.popClass(i)
		}
	}
	for off := range n {
		i := (q.cursor + off) % n
		cost := head(i)
		q.costs[i] = cost
		if cost < 0 {
			continue
		}
		c := q.classes[i]
		if cost <= c.deficit {
			return q.popClass(i)
		}
		c.deficit += c.cl.Quantum
		if cost <= c.deficit {
			return q.popClass(i)
		}
	}
	// No head affordable in one round: grant every class with a head that can go the fewest
	// whole rounds that make one affordable.
	rounds := int64(-1)
	for i, cost := range q.costs {
		if cost < 0 {
			continue
		}
		c := q.classes[i]
		need := (cost - c.deficit + c.cl.Quantum - 1) / c.cl.Quantum
		if rounds < 0 || need < rounds {
			rounds = need
		}
	}
	if rounds < 0 {
		return nil
	}
	for i, cost := range q.costs {
		if cost >= 0 {
			q.classes[i].deficit += q.classes[i].cl.Quantum * rounds
		}
	}
	for off := range n {
		i := (q.cursor + off) % n
		if cost := q.costs[i]; cost >= 0 && cost <= q.classes[i].deficit {
			return q.popClass(i)
		}
	}
	return nil
}

// popClass takes class i's head out, charges it and moves the cursor. REQUIRES q.mu.
func (q *modelQueue) popClass(i int) *Ticket {
	c := q.classes[i]
	t := heap.Pop(&c.h).(*Ticket)
	c.deficit -= t.cost
	c.take(t)
	q.n.Add(-1)
	q.byPool[t.pool].Add(-1)
	if t.high {
		q.high.Add(-1)
	}
	q.cursor = (i + 1) % len(q.classes)
	if len(c.h) > 0 && c.deficit > 0 {
		q.carry = i
	}
	return t
}

// pastDeadline refuses t, taken out of its class at its deadline.
func (r *Router) pastDeadline(m *model, t *Ticket) error {
	c := m.queue.classes[t.class]
	c.expired.Add(1)
	slo := c.cl.SLO.Milliseconds()
	over := max(1, (r.cfg.Now()-t.arrival)/1e6-slo)
	r.log.Warn("request refused: past its policy class deadline", "request", strings.Clone(t.req.RequestID), "model", m.name,
		"policy_class", c.cl.Name, "slo_ms", slo)
	return &PolicyClassError{Class: c.cl.Name, Stage: "dispatch", SLOMs: slo, OverdueMs: over, err: ErrPolicyClassDeadline}
}

// ClassStats is one policy class of a model's queue, for metrics.
type ClassStats struct {
	Name string
	// Pending waits now; Queued counts the requests that waited, Limited those refused at a
	// limit, Expired those refused past the deadline.
	Pending, Queued, Limited, Expired int64
}

func (q *modelQueue) classStats() []ClassStats {
	if q.classes == nil {
		return nil
	}
	st := make([]ClassStats, len(q.classes))
	for i, c := range q.classes {
		st[i] = ClassStats{Name: c.cl.Name, Pending: c.n.Load(), Queued: c.queued.Load(), Limited: c.limited.Load(), Expired: c.expired.Load()}
	}
	return st
}
