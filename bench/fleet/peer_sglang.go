package fleet

import (
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
	// MaxTreeSize is each worker's tree size, in characters (here: tokens), past which the
	// periodic eviction trims it (2^26). The simulated traces never reach it, so eviction is
	// not modelled: pick panics if a tree outgrows it.
	MaxTreeSize int
}

// DefaultSGLangConfig is sgl-model-gateway's cache_aware defaults.
func DefaultSGLangConfig() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, MaxTreeSize: 1 << 26}
}

// sglang is SGLang's cache_aware policy over its approximate tree: one radix tree of the
// prompts it routed, each node marked with the workers whose prompts passed through it. The
// router sees text, not tokens; here a token stands for a character, which leaves the match
// rate, a ratio, as it is for text of even token length.
type sglang struct {
	cfg  SGLangConfig
	root *tnode
	size []int // characters (tokens) in the nodes each worker is on
}

// tnode is a node of the tree: its edge from the parent (a slice of a routed prompt, which the
// simulation keeps alive), children by first token, the workers on it, and the worker that
// created it (SGLang's cached last_tenant, which the match returns).
type tnode struct {
	edge     []uint32
	children map[uint32]*tnode
	workers  uint64
	owner    int
}

func newSGLang(cfg SGLangConfig, workers int) *sglang {
	return &sglang{cfg: cfg, root: &tnode{children: map[uint32]*tnode{}}, size: make([]int, workers)}
}

func (s *sglang) events(int, []kvevent.Event) {}

// match returns how many leading tokens of the prompt the tree holds (for any worker) and the
// worker its deepest matched node names (-1: nothing matched).
func (s *sglang) match(tokens []uint32) (n, worker int) {
	nd, worker := s.root, -1
	for n < len(tokens) {
		c := nd.children[tokens[n]]
		if c == nil {
			break
		}
		k := commonPrefix(tokens[n:], c.edge)
		n += k
		if c.workers != 0 {
			worker = c.owner
			if c.workers&(1<<c.owner) == 0 {
				worker = lowestBit(c.workers)
			}
		}
		if k < len(c.edge) {
			break
		}
		nd = c
	}
	return n, worker
}

// insert records that the prompt went to worker w.
func (s *sglang) insert(tokens []uint32, w int) {
	bit := uint64(1) << w
	nd := s.root
	for len(tokens) > 0 {
		c := nd.children[tokens[0]]
		if c == nil {
			nd.children[tokens[0]] = &tnode{edge: tokens, children: map[uint32]*tnode{}, workers: bit, owner: w}
			s.size[w] += len(tokens)
			return
		}
		k := commonPrefix(tokens, c.edge)
		if k < len(c.edge) {
			// Split c: a new node for the shared part takes c's place, with c's workers.
			mid := &tnode{edge: c.edge[:k], children: map[uint32]*tnode{}, workers: c.workers, owner: c.owner}
			c.edge = c.edge[k:]
			mid.children[c.edge[0]] = c
			nd.children[tokens[0]] = mid
			c = mid
		}
		if c.workers&bit == 0 {
			c.workers |= bit
			s.size[w] += len(c.edge)
		}
		tokens = tokens[k:]
		nd = c
	}
}

func (s *sglang) pick(tokens []uint32, load *peerLoad) int {
	w := s.decide(tokens, load.inflight)
	s.insert(tokens, w)
	if s.size[w] > s.cfg.MaxTreeSize {
		panic("fleet: sglang: a tree outgrew max_tree_size; its eviction is not modelled")
	}
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

func lowestBit(x uint64) int {
	for i := range 64 {
		if x&(1<<i) != 0 {
			return i
		}
	}
	return -1
}
