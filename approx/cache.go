package approx

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/kvrouterd/kvrouterd/internal/prefetch"
	"github.com/kvrouterd/kvrouterd/internal/u64map"
	"github.com/kvrouterd/kvrouterd/radix"
)

// Defaults of Config, Dynamo's.
const (
	DefaultTTL         = 120 * time.Second
	DefaultMaxBlocks   = 1 << 20
	DefaultPruneTarget = 0.8
)

// ErrConfig is returned by New for a configuration value out of range.
var ErrConfig = errors.New("approx: invalid config")

// Config configures a Cache. A zero field takes its default.
type Config struct {
	// TTL is how long a block stays resident after the last request routed to its worker that
	// used it.
	TTL time.Duration
	// MaxBlocks caps the residencies over all workers (a block two workers hold counts twice).
	MaxBlocks int
	// PruneTarget is the fraction of MaxBlocks that pruning leaves, in (0, 1].
	PruneTarget float64
	// LRU holds each rank to its KV capacity with an LRU (Dynamo's
	// --router-approximate-cache-policy lru) instead of TTLs; ranks whose capacity is unknown
	// keep the TTL Cache. New ignores it: the caller builds the LRU beside the Cache.
	LRU bool
}

// Residency is one block held by one worker. Depth is the block's position in the chain of the
// request that last used it: 0 for the first block.
type Residency struct {
	Worker radix.WorkerKey
	Seq    uint64
	Depth  int32
}

// Cache holds the blocks the router's own decisions have placed on each worker. It is safe for
// concurrent use; every method serializes on one mutex.
type Cache struct {
	ttl    int64
	max    int
	target int
	step   int // pruneStep; tests lower it

	mu sync.Mutex
	// nodes[0] is the sentinel of the list of residencies: its next is the least recently
	// used, its prev the most recently used. spare holds the free nodes: a stack rather than a
	// chain through the nodes, whose every pop would be a cache miss.
	nodes   []node
	spare   []int32
	n       int
	pruning bool  // the cap was passed and the target is not reached yet
	now     int64 // latest time seen
	byKey   map[radix.WorkerKey]int32
	workers []worker
	idle    []int32 // free entries of workers
	scratch []int32 // the nodes of the Record in progress
}

// node is one residency, or a free slot of the slab.
type node struct {
	seq        uint64
	last       int64 // time of last use; placing while a Record holds the node off the list
	prev, next int32
	worker     int32 // index in Cache.workers
	depth      int32
}

// pruneStep is how many residencies, beyond its own length, one Record evicts while the Cache
// prunes towards its target. Each such Record brings the Cache at least pruneStep closer to the
// target, and evicts at most 384 residencies for a 128-block request: measured, 44 µs per
// Record while pruning, 5 µs otherwise, where a whole prune at the defaults, 210,000
// residencies, takes 20 ms in one piece (BenchmarkCacheRecord, churn and oneshot).
const pruneStep = 256

// window is how many lookups ahead Record prefetches: enough misses in flight to fill the
// memory pipeline, few enough that the lines are still in cache when used.
const window = 16

// Marks in node.last while a Record holds a node off the list: creating for one it has just
// made, placing for one it has seen, so that a hash repeated within one request is placed once.
const (
	placing  = math.MinInt64
	creating = math.MinInt64 + 1
)

type worker struct {
	key  radix.WorkerKey
	m    u64map.Map // sequence hash → node
	n    int
	peak int // most residencies since m was last rebuilt
}

// A worker's map is rebuilt smaller once it holds fewer than 1/shrinkRatio of its peak, so that
// a worker that once held much of the cache does not keep a table sized for it. Below shrinkMin
// the table is kept (at most about 110 KB), so that a small worker that empties and fills again,
// as those with little traffic do all the time, does not allocate each time.
const (
	shrinkRatio = 8
	shrinkMin   = 4096
)

// New returns an empty Cache.
func New(cfg Config) (*Cache, error) {
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxBlocks == 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	if cfg.PruneTarget == 0 {
		cfg.PruneTarget = DefaultPruneTarget
	}
	switch {
	case cfg.TTL < 0:
		return nil, fmt.Errorf("%w: TTL %v is negative", ErrConfig, cfg.TTL)
	case cfg.MaxBlocks < 0 || cfg.MaxBlocks > math.MaxInt32/2:
		return nil, fmt.Errorf("%w: MaxBlocks %d is not in [1, %d]", ErrConfig, cfg.MaxBlocks, math.MaxInt32/2)
	case !(cfg.PruneTarget > 0 && cfg.PruneTarget <= 1):
		return nil, fmt.Errorf("%w: PruneTarget %v is not in (0, 1]", ErrConfig, cfg.PruneTarget)
	}
	return &Cache{
		ttl:    int64(cfg.TTL),
		max:    cfg.MaxBlocks,
		target: int(float64(cfg.MaxBlocks) * cfg.PruneTarget),
		step:   pruneStep,
		nodes:  make([]node, 1),
		now:    math.MinInt64,
		byKey:  make(map[radix.WorkerKey]int32),
	}, nil
}

