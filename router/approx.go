package router

import (
	"sync"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/radix"
)

// approxMode is the approximate mode's state: the cache of the router's own decisions, and the
// lock that keeps the index's changes in the cache's order (two routes to one worker could
// otherwise add and evict the same block in the opposite order).
type approxMode struct {
	mu             sync.Mutex
	c              *approx.Cache
	added, evicted []approx.Residency
}

// recordApprox notes a routed request's blocks as cached on w, as if its engine had reported
// them, and applies what the cache added and evicted to the index.
func (r *Router) recordApprox(m *model, w *rankWorker, seqs []uint64) {
	a := r.approx
	a.mu.Lock()
	defer a.mu.Unlock()
	a.added, a.evicted = a.c.Record(w.key, seqs, r.cfg.Now(), a.added[:0], a.evicted[:0])
	for _, x := range a.added {
		m.ix.Add(x.Seq, w.slot)
	}
	r.removeApproxLocked(a.evicted)
}

// expireApprox drops the blocks whose TTL ran out and returns how many.
func (r *Router) expireApprox() int {
	a := r.approx
	a.mu.Lock()
	defer a.mu.Unlock()
	a.evicted = a.c.Expire(r.cfg.Now(), a.evicted[:0])
	r.removeApproxLocked(a.evicted)
	return len(a.evicted)
}

// forgetApprox drops w's blocks of approximate mode (w may be unregistered already).
func (r *Router) forgetApprox(ix *radix.Index, w *rankWorker) {
	a := r.approx
	a.mu.Lock()
	defer a.mu.Unlock()
	a.evicted = a.c.RemoveWorker(w.key, a.evicted[:0])
	for _, x := range a.evicted {
		ix.Remove(x.Seq, w.slot)
	}
}

// removeApproxLocked removes residencies from the index. REQUIRES r.approx.mu.
func (r *Router) removeApproxLocked(rs []approx.Residency) {
	var (
		last radix.WorkerKey
		ix   *radix.Index
		slot radix.Slot
		ok   bool
	)
	for i, x := range rs {
		if i == 0 || x.Worker != last {
			last = x.Worker
			ix, slot, ok = r.slotOf(x.Worker)
		}
		if ok {
			ix.Remove(x.Seq, slot)
		}
	}
}

// slotOf returns the index and slot of worker k.
func (r *Router) slotOf(k radix.WorkerKey) (*radix.Index, radix.Slot, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg := r.workers[k.ID]
	if reg == nil {
		return nil, 0, false
	}
	for _, w := range reg.ranks {
		if w.key == k {
			return reg.model.ix, w.slot, true
		}
	}
	return nil, 0, false
}
