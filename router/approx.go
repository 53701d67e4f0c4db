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
	// lru, under Dynamo's lru policy, holds the ranks whose KV capacity is known; the leases of
	// their requests are released by Complete, PrefillDone and expiry.
	lru            *approx.LRU
	ladded, levict []uint64
}

// recordApprox notes a routed request's blocks as cached on w, as if its engine had reported
// them, and applies what the cache added and evicted to the index. key is the booking that
// holds the blocks under the lru policy until it is released (empty: none).
func (r *Router) recordApprox(m *model, w *rankWorker, seqs []uint64, key string) {
	a := r.approx
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lru != nil {
		var ok bool
		now := r.cfg.Now()
		a.ladded, a.levict, ok = a.lru.Acquire(w.key, w.reg.capacity.Load(), key, seqs,
			now+int64(r.cfg.RequestExpiry), a.ladded[:0], a.levict[:0])
		if ok {
			for _, seq := range a.ladded {
				m.ix.Add(seq, w.slot)
			}
			for _, seq := range a.levict {
				m.ix.Remove(seq, w.slot)
			}
			return
		}
	}
	a.added, a.evicted = a.c.Record(w.key, seqs, r.cfg.Now(), a.added[:0], a.evicted[:0])
	for _, x := range a.added {
		m.ix.Add(x.Seq, w.slot)
	}
	r.removeApproxLocked(a.evicted)
}

// expireApprox drops the blocks whose TTL ran out and returns how many; under the lru policy
// it also releases the leases of requests past their expiry.
func (r *Router) expireApprox() int {
	a := r.approx
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lru != nil {
		a.lru.ExpireLeases(r.cfg.Now(), r.removeLRULocked)
	}
	a.evicted = a.c.Expire(r.cfg.Now(), a.evicted[:0])
	r.removeApproxLocked(a.evicted)
	return len(a.evicted)
}

// releaseApprox releases the lru lease of booking key, if any, and removes from the index what
// its rank evicts then (it may have been over its capacity while leases held its blocks).
func (r *Router) releaseApprox(key string) {
	a := r.approx
	if a == nil || a.lru == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var w radix.WorkerKey
	a.levict, w = a.lru.Release(key, a.levict[:0])
	if len(a.levict) > 0 {
		r.removeLRULocked(w, a.levict)
	}
}

// removeLRULocked removes w's evicted hashes from the index. REQUIRES r.approx.mu.
func (r *Router) removeLRULocked(w radix.WorkerKey, evicted []uint64) {
	ix, slot, ok := r.slotOf(w)
	if !ok {
		return
	}
	for _, seq := range evicted {
		ix.Remove(seq, slot)
	}
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
	if a.lru != nil {
		a.levict = a.lru.RemoveWorker(w.key, a.levict[:0])
		for _, seq := range a.levict {
			ix.Remove(seq, w.slot)
		}
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
