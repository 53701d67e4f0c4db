package approx

import (
	"container/heap"
	"math"
	"strings"
	"sync"

	"github.com/kvrouterd/kvrouterd/radix"
)

// LRU is approximate mode's capacity policy (Dynamo's --router-approximate-cache-policy lru): each
// (worker, rank) holds at most its KV capacity in blocks, as its engine would. A routed request
// takes a lease on its blocks on the chosen rank: the blocks it finds there (its cached prefix,
// up to the first it does not) are shared, the rest are new copies. A block stays active while a
// lease holds it; when the last lease lets go it becomes inactive, and only inactive blocks are
// evicted: while a rank holds more blocks than its capacity, the one last used longest ago goes
// first, among those last used by the same lease the deepest first. A hash whose last copy goes
// is reported as evicted, for the caller to remove from its index. There is no TTL: a block stays
// until capacity pressure evicts it.
//
// A rank whose capacity is unknown (0) when it is first seen falls back to the TTL Cache for as
// long as it is known, as Dynamo's does: Acquire reports it and records nothing.
//
// An LRU is safe for concurrent use: every method takes one mutex. The caller applies the
// reported hashes to its index in the order the calls returned them.
type LRU struct {
	mu     sync.Mutex
	epoch  uint64
	ranks  map[radix.WorkerKey]*lruRank
	leases map[string]lruLease
}

// lruRank is one rank's blocks. Copies live in a slab addressed by int32; byHash points at the
// first copy of a hash, the others follow through copy.next.
type lruRank struct {
	capacity int
	fallback bool // capacity unknown when first seen: the TTL Cache serves it
	copies   []lruCopy
	free     []int32
	live     int
	byHash   map[uint64]int32
	inactive lruHeap
}

type lruCopy struct {
	seq   uint64
	epoch uint64 // last acquired; 0 marks a free slot
	refs  int32
	pos   int32 // position in the chain of the lease that last acquired it
	next  int32 // next copy of the same hash, -1 for none
	gen   uint32
}

// lruLease is what one request holds on one rank.
type lruLease struct {
	rank     *lruRank
	worker   radix.WorkerKey
	copies   []int32
	deadline int64
}

// lruEntry is an inactive copy in the heap; entries whose copy was reacquired, freed or
// reinserted since (gen or epoch differ, or refs > 0) are skipped when popped.
type lruEntry struct {
	epoch uint64
	pos   int32
	idx   int32
	gen   uint32
}

type lruHeap []lruEntry

func (h lruHeap) Len() int { return len(h) }
func (h lruHeap) Less(i, j int) bool {
	if h[i].epoch != h[j].epoch {
		return h[i].epoch < h[j].epoch
	}
	if h[i].pos != h[j].pos {
		return h[i].pos > h[j].pos // deeper first
	}
	return h[i].idx < h[j].idx
}
func (h lruHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *lruHeap) Push(x any)   { *h = append(*h, x.(lruEntry)) }
func (h *lruHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// NewLRU returns an empty LRU.
func NewLRU() *LRU {
	return &LRU{ranks: make(map[radix.WorkerKey]*lruRank), leases: make(map[string]lruLease)}
}

// Acquire records that the request whose lease key is key (empty: a lease released at once) is
// routed to w, whose KV capacity is capacity blocks, with the full-block sequence hashes seqs. It
// appends to added the hashes w did not hold before and to evicted those w no longer holds, and
// returns them with ok; ok is false, and nothing is recorded, if w is served by the TTL Cache (its
// capacity unknown when first seen). A key already held releases its earlier lease first.
// deadline (nanoseconds) is when ExpireLeases may release the lease of a request never completed.
func (c *LRU) Acquire(w radix.WorkerKey, capacity int64, key string, seqs []uint64, deadline int64, added, evicted []uint64) ([]uint64, []uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.ranks[w]
	if r == nil {
		r = &lruRank{byHash: make(map[uint64]int32), fallback: capacity <= 0}
		c.ranks[w] = r
	}
	if r.fallback {
		return added, evicted, false
	}
	r.capacity = int(min(capacity, math.MaxInt32))
	if key != "" {
		if old, ok := c.leases[key]; ok {
			delete(c.leases, key)
			evicted = c.releaseLocked(old, evicted)
		}
	}
	c.epoch++
	epoch := c.epoch
	l := lruLease{rank: r, worker: w, deadline: deadline}
	if key != "" {
		l.copies = make([]int32, 0, len(seqs))
	}
	hit := true
	for pos, seq := range seqs {
		x := int32(-1)
		if hit {
			if first, ok := r.byHash[seq]; ok {
				x = first
			}
		}
		if x >= 0 {
			cp := &r.copies[x]
			cp.refs++
			cp.epoch = max(cp.epoch, epoch)
			cp.pos = int32(pos)
		} else {
			hit = false
			x = r.alloc()
			first, held := r.byHash[seq]
			next := int32(-1)
			if held {
				next = first
			} else {
				added = append(added, seq)
			}
			r.copies[x] = lruCopy{seq: seq, epoch: epoch, refs: 1, pos: int32(pos), next: next, gen: r.copies[x].gen}
			r.byHash[seq] = x
		}
		if key != "" {
			l.copies = append(l.copies, x)
		} else {
			r.unref(x)
		}
	}
	if key != "" {
		c.leases[strings.Clone(key)] = l // key may be a view of the caller's buffer
	}
	return added, r.reconcile(w, evicted), true
}

// Release lets go of the lease key, if held, and appends to evicted the hashes its rank no
// longer holds: the rank may be over its capacity while leases held its blocks.
func (c *LRU) Release(key string, evicted []uint64) ([]uint64, radix.WorkerKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.leases[key]
	if !ok {
		return evicted, radix.WorkerKey{}
	}
	delete(c.leases, key)
	return c.releaseLocked(l, evicted), l.worker
}

// ExpireLeases releases the leases whose deadline is before now, calling f with each one's
// worker and the hashes it no longer holds.
func (c *LRU) ExpireLeases(now int64, f func(w radix.WorkerKey, evicted []uint64)) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	var ev []uint64
	for key, l := range c.leases {
		if l.deadline >= now {
			continue
		}
		delete(c.leases, key)
		ev = c.releaseLocked(l, ev[:0])
		if len(ev) > 0 {
			f(l.worker, ev)
		}
		n++
	}
	return n
}

