package fleet

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/kvevent"
)

func seq(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

func cat(parts ...[]uint32) []uint32 {
	var t []uint32
	for _, p := range parts {
		t = append(t, p...)
	}
	return t
}

// TestGIEPick: GIE's default profile, 3 workers, blocks of 4 tokens. Worker 0 was sent a prompt
// sharing the first 8 tokens of a 10-token prompt, whose hashes are 2 full chunks and the
// partial tail: worker 0 matches 2 of 3, the others 0.
func TestGIEPick(t *testing.T) {
	prompt := cat(seq(1, 8), seq(100, 2))
	f := func(name string, m []Metrics, want int) {
		t.Helper()
		g := newGIE(DefaultGIEConfig(4, 1024), 3, rand.New(rand.NewPCG(1, 2)))
		g.record(chunkHashes(nil, cat(seq(1, 8), seq(200, 5)), 4, 256), 0)
		if got := g.pick(prompt, &peerLoad{metrics: m, inflight: make([]int, 3)}); got != want {
			t.Errorf("%s: picked %d, want %d (scores %v)", name, got, want, g.scores)
		}
		if g.match[0] != 2 || g.match[1] != 0 {
			t.Errorf("%s: matches %v, want [2 0 0]", name, g.match)
		}
	}
	// score = 3·match/3 + 2·(max−waiting)/(max−min) + 2·(1−usage); waiting 4, 0, 2:
	// w0 = 3·2/3 + 2·0 + 2·0.1 = 2.2; w1 = 0 + 2·1 + 2·0.8 = 3.6; w2 = 0 + 2·0.5 + 2·0.5 = 2.0.
	f("busy holder", []Metrics{{4, 0.9}, {0, 0.2}, {2, 0.5}}, 1)
	// waiting 1, 0, 2: w0 = 2 + 2·0.5 + 2·0.7 = 4.4; w1 = 0 + 2·1 + 2·0.8 = 3.6; w2 = 0 + 0 + 2·0.5 = 1.0.
	f("idle holder", []Metrics{{1, 0.3}, {0, 0.2}, {2, 0.5}}, 0)
	// Equal queues score 1 each: w0 = 2 + 2 + 2·0.1 = 4.2; w1 = 0 + 2 + 2·0.9 = 3.8; w2 = 0 + 2 + 2·0.95 = 3.9.
	f("equal queues", []Metrics{{3, 0.9}, {3, 0.1}, {3, 0.05}}, 0)
}

// TestGIELRU: a worker's LRU holds LRUCapacity hashes; the oldest leaves it, and the match.
func TestGIELRU(t *testing.T) {
	g := newGIE(GIEConfig{PrefixWeight: 3, QueueWeight: 2, KVWeight: 2, BlockSize: 4, MaxBlocks: 256, LRUCapacity: 3}, 2, rand.New(rand.NewPCG(1, 2)))
	g.record(chunkHashes(nil, seq(1, 8), 4, 256), 0)  // 2 hashes
	g.record(chunkHashes(nil, seq(50, 8), 4, 256), 0) // 2 more: the first prompt's first chunk goes
	if n := len(g.holders); n != 3 {
		t.Fatalf("%d hashes held, want 3", n)
	}
	g.pick(seq(1, 8), &peerLoad{metrics: make([]Metrics, 2), inflight: make([]int, 2)})
	if g.match[0] != 0 {
		t.Fatalf("match %v after the first chunk was evicted; want 0 (the walk stops at it)", g.match)
	}
}

// TestLLMDPick: llm-d's precise profile, 3 workers, blocks of 4 tokens, a 12-token prompt (3
// blocks). Worker 0 stored its first 2 blocks; worker 1 all 3, then lost the middle one, so its
// prefix is 1 block; worker 2 none.
func TestLLMDPick(t *testing.T) {
	prompt := seq(1, 12)
	f := func(name string, m []Metrics, want int) {
		t.Helper()
		l := newLLMD(DefaultLLMDConfig(4), 3, rand.New(rand.NewPCG(1, 2)))
		l.events(0, []kvevent.Event{{Kind: kvevent.Stored, Hashes: []uint64{100, 101}, Tokens: seq(1, 8), BlockSize: 4}})
		l.events(1, []kvevent.Event{
			{Kind: kvevent.Stored, Hashes: []uint64{200}, Tokens: seq(1, 4), BlockSize: 4},
			{Kind: kvevent.Stored, Hashes: []uint64{201, 202}, Parent: 200, HasParent: true, Tokens: seq(5, 8), BlockSize: 4},
			{Kind: kvevent.Removed, Hashes: []uint64{201}},
		})
		if got := l.pick(prompt, &peerLoad{metrics: m, inflight: make([]int, 3)}); got != want {
			t.Errorf("%s: picked %d, want %d (scores %v)", name, got, want, l.scores)
		}
		if !reflect.DeepEqual(l.match, []int{2, 1, 0}) {
			t.Errorf("%s: matches %v, want [2 1 0]", name, l.match)
		}
	}
	// score = 2·match/3 + 1·(1−usage) + 1·(max−waiting)/(max−min); waiting 3, 1, 0:
	// w0 = 1.333 + 0.4 + 0 = 1.733; w1 = 0.667 + 0.5 + 0.667 = 1.833; w2 = 0 + 0.9 + 1 = 1.9.
	// Without the removal w1 would score 2 + 0.5 + 0.667 = 3.167.
	f("gap cuts the prefix", []Metrics{{3, 0.6}, {1, 0.5}, {0, 0.1}}, 2)
	// waiting 0, 1, 3: w0 = 1.333 + 0.4 + 1 = 2.733; w1 = 0.667 + 0.5 + 0.667 = 1.833; w2 = 0 + 0.9 + 0 = 0.9.
	f("holder idle", []Metrics{{0, 0.6}, {1, 0.5}, {3, 0.1}}, 0)
}

// TestSGLangDecide: SGLang's cache_aware defaults (threshold 0.3, abs 64, rel 1.5), 3 workers.
// Worker 0 was sent 1..10, worker 1 1..4 then 50..55: the tree is "1..4" (owned by worker 0,
// which created it) with children "5..10" (worker 0) and "50..55" (worker 1).
func TestSGLangDecide(t *testing.T) {
	f := func(name string, cfg SGLangConfig, prompt []uint32, inflight []int, want int) {
		t.Helper()
		s := newSGLang(cfg, 3)
		s.insert(seq(1, 10), 0)
		s.insert(cat(seq(1, 4), seq(50, 6)), 1)
		if got := s.decide(prompt, inflight); got != want {
			n, w := s.match(prompt)
			t.Errorf("%s: picked %d, want %d (match %d of %d, worker %d; sizes %v)", name, got, want, n, len(prompt), w, s.size)
		}
	}
	def := DefaultSGLangConfig()
	tree := def
	tree.SmallestTree = true
	// Loads 3, 2, 1: balanced (max − min = 2 ≤ 64). Match 1..8 = 8 of 10 = 0.8 > 0.3: worker 0.
	f("match", def, cat(seq(1, 8), seq(99, 2)), []int{3, 2, 1}, 0)
	// Match 1..4 then 50,51 = 6 of 10 = 0.6 into worker 1's branch: worker 1.
	f("branch", def, cat(seq(1, 4), seq(50, 2), seq(300, 4)), []int{3, 2, 1}, 1)
	// Match 4 of 20 = 0.2 ≤ 0.3: the least loaded (loads 3, 0, 1: worker 1) ...
	low := cat(seq(1, 4), seq(60, 16))
	f("low match", def, low, []int{3, 0, 1}, 1)
	// ... or, the older rule, the smallest tree: sizes 10, 10 (4 shared + 6), 0: worker 2.
	f("low match, smallest tree", tree, low, []int{3, 0, 1}, 2)
	// Loads 70, 2, 5: 70 − 2 = 68 > 64 and 70 > 1.5·2: imbalanced, the least loaded even for
	// worker 0's whole prompt.
	f("imbalanced", def, seq(1, 10), []int{70, 2, 5}, 1)
	// Loads 250, 170, 200: 80 > 64 but 250 ≤ 1.5·170 = 255: balanced; the full match goes to
	// worker 0, the busiest.
	f("abs without rel", def, seq(1, 10), []int{250, 170, 200}, 0)
}

// TestSGLangEvict: a worker's tree over MaxTreeSize loses its least recently used leaves. Worker
// 0 was sent 1..10 (a leaf, access 1), then 1..4,50..55: the tree splits into "1..4" (which
// takes the old leaf's access) with children "5..10" (access 1) and "50..55" (access 2), 16
// tokens. Trimmed to 10, the oldest leaf "5..10" goes (16 − 6 = 10), and the next is spared.
func TestSGLangEvict(t *testing.T) {
	cfg := DefaultSGLangConfig()
	cfg.MaxTreeSize = 10
	s := newSGLang(cfg, 2)
	b := cat(seq(1, 4), seq(50, 6))
	s.insert(seq(1, 10), 0)
	s.insert(b, 0)
	if s.size[0] != 16 {
		t.Fatalf("size %d before eviction, want 16", s.size[0])
	}
	s.evict()
	if s.size[0] != 10 {
		t.Fatalf("size %d after eviction, want 10", s.size[0])
	}
	if n, w := s.match(seq(1, 10)); n != 4 || w != 0 {
		t.Fatalf("1..10 matches %d tokens on worker %d, want 4 on 0", n, w)
	}
	if n, w := s.match(b); n != 10 || w != 0 {
		t.Fatalf("1..4,50..55 matches %d tokens on worker %d, want 10 on 0", n, w)
	}
	// The periodic eviction runs on the simulated clock: none before the first interval.
	s.insert(seq(100, 20), 1)
	load := &peerLoad{now: 1, inflight: make([]int, 2)}
	cfg.MaxTreeSize = 5
	s.cfg = cfg
	s.pick(seq(200, 1), load)
	if s.size[1] != 20 {
		t.Fatalf("evicted before the interval: size %d", s.size[1])
	}
	load.now += int64(cfg.EvictionInterval)
	s.pick(seq(300, 1), load)
	if s.size[1] > 5 {
		t.Fatalf("not evicted after the interval: size %d", s.size[1])
	}
}

// TestMaxScoreTies: ties are broken at random among the tied only.
func TestMaxScoreTies(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	seen := map[int]int{}
	for range 300 {
		seen[maxScore([]float64{1, 3, 2, 3, 3}, rnd)]++
	}
	if len(seen) != 3 || seen[1] == 0 || seen[3] == 0 || seen[4] == 0 {
		t.Fatalf("picks %v, want 1, 3 and 4 each", seen)
	}
}

// TestPeersRun: each peer serves a whole workload, deterministically for a seed.
func TestPeersRun(t *testing.T) {
	reqs := smallWorkload()
	for _, p := range Peers {
		cfg := Config{Workers: 4, Peer: p, Worker: smallWorker(), Seed: 2}
		a, err := Run(cfg, reqs)
		if err != nil {
			t.Fatal(p, err)
		}
		b, err := Run(cfg, reqs)
		if err != nil {
			t.Fatal(p, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs differ", p)
		}
		if a.RouteFailures != 0 || a.CallErrors != 0 {
			t.Fatalf("%s: %d route failures, %d call errors", p, a.RouteFailures, a.CallErrors)
		}
		for i, d := range a.E2E {
			if d <= 0 {
				t.Fatalf("%s: request %d never completed", p, i)
			}
		}
		t.Logf("%s: hit rate %.3f, imbalance %.2f", p, a.HitRate(), a.Imbalance())
	}
	if _, err := Run(Config{Workers: 2, Peer: GIE, Queue: nil, PrefillWorkers: 1}, trace.Scale(reqs, 1)); err == nil {
		t.Fatal("a peer with a disaggregated fleet: no error")
	}
}