// Len returns the number of residencies over all workers.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// NextExpiry returns when the least recently used residency expires, for the caller's timer;
// ok is false when the Cache is empty.
func (c *Cache) NextExpiry() (at int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return 0, false
	}
	return c.nodes[c.nodes[0].next].last + c.ttl, true
}

// Record notes that the request whose full-block sequence hashes are seqs (seqs[0] the first
// block, each extending the one before) was routed to w at time now: every block of seqs is
// held by w, used at now. It appends to added the residencies it creates, root first, and to
// evicted those that pruning removed, each block before its parent, and returns both. The
// caller applies added before evicted: a Record longer than the prune target evicts blocks it
// has just added.
func (c *Cache) Record(w radix.WorkerKey, seqs []uint64, now int64, added, evicted []Residency) ([]Residency, []Residency) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now = c.advance(now)
	if len(seqs) == 0 {
		return added, evicted
	}
	wi := c.workerLocked(w)
	wk := &c.workers[wi]
	// Pass 1, root to leaf: find or create each node. The map's slots, a window ahead, and the
	// held nodes are prefetched, so that their misses overlap instead of following one another.
	wk.m.Prefetch(seqs[:min(window, len(seqs))])
	sc := c.scratch[:0]
	var ps [window]unsafe.Pointer
	np, fresh := 0, 0
	for i, s := range seqs {
		if i%window == 0 && i+window < len(seqs) {
			wk.m.Prefetch(seqs[i+window : min(i+2*window, len(seqs))])
		}
		if v, ok := wk.m.Get(s); ok {
			x := int32(v)
			sc = append(sc, x)
			ps[np] = unsafe.Pointer(&c.nodes[x])
			if np++; np == len(ps) {
				prefetch.Lines(ps[:])
				np = 0
			}
			continue
		}
		x := c.alloc()
		c.nodes[x] = node{seq: s, last: creating, worker: wi, depth: int32(i)}
		wk.m.Put(s, uint64(x))
		sc = append(sc, x)
		added = append(added, Residency{Worker: w, Seq: s, Depth: int32(i)})
		fresh++
	}
	prefetch.Lines(ps[:np])
	// Pass 2, root to leaf: take the held nodes off the list; keep a repeated hash at its
	// first position only.
	k := 0
	for i, x := range sc {
		nd := &c.nodes[x]
		switch nd.last {
		case placing:
			continue
		case creating:
		default:
			c.unlink(x)
			nd.depth = int32(i)
		}
		nd.last = placing
		sc[k] = x
		k++
	}
	// Pass 3, leaf to root: the root ends most recently used.
	for j := k - 1; j >= 0; j-- {
		c.nodes[sc[j]].last = now
		c.pushNewest(sc[j])
	}
	c.scratch = sc
	wk.n += fresh
	wk.peak = max(wk.peak, wk.n)
	c.n += fresh
	// Prune: down to the cap at once, then on towards the target at most step residencies per
	// Record, so that no Record pays for a whole prune.
	if c.n > c.max {
		c.pruning = true
	}
	if c.pruning {
		k := max(c.n-c.max, min(c.n-c.target, len(seqs)+c.step))
		evicted = c.evictOldest(k, math.MaxInt64, evicted)
		c.pruning = c.n > c.target
	}
	return added, evicted
}

// Expire removes every residency whose TTL has run out at now (its last use + TTL ≤ now),
// appends them to dst oldest first, each block before its parent, and returns dst. Its work is
// proportional to what it removes: a caller that runs it every second or so keeps each call
// short.
func (c *Cache) Expire(now int64, dst []Residency) []Residency {
	c.mu.Lock()
	defer c.mu.Unlock()
	now = c.advance(now)
	until := now - c.ttl
	if until > now {
		return dst // now is within TTL of the clock's origin: nothing can have expired
	}
	dst = c.evictOldest(c.n, until, dst)
	c.pruning = c.pruning && c.n > c.target
	return dst
}

