package fleet

import (
	"container/heap"
	"math/bits"
	"slices"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// SGLangConfig is SGLang's cache_aware routing policy; a plain value.
type SGLangConfig struct {
	// CacheThreshold: a prompt goes to the worker of its longest match only when the matched
	// fraction of the prompt exceeds it (0.3).
	CacheThreshold float64
	// The load, requests in flight per worker, is imbalanced when max − min > BalanceAbs (64)
	// and max > BalanceRel × min (1.5); the request then goes to the least loaded worker.
	BalanceAbs int
	BalanceRel float64
	// SmallestTree sends a prompt whose match is at or below the threshold to the worker with
	// the smallest tree, as older releases (sgl-router) and the policy's own description say;
	// false sends it to the least loaded worker, as sgl-model-gateway's code does.
	SmallestTree bool
	// Every EvictionInterval (60 s) each worker's tree is trimmed, least recently used leaves
	// first, to MaxTreeSize: 2^26 characters, here 2^24 tokens at 4 characters per token (the
	// ratio GIE assumes).
	EvictionInterval time.Duration
	MaxTreeSize      int
}

// DefaultSGLangConfig is the cache_aware defaults of SGLang's router as launched
// (sglang_router's RouterArgs).
func DefaultSGLangConfig() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, EvictionInterval: 60 * time.Second, MaxTreeSize: 1 << 24}
}

// sglang is SGLang's cache_aware policy over its approximate tree: one radix tree of the
// prompts it routed, each node marked with the workers whose prompts passed through it. The
// router sees text, not tokens; here a token stands for a character, which leaves the match
// rate, a ratio, as it is for text of even token length.
type sglang struct {
	cfg       SGLangConfig
	root      *tnode
	size      []int // characters (tokens) in the nodes each worker is on
	epoch     int64 // SGLang's global access counter
	nextEvict int64 // simulated ns of the next eviction; 0: not started
	heap      evictHeap
}

// tnode is a node of the tree: its edge from the parent (a slice of a routed prompt, which the
// simulation keeps alive), children by first token, the workers on it with each one's last
// access (an epoch), and the worker that created it (SGLang's cached last_tenant, which the
// match returns).
type tnode struct {
	edge     []uint32
	parent   *tnode
	children map[uint32]*tnode
	workers  uint64
	access   []int64
	owner    int
}

func newSGLang(cfg SGLangConfig, workers int) *sglang {
	return &sglang{cfg: cfg, root: &tnode{children: map[uint32]*tnode{}, access: make([]int64, workers)}, size: make([]int, workers)}
}

func (s *sglang) events(int, []kvevent.Event) {}

// match returns how many leading tokens of the prompt the tree holds (for any worker) and the
// worker its deepest matched node names (-1: nothing matched). One match in eight refreshes
// that worker's access time on the node, as SGLang's does.
func (s *sglang) match(tokens []uint32) (n, worker int) {
	nd := s.root
	for n < len(tokens) {
		c := nd.children[tokens[n]]
		if c == nil {
			break
		}
		k := commonPrefix(tokens[n:], c.edge)
		n += k
		nd = c
		if k < len(c.edge) {
			break
		}
	}
	worker = -1
	if nd != s.root && nd.workers != 0 {
		worker = nd.owner
		if nd.workers&(1<<worker) == 0 {
			worker = bits.TrailingZeros64(nd.workers)
		}
	}
	s.epoch++
	if worker >= 0 && s.epoch&7 == 0 {
		nd.access[worker] = s.epoch
	}
	return n, worker
}

// insert records that the prompt went to worker w: nodes it newly passes get w with access 0,
// the node where it ends (new leaf or not) a fresh access.
func (s *sglang) insert(tokens []uint32, w int) {
	bit := uint64(1) << w
	nd := s.root
	for len(tokens) > 0 {
		c := nd.children[tokens[0]]
		if c == nil {
			s.epoch++
			leaf := &tnode{edge: tokens, parent: nd, children: map[uint32]*tnode{}, workers: bit, access: make([]int64, len(s.size)), owner: w}
			leaf.access[w] = s.epoch
			nd.children[tokens[0]] = leaf
			s.size[w] += len(tokens)
			return
		}
		k := commonPrefix(tokens, c.edge)
		if k < len(c.edge) {
			// Split c: a new node for the shared part takes c's place, with c's workers.
			mid := &tnode{edge: c.edge[:k], parent: nd, children: map[uint32]*tnode{}, workers: c.workers,
				access: slices.Clone(c.access), owner: c.owner}
			c.edge = c.edge[k:]
			c.parent = mid
			mid.children[c.edge[0]] = c
			nd.children[tokens[0]] = mid
			c = mid
		}
		if c.workers&bit == 0 {
			c.workers |= bit
			c.access[w] = 0
			s.size[w] += len(c.edge)
		}
		tokens = tokens[k:]
		nd = c
	}
	s.epoch++
	nd.access[w] = s.epoch
}