// RemoveWorker forgets rank w and its leases, appending the hashes it held to dst.
func (c *LRU) RemoveWorker(w radix.WorkerKey, dst []uint64) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.ranks[w]
	if r == nil {
		return dst
	}
	delete(c.ranks, w)
	for seq := range r.byHash {
		dst = append(dst, seq)
	}
	for key, l := range c.leases {
		if l.rank == r {
			delete(c.leases, key)
		}
	}
	return dst
}

// Resident returns the blocks rank w holds (copies, a hash held twice counting twice) and
// whether the LRU serves it.
func (c *LRU) Resident(w radix.WorkerKey) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.ranks[w]
	if r == nil || r.fallback {
		return 0, false
	}
	return r.live, true
}

// Leases returns how many leases are held.
func (c *LRU) Leases() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.leases)
}

// releaseLocked drops lease l's references and reconciles its rank. REQUIRES c.mu.
func (c *LRU) releaseLocked(l lruLease, evicted []uint64) []uint64 {
	if c.ranks[l.worker] != l.rank {
		return evicted // the rank was removed since
	}
	for _, x := range l.copies {
		l.rank.unref(x)
	}
	return l.rank.reconcile(l.worker, evicted)
}

// unref drops one reference of copy x; the last makes it inactive.
func (r *lruRank) unref(x int32) {
	cp := &r.copies[x]
	if cp.epoch == 0 || cp.refs == 0 {
		return
	}
	cp.refs--
	if cp.refs == 0 {
		heap.Push(&r.inactive, lruEntry{epoch: cp.epoch, pos: cp.pos, idx: x, gen: cp.gen})
	}
}

// reconcile evicts inactive copies, least recently used first, while the rank holds more than
// its capacity, appending each hash whose last copy goes to evicted.
func (r *lruRank) reconcile(w radix.WorkerKey, evicted []uint64) []uint64 {
	for r.live > r.capacity && len(r.inactive) > 0 {
		e := heap.Pop(&r.inactive).(lruEntry)
		cp := &r.copies[e.idx]
		if cp.epoch != e.epoch || cp.gen != e.gen || cp.refs != 0 || cp.pos != e.pos {
			continue // reacquired, or reinserted with a newer entry
		}
		if r.unlink(e.idx) {
			evicted = append(evicted, cp.seq)
		}
		r.freeCopy(e.idx)
	}
	if len(r.inactive) > 2*r.live+64 {
		r.compact()
	}
	return evicted
}

// unlink takes copy x off its hash's chain and reports whether it was the last copy.
func (r *lruRank) unlink(x int32) bool {
	seq := r.copies[x].seq
	first := r.byHash[seq]
	if first == x {
		if nx := r.copies[x].next; nx >= 0 {
			r.byHash[seq] = nx
			return false
		}
		delete(r.byHash, seq)
		return true
	}
	for p := first; p >= 0; p = r.copies[p].next {
		if r.copies[p].next == x {
			r.copies[p].next = r.copies[x].next
			break
		}
	}
	return false
}

func (r *lruRank) alloc() int32 {
	r.live++
	if n := len(r.free); n > 0 {
		x := r.free[n-1]
		r.free = r.free[:n-1]
		return x
	}
	r.copies = append(r.copies, lruCopy{})
	return int32(len(r.copies) - 1)
}

func (r *lruRank) freeCopy(x int32) {
	r.live--
	r.copies[x] = lruCopy{gen: r.copies[x].gen + 1}
	r.free = append(r.free, x)
}

// compact drops the heap's stale entries.
func (r *lruRank) compact() {
	h := r.inactive[:0]
	for _, e := range r.inactive {
		cp := &r.copies[e.idx]
		if cp.epoch == e.epoch && cp.gen == e.gen && cp.refs == 0 && cp.pos == e.pos {
			h = append(h, e)
		}
	}
	r.inactive = h
	heap.Init(&r.inactive)
}