// RemoveWorker forgets w: it appends w's residencies to dst deepest first and returns dst.
func (c *Cache) RemoveWorker(w radix.WorkerKey, dst []Residency) []Residency {
	c.mu.Lock()
	defer c.mu.Unlock()
	wi, ok := c.byKey[w]
	if !ok {
		return dst
	}
	wk := &c.workers[wi]
	base := len(dst)
	wk.m.Each(func(seq, v uint64) {
		x := int32(v)
		dst = append(dst, Residency{Worker: w, Seq: seq, Depth: c.nodes[x].depth})
		c.unlink(x)
		c.release(x)
	})
	slices.SortFunc(dst[base:], func(a, b Residency) int {
		return cmp.Or(cmp.Compare(b.Depth, a.Depth), cmp.Compare(a.Seq, b.Seq))
	})
	c.n -= wk.n
	wk.m.Reset()
	*wk = worker{m: wk.m}
	delete(c.byKey, w)
	c.idle = append(c.idle, wi)
	c.pruning = c.pruning && c.n > c.target
	return dst
}

// advance returns now, or the latest time seen if that is later. REQUIRES c.mu.
func (c *Cache) advance(now int64) int64 {
	if now < c.now {
		return c.now
	}
	c.now = now
	return now
}

// workerLocked returns the index of w's entry, creating it. REQUIRES c.mu.
func (c *Cache) workerLocked(w radix.WorkerKey) int32 {
	if wi, ok := c.byKey[w]; ok {
		return wi
	}
	var wi int32
	if k := len(c.idle); k > 0 {
		wi = c.idle[k-1]
		c.idle = c.idle[:k-1]
	} else {
		wi = int32(len(c.workers))
		c.workers = append(c.workers, worker{})
	}
	c.workers[wi].key = w
	c.byKey[w] = wi
	return wi
}

// evictOldest removes up to k residencies from the least recently used end of the list, none
// used after until, appends them to dst and returns dst. REQUIRES c.mu.
func (c *Cache) evictOldest(k int, until int64, dst []Residency) []Residency {
	// In batches: walk the list to find the nodes (each address comes from the one before),
	// prefetching their map slots, then delete them, by when the slots have arrived.
	var batch [32]int32
	for k > 0 {
		nb := 0
		for x := c.nodes[0].next; x != 0 && nb < min(k, len(batch)); x = c.nodes[x].next {
			nd := &c.nodes[x]
			if nd.last > until {
				break
			}
			c.workers[nd.worker].m.Prefetch(unsafe.Slice(&nd.seq, 1))
			batch[nb] = x
			nb++
		}
		if nb == 0 {
			break
		}
		for _, x := range batch[:nb] {
			dst = c.evict(x, dst)
		}
		k -= nb
	}
	return dst
}

// evict removes the residency in node x, appends it to dst and returns dst. REQUIRES c.mu.
func (c *Cache) evict(x int32, dst []Residency) []Residency {
	nd := c.nodes[x]
	wk := &c.workers[nd.worker]
	dst = append(dst, Residency{Worker: wk.key, Seq: nd.seq, Depth: nd.depth})
	c.unlink(x)
	c.release(x)
	wk.m.Del(nd.seq)
	wk.n--
	c.n--
	if wk.peak >= shrinkMin && wk.n < wk.peak/shrinkRatio {
		var m u64map.Map
		wk.m.Each(func(k, v uint64) { m.Put(k, v) })
		wk.m, wk.peak = m, wk.n
	}
	return dst
}

// alloc returns a free node, off the list. REQUIRES c.mu.
func (c *Cache) alloc() int32 {
	if k := len(c.spare); k > 0 {
		x := c.spare[k-1]
		c.spare = c.spare[:k-1]
		return x
	}
	c.nodes = append(c.nodes, node{})
	return int32(len(c.nodes) - 1)
}

// release makes node x, already off the list, free. REQUIRES c.mu.
func (c *Cache) release(x int32) {
	c.nodes[x] = node{worker: -1}
	c.spare = append(c.spare, x)
}

// unlink takes node x off the list. REQUIRES c.mu.
func (c *Cache) unlink(x int32) {
	nd := &c.nodes[x]
	c.nodes[nd.prev].next = nd.next
	c.nodes[nd.next].prev = nd.prev
}

// pushNewest puts node x at the most recently used end of the list. REQUIRES c.mu.
func (c *Cache) pushNewest(x int32) {
	last := c.nodes[0].prev
	c.nodes[x].prev, c.nodes[x].next = last, 0
	c.nodes[last].next = x
	c.nodes[0].prev = x
}
