package router

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/radix"
)

// predicted is predict-on-route for one model (Config.PredictedTTL): every routing decision's
// blocks, held for a short TTL as if the chosen worker had already reported them, in a side
// index of their own. A worker's engine reports its new blocks some time after the request
// reached it (a prefill's length, plus the event path); until then, requests sharing the
// prefix would see no worker holding it and scatter. A match takes, per worker, the larger of
// the event-fed depth and the predicted one (merge). The event-fed index, and so every
// snapshot, never holds a predicted entry.
//
// A predicted is safe for concurrent use: record, expire and forget serialize on mu (which
// keeps the side index's changes in the cache's order, as approxMode does); merge reads the
// side index lock-free and takes mu only when the oldest prediction is due to expire.
type predicted struct {
	ix *radix.Index // the predictions: its slots are its own, mapped to the model's by worker key

	mu             sync.Mutex
	c              *approx.Cache
	added, evicted []approx.Residency // REQUIRES mu

	// next is when the oldest prediction expires (math.MaxInt64 while there is none), for
	// merge's lock-free check.
	next atomic.Int64
}

// newPredicted returns the side index of a model of block size bs, or nil when
// predict-on-route is off.
func (r *Router) newPredicted(bs int) *predicted {
	if r.cfg.PredictedTTL <= 0 {
		return nil
	}
	ix, err := radix.New(radix.Config{BlockSize: bs})
	if err != nil {
		return nil // bs was checked by the model's own index
	}
	c, err := approx.New(approx.Config{TTL: r.cfg.PredictedTTL})
	if err != nil {
		panic("router: Config.PredictedTTL: " + err.Error()) // Config.check refused it already
	}
	p := &predicted{ix: ix, c: c}
	p.next.Store(math.MaxInt64)
	return p
}

// record notes that the request whose sequence hashes are seqs was routed to worker k at now.
func (p *predicted) record(k radix.WorkerKey, seqs []uint64, now int64) {
	if len(seqs) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.added, p.evicted = p.c.Record(k, seqs, now, p.added[:0], p.evicted[:0])
	if len(p.added) > 0 {
		slot, ok := p.ix.Lookup(k)
		if !ok {
			var err error
			if slot, err = p.ix.Acquire(k); err != nil {
				// More worker ranks than an index can hold: the model's own index refused
				// them first. Forget what was recorded rather than keep it unindexed.
				p.evicted = p.c.RemoveWorker(k, p.evicted[:0])
				p.updateNextLocked()
				return
			}
		}
		for _, x := range p.added {
			p.ix.Add(x.Seq, slot)
		}
	}
	p.removeLocked(p.evicted)
	p.updateNextLocked()
}

// expire drops the predictions whose TTL ran out at now and returns how many.
func (p *predicted) expire(now int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.evicted = p.c.Expire(now, p.evicted[:0])
	p.removeLocked(p.evicted)
	p.updateNextLocked()
	return len(p.evicted)
}

// forget drops worker k's predictions and its slot (k may be unregistered already).
func (p *predicted) forget(k radix.WorkerKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.evicted = p.c.RemoveWorker(k, p.evicted[:0])
	p.removeLocked(p.evicted)
	if slot, ok := p.ix.Lookup(k); ok {
		_ = p.ix.Release(slot) // cannot fail: its every block was just removed
	}
	p.updateNextLocked()
}

// removeLocked removes residencies from the side index. REQUIRES p.mu.
func (p *predicted) removeLocked(rs []approx.Residency) {
	var (
		last radix.WorkerKey
		slot radix.Slot
		ok   bool
	)
	for i, x := range rs {
		if i == 0 || x.Worker != last {
			last = x.Worker
			slot, ok = p.ix.Lookup(x.Worker)
		}
		if ok {
			p.ix.Remove(x.Seq, slot)
		}
	}
}

// updateNextLocked publishes when the oldest prediction expires. REQUIRES p.mu.
func (p *predicted) updateNextLocked() {
	at, ok := p.c.NextExpiry()
	if !ok {
		at = math.MaxInt64
	}
	p.next.Store(at)
}

// len returns how many predictions are held ((block, worker) pairs).
func (p *predicted) len() int { return p.c.Len() }

// merge raises the depths of s.m, the model's event-fed match of s.seqs, to the predicted
// depths: per worker rank of list, the larger of the two; a worker with only a predicted match
// joins s.m at its place in slot order. It reports whether any depth grew. Predictions due to
// expire at now are dropped first, so that a match never sees one past its TTL.
func (p *predicted) merge(s *scratch, list *workerList, now int64) bool {
	if now >= p.next.Load() {
		p.expire(now)
	}
	if p.next.Load() == math.MaxInt64 {
		return false // none held
	}
	p.ix.Match(s.seqs, &s.pm)
	raised := false
	for i, ps := range s.pm.Slots {
		k, ok := p.ix.Worker(ps)
		if !ok {
			continue
		}
		pos, ok := slices.BinarySearchFunc(list.keys, k, compareKeys)
		if !ok {
			continue // left the model since
		}
		slot, d := list.slots[pos], s.pm.Depth[i]
		j, found := slices.BinarySearch(s.m.Slots, slot)
		switch {
		case found && d > s.m.Depth[j]:
			s.m.Depth[j] = d
			raised = true
		case !found:
			s.m.Slots = slices.Insert(s.m.Slots, j, slot)
			s.m.Depth = slices.Insert(s.m.Depth, j, d)
			raised = true
		}
	}
	return raised
}

// placed notes that w of m will compute (or receive) the blocks seqs of a request booked on it:
// approximate mode counts them as cached there, predict-on-route predicts them.
func (r *Router) placed(m *model, w *rankWorker, seqs []uint64) { r.placedFor(m, w, seqs, "") }

// placedFor is placed for the booking key, whose release (Complete, PrefillDone, expiry) lets
// go of the blocks under approximate mode's lru policy; an empty key holds them for no request.
func (r *Router) placedFor(m *model, w *rankWorker, seqs []uint64, key string) {
	if r.approx != nil {
		r.recordApprox(m, w, seqs, key)
	}
	if m.pred != nil {
		m.pred.record(w.key, seqs, r.cfg.Now())
	}
}

// expirePredicted drops every model's predictions whose TTL ran out and returns how many. The
// Router calls it periodically, so that predictions no request matches go away too; a match
// drops those due first (merge), so that none is seen past its TTL between the calls.
func (r *Router) expirePredicted() int {
	if r.cfg.PredictedTTL <= 0 {
		return 0
	}
	n, now := 0, r.cfg.Now()
	for _, m := range *r.models.Load() {
		if m.pred != nil {
			n += m.pred.expire(now)
		}
	}
	return n
}

// predictions returns how many predictions every model holds.
func (r *Router) predictions() int64 {
	if r.cfg.PredictedTTL <= 0 {
		return 0
	}
	n := 0
	for _, m := range *r.models.Load() {
		if m.pred != nil {
			n += m.pred.len()
		}
	}
	return int64(n)
}

// compareKeys orders worker keys as workerList.keys is: by id, then rank.
func compareKeys(a, b radix.WorkerKey) int {
	return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Rank, b.Rank))
}