// evict trims every worker's tree to MaxTreeSize: SGLang's periodic eviction, which takes the
// least recently used leaves of each worker first (a node is a worker's leaf when none of its
// children has that worker) and lets a parent become a leaf in its turn.
func (s *sglang) evict() {
	over := false
	for _, z := range s.size {
		over = over || z > s.cfg.MaxTreeSize
	}
	if !over {
		return
	}
	s.heap = s.heap[:0]
	stack := []*tnode{s.root}
	for len(stack) > 0 {
		nd := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		var below uint64
		for _, c := range nd.children {
			stack = append(stack, c)
			below |= c.workers
		}
		if nd == s.root {
			continue
		}
		for m := nd.workers &^ below; m != 0; m &= m - 1 {
			w := bits.TrailingZeros64(m)
			s.heap = append(s.heap, evictEntry{at: nd.access[w], w: w, nd: nd})
		}
	}
	heap.Init(&s.heap)
	for s.heap.Len() > 0 {
		e := heap.Pop(&s.heap).(evictEntry)
		bit := uint64(1) << e.w
		if s.size[e.w] <= s.cfg.MaxTreeSize || e.nd.workers&bit == 0 || hasWorker(e.nd, bit) {
			continue
		}
		s.size[e.w] -= len(e.nd.edge)
		e.nd.workers &^= bit
		p := e.nd.parent
		if len(e.nd.children) == 0 && e.nd.workers == 0 {
			delete(p.children, e.nd.edge[0])
		}
		if p != s.root && p.workers&bit != 0 && !hasWorker(p, bit) {
			heap.Push(&s.heap, evictEntry{at: p.access[e.w], w: e.w, nd: p})
		}
	}
}

// hasWorker reports whether a child of nd has a worker of bit.
func hasWorker(nd *tnode, bit uint64) bool {
	for _, c := range nd.children {
		if c.workers&bit != 0 {
			return true
		}
	}
	return false
}

type evictEntry struct {
	at int64
	w  int
	nd *tnode
}

// evictHeap orders leaves by last access, oldest first.
type evictHeap []evictEntry

func (h evictHeap) Len() int           { return len(h) }
func (h evictHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h evictHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *evictHeap) Push(x any)        { *h = append(*h, x.(evictEntry)) }
func (h *evictHeap) Pop() any          { old := *h; e := old[len(old)-1]; *h = old[:len(old)-1]; return e }

func (s *sglang) pick(tokens []uint32, load *peerLoad) int {
	iv := int64(s.cfg.EvictionInterval)
	if s.nextEvict == 0 {
		s.nextEvict = load.now + iv
	}
	for iv > 0 && load.now >= s.nextEvict {
		s.evict()
		s.nextEvict += iv
	}
	w := s.decide(tokens, load.inflight)
	s.insert(tokens, w)
	return w
}

// decide is the cache_aware rule: the least loaded worker when the load is imbalanced; else the
// worker of the longest match when the matched fraction exceeds the threshold; else the least
// loaded worker (or the smallest tree).
func (s *sglang) decide(tokens []uint32, inflight []int) int {
	lo, hi, least := inflight[0], inflight[0], 0
	for i, n := range inflight {
		if n < lo {
			lo, least = n, i
		}
		hi = max(hi, n)
	}
	if hi-lo > s.cfg.BalanceAbs && float64(hi) > float64(lo)*s.cfg.BalanceRel {
		return least
	}
	n, w := s.match(tokens)
	if len(tokens) > 0 && w >= 0 && float64(n)/float64(len(tokens)) > s.cfg.CacheThreshold {
		return w
	}
	if s.cfg.SmallestTree {
		small := 0
		for i, z := range s.size {
			if z < s.size[small] {
				small = i
			}
		}
		return small
	}
	return least
}

func commonPrefix(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
