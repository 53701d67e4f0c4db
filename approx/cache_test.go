package approx

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
)

const sec = int64(time.Second)

func newCache(t testing.TB, cfg Config) *Cache {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustCheck(t testing.TB, c *Cache) {
	t.Helper()
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
}

// check verifies the Cache's invariants and returns the first violation; tests call it.
func (c *Cache) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen, prevLast := 0, int64(math.MinInt64)
	for x := c.nodes[0].next; x != 0; x = c.nodes[x].next {
		nd := &c.nodes[x]
		if c.nodes[nd.next].prev != x {
			return fmt.Errorf("node %d: next %d links back to %d", x, nd.next, c.nodes[nd.next].prev)
		}
		if nd.last < prevLast {
			return fmt.Errorf("node %d: used at %d after a node used at %d", x, nd.last, prevLast)
		}
		prevLast = nd.last
		if nd.worker < 0 || int(nd.worker) >= len(c.workers) {
			return fmt.Errorf("node %d: worker %d out of range", x, nd.worker)
		}
		wk := &c.workers[nd.worker]
		if wi, ok := c.byKey[wk.key]; !ok || wi != nd.worker {
			return fmt.Errorf("node %d: worker %d (%v) is not registered", x, nd.worker, wk.key)
		}
		if v, ok := wk.m.Get(nd.seq); !ok || int32(v) != x {
			return fmt.Errorf("node %d: worker %v maps %#x to %d, %v", x, wk.key, nd.seq, v, ok)
		}
		if seen++; seen > c.n {
			return fmt.Errorf("list longer than %d residencies", c.n)
		}
	}
	if seen != c.n {
		return fmt.Errorf("list has %d residencies, count %d", seen, c.n)
	}
	total := 0
	for k, wi := range c.byKey {
		wk := &c.workers[wi]
		if wk.key != k || wk.m.Len() != wk.n {
			return fmt.Errorf("worker %v: entry for %v, map %d, count %d", k, wk.key, wk.m.Len(), wk.n)
		}
		total += wk.n
	}
	if total != c.n {
		return fmt.Errorf("workers hold %d residencies, count %d", total, c.n)
	}
	if c.n > c.max {
		return fmt.Errorf("%d residencies over the cap %d", c.n, c.max)
	}
	return nil
}

// res builds residencies of worker id: pairs of sequence hash and depth.
func res(id uint64, seqDepth ...int) []Residency {
	var out []Residency
	for i := 0; i < len(seqDepth); i += 2 {
		out = append(out, Residency{Worker: radix.WorkerKey{ID: id}, Seq: uint64(seqDepth[i]), Depth: int32(seqDepth[i+1])})
	}
	return out
}

func same(t testing.TB, what string, got, want []Residency) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got  %v\n want %v", what, got, want)
	}
}

func TestNewConfig(t *testing.T) {
	c := newCache(t, Config{})
	if c.ttl != int64(DefaultTTL) || c.max != DefaultMaxBlocks || c.target != 838860 {
		t.Fatalf("defaults: ttl %d max %d target %d", c.ttl, c.max, c.target)
	}
	bad := func(cfg Config) {
		t.Helper()
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Fatalf("%+v: error %v, want ErrConfig", cfg, err)
		}
	}
	bad(Config{TTL: -time.Second})
	bad(Config{MaxBlocks: -1})
	bad(Config{MaxBlocks: math.MaxInt32})
	bad(Config{PruneTarget: -0.5})
	bad(Config{PruneTarget: 1.5})
	bad(Config{PruneTarget: math.NaN()})
}

// TestExpire: blocks go TTL after their last use; a later request that uses a block again
// keeps it, and its parents with it.
func TestExpire(t *testing.T) {
	c := newCache(t, Config{TTL: 100 * time.Second})
	w := radix.WorkerKey{ID: 1}
	added, _ := c.Record(w, []uint64{1, 2, 3}, 0, nil, nil)
	same(t, "added", added, res(1, 1, 0, 2, 1, 3, 2))
	added, _ = c.Record(w, []uint64{1, 2}, 60*sec, added[:0], nil)
	same(t, "added by the refresh", added, nil)
	if at, ok := c.NextExpiry(); !ok || at != 100*sec {
		t.Fatalf("next expiry %d %v, want %d", at, ok, 100*sec)
	}
	same(t, "expired before the TTL", c.Expire(100*sec-1, nil), nil)
	same(t, "expired at the TTL", c.Expire(100*sec, nil), res(1, 3, 2))
	same(t, "expired before the refreshed TTL", c.Expire(160*sec-1, nil), nil)
	if c.Len() != 2 {
		t.Fatalf("Len %d, want 2", c.Len())
	}
	same(t, "expired at the refreshed TTL", c.Expire(200*sec, nil), res(1, 2, 1, 1, 0))
	if _, ok := c.NextExpiry(); ok || c.Len() != 0 {
		t.Fatalf("Len %d after all expired", c.Len())
	}
	mustCheck(t, c)

	// A time earlier than one seen counts as the latest: block 4 is used at 200 s, not 10 s.
	c.Record(w, []uint64{4}, 10*sec, nil, nil)
	same(t, "expired after going back in time", c.Expire(299*sec, nil), nil)
	same(t, "expired", c.Expire(300*sec, nil), res(1, 4, 0))
}

// TestPruneOrder: over the cap, pruning leaves PruneTarget × MaxBlocks, taking the least recently
// used first and, among blocks of one request, the deepest first.
func TestPruneOrder(t *testing.T) {
	w := radix.WorkerKey{ID: 42}

	// Dynamo's end-to-end case: cap 5, target 2, six one-block requests.
	c := newCache(t, Config{TTL: time.Minute, MaxBlocks: 5, PruneTarget: 0.4})
	var evicted []Residency
	for i := range 5 {
		_, evicted = c.Record(w, []uint64{uint64(10 * (i + 1))}, int64(i), nil, evicted)
	}
	same(t, "evicted at the cap", evicted, nil)
	_, evicted = c.Record(w, []uint64{60}, 5, nil, nil)
	same(t, "evicted over the cap", evicted, res(42, 10, 0, 20, 0, 30, 0, 40, 0))
	if c.Len() != 2 {
		t.Fatalf("Len %d, want 2", c.Len())
	}
	mustCheck(t, c)

	// Chains: a refreshed prefix outlives the rest of its request, whose deepest block goes
	// first.
	c = newCache(t, Config{TTL: time.Minute, MaxBlocks: 10, PruneTarget: 0.5})
	c.Record(w, []uint64{1, 2, 3, 4}, 1, nil, nil)
	c.Record(w, []uint64{11, 12, 13, 14}, 2, nil, nil)
	c.Record(w, []uint64{1, 2}, 3, nil, nil)
	added, evicted := c.Record(w, []uint64{21, 22, 23}, 4, nil, nil)
	same(t, "added", added, res(42, 21, 0, 22, 1, 23, 2))
	same(t, "evicted", evicted, res(42, 4, 3, 3, 2, 14, 3, 13, 2, 12, 1, 11, 0))
	mustCheck(t, c)

	// A block whose TTL has run out but that Expire has not taken yet is the oldest, so it is
	// pruned before any live one.
	c = newCache(t, Config{TTL: 10 * time.Second, MaxBlocks: 4, PruneTarget: 0.5})
	c.Record(w, []uint64{1, 2}, 0, nil, nil)
	c.Record(w, []uint64{11, 12}, 5*sec, nil, nil)
	_, evicted = c.Record(w, []uint64{21}, 20*sec, nil, nil)
	same(t, "evicted with expired blocks", evicted, res(42, 2, 1, 1, 0, 12, 1))
	same(t, "expired", c.Expire(20*sec, nil), res(42, 11, 0))

	// A prune is spread over the Records that follow: each evicts down to the cap, then step
	// more, until the target is reached; a block they use again is kept.
	c = newCache(t, Config{TTL: time.Minute, MaxBlocks: 10, PruneTarget: 0.4})
	c.step = 1
	for i := range 5 {
		c.Record(w, []uint64{uint64(10*i + 1), uint64(10*i + 2)}, int64(i), nil, nil)
	}
	_, evicted = c.Record(w, []uint64{51}, 5, nil, nil) // 11 > 10: back to 10, then step more
	same(t, "evicted passing the cap", evicted, res(42, 2, 1, 1, 0))
	_, evicted = c.Record(w, []uint64{11}, 6, nil, nil) // uses 11 again
	same(t, "evicted on the way", evicted, res(42, 12, 1, 22, 1))
	_, evicted = c.Record(w, []uint64{61}, 7, nil, nil)
	same(t, "evicted on the way", evicted, res(42, 21, 0, 32, 1))
	_, evicted = c.Record(w, []uint64{71}, 8, nil, nil)
	same(t, "evicted on the way", evicted, res(42, 31, 0, 42, 1))
	if c.Len() != 5 || !c.pruning {
		t.Fatalf("Len %d pruning %v, want 5 true", c.Len(), c.pruning)
	}
	_, evicted = c.Record(w, []uint64{81}, 9, nil, nil)
	same(t, "evicted reaching the target", evicted, res(42, 41, 0, 51, 0))
	if c.Len() != 4 || c.pruning {
		t.Fatalf("Len %d pruning %v, want 4 false", c.Len(), c.pruning)
	}
	mustCheck(t, c) // 11, 61, 71, 81 are left

	// A request longer than the target evicts its own deepest blocks.
	c = newCache(t, Config{TTL: time.Minute, MaxBlocks: 4, PruneTarget: 0.5})
	added, evicted = c.Record(w, []uint64{1, 2, 3, 4, 5, 6}, 0, nil, nil)
	same(t, "added", added, res(42, 1, 0, 2, 1, 3, 2, 4, 3, 5, 4, 6, 5))
	same(t, "evicted", evicted, res(42, 6, 5, 5, 4, 4, 3, 3, 2))
	mustCheck(t, c)

	// The cap counts residencies: a block two workers hold counts twice, and pruning crosses
	// workers.
	c = newCache(t, Config{TTL: time.Minute, MaxBlocks: 3, PruneTarget: 0.5})
	c.Record(radix.WorkerKey{ID: 1}, []uint64{1, 2}, 0, nil, nil)
	_, evicted = c.Record(radix.WorkerKey{ID: 2}, []uint64{1, 2}, 1, nil, nil)
	same(t, "evicted across workers", evicted, append(res(1, 2, 1, 1, 0), res(2, 2, 1)...))
	mustCheck(t, c)
}

func TestRemoveWorker(t *testing.T) {
	c := newCache(t, Config{})
	a, b := radix.WorkerKey{ID: 1}, radix.WorkerKey{ID: 2, Rank: 1}
	c.Record(a, []uint64{1, 2, 3}, 0, nil, nil)
	c.Record(a, []uint64{1, 4}, 1, nil, nil)
	c.Record(b, []uint64{1, 2}, 2, nil, nil)
	same(t, "removed", c.RemoveWorker(a, nil), res(1, 3, 2, 2, 1, 4, 1, 1, 0))
	same(t, "removed again", c.RemoveWorker(a, nil), nil)
	if c.Len() != 2 {
		t.Fatalf("Len %d, want 2", c.Len())
	}
	mustCheck(t, c)
	// The worker can come back; its entry is reused.
	added, _ := c.Record(a, []uint64{1}, 3, nil, nil)
	same(t, "added after removal", added, res(1, 1, 0))
	if len(c.workers) != 2 {
		t.Fatalf("%d worker entries, want 2", len(c.workers))
	}
	same(t, "expired", c.Expire(3+int64(DefaultTTL), nil), []Residency{
		{Worker: b, Seq: 2, Depth: 1}, {Worker: b, Seq: 1}, {Worker: a, Seq: 1},
	})
	mustCheck(t, c)
}

// TestRepeatedHash: a request whose chain repeats a hash (only a hash collision does that) keeps
// the block once, at its first position.
func TestRepeatedHash(t *testing.T) {
	c := newCache(t, Config{})
	w := radix.WorkerKey{ID: 1}
	added, _ := c.Record(w, []uint64{7, 8, 7, 9}, 0, nil, nil)
	same(t, "added", added, res(1, 7, 0, 8, 1, 9, 3))
	c.Record(w, []uint64{8, 8}, 1, nil, nil)
	mustCheck(t, c)
	same(t, "removed", c.RemoveWorker(w, nil), res(1, 9, 3, 7, 0, 8, 0))
}

// refModel is the Cache written plainly: a map of residencies, sorted when an order is needed.
type refModel struct {
	ttl               int64
	max, target, step int
	now               int64
	rec               int
	pruning           bool
	m                 map[refKey]refEntry
}

type refKey struct {
	w   radix.WorkerKey
	seq uint64
}

type refEntry struct {
	last  int64
	rec   int // the Record that last used it
	depth int32
}

func (r *refModel) advance(now int64) int64 {
	r.now = max(r.now, now)
	return r.now
}

// lru returns the residencies, least recently used first, deepest first within a Record.
func (r *refModel) lru() []refKey {
	keys := make([]refKey, 0, len(r.m))
	for k := range r.m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b refKey) int {
		ea, eb := r.m[a], r.m[b]
		return cmp.Or(cmp.Compare(ea.rec, eb.rec), cmp.Compare(eb.depth, ea.depth))
	})
	return keys
}

func (r *refModel) take(k refKey, dst []Residency) []Residency {
	dst = append(dst, Residency{Worker: k.w, Seq: k.seq, Depth: r.m[k].depth})
	delete(r.m, k)
	return dst
}

func (r *refModel) record(w radix.WorkerKey, seqs []uint64, now int64) (added, evicted []Residency) {
	now = r.advance(now)
	if len(seqs) == 0 {
		return nil, nil
	}
	r.rec++
	for i, s := range seqs {
		k := refKey{w, s}
		if e, ok := r.m[k]; ok && e.rec == r.rec {
			continue
		} else if !ok {
			added = append(added, Residency{Worker: w, Seq: s, Depth: int32(i)})
		}
		r.m[k] = refEntry{last: now, rec: r.rec, depth: int32(i)}
	}
	r.pruning = r.pruning || len(r.m) > r.max
	if r.pruning {
		k := max(len(r.m)-r.max, min(len(r.m)-r.target, len(seqs)+r.step))
		for _, k := range r.lru()[:k] {
			evicted = r.take(k, evicted)
		}
		r.pruning = len(r.m) > r.target
	}
	return added, evicted
}

func (r *refModel) expire(now int64) (out []Residency) {
	now = r.advance(now)
	for _, k := range r.lru() {
		if now-r.m[k].last >= r.ttl {
			out = r.take(k, out)
		}
	}
	r.pruning = r.pruning && len(r.m) > r.target
	return out
}

func (r *refModel) removeWorker(w radix.WorkerKey) (out []Residency) {
	for k, e := range r.m {
		if k.w == w {
			out = append(out, Residency{Worker: w, Seq: k.seq, Depth: e.depth})
		}
	}
	slices.SortFunc(out, func(a, b Residency) int {
		return cmp.Or(cmp.Compare(b.Depth, a.Depth), cmp.Compare(a.Seq, b.Seq))
	})
	for _, x := range out {
		delete(r.m, refKey{w, x.Seq})
	}
	r.pruning = r.pruning && len(r.m) > r.target
	return out
}

// contents returns what the Cache holds, in the model's terms.
func contents(c *Cache) map[refKey]refEntry {
	out := map[refKey]refEntry{}
	for x := c.nodes[0].next; x != 0; x = c.nodes[x].next {
		nd := &c.nodes[x]
		out[refKey{c.workers[nd.worker].key, nd.seq}] = refEntry{last: nd.last, depth: nd.depth}
	}
	return out
}

// chainer makes request chains from families: a family's requests share its first blocks, then
// go their own way over a small alphabet, so that suffixes also recur.
type chainer struct {
	parent map[uint64]uint64 // sequence hash → its parent's, 0 for a root
}

func (ch *chainer) next(prev, local uint64) uint64 {
	s := prev*0x9e3779b97f4a7c15 ^ local
	s ^= s >> 29
	s *= 0xbf58476d1ce4e5b9
	s ^= s >> 32
	if ch.parent != nil {
		ch.parent[s] = prev
	}
	return s
}

func (ch *chainer) request(rng *rand.Rand, families, spine, suffix int, dst []uint64) []uint64 {
	f := uint64(rng.IntN(families)) + 1
	n := rng.IntN(spine + 1)
	var prev uint64
	for i := range n {
		prev = ch.next(prev, f<<32|uint64(i))
		dst = append(dst, prev)
	}
	for range rng.IntN(suffix + 1) {
		prev = ch.next(prev, 1<<63|uint64(rng.IntN(3)))
		dst = append(dst, prev)
	}
	return dst
}

// closed reports a residency whose parent its worker does not hold.
func closed(c *Cache, ch *chainer) error {
	held := contents(c)
	for k := range held {
		if p := ch.parent[k.seq]; p != 0 {
			if _, ok := held[refKey{k.w, p}]; !ok {
				return fmt.Errorf("worker %v holds %#x without its parent %#x", k.w, k.seq, p)
			}
		}
	}
	return nil
}

// TestRandomAgainstModel drives the Cache and the model with the same random operations and
// compares every result, the order included, and the whole contents now and then.
func TestRandomAgainstModel(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			cfg := Config{TTL: 100 * time.Second, MaxBlocks: 20 + rng.IntN(100), PruneTarget: 0.3 + 0.7*rng.Float64()}
			c := newCache(t, cfg)
			c.step = rng.IntN(20) // so that prunes take several Records
			r := &refModel{ttl: c.ttl, max: c.max, target: c.target, step: c.step, now: math.MinInt64, m: map[refKey]refEntry{}}
			ch := &chainer{parent: map[uint64]uint64{}}
			workers := 2 + rng.IntN(6)
			var now int64
			var seqs []uint64
			var added, evicted, out []Residency
			for op := range 5000 {
				now += rng.Int64N(20 * sec)
				w := radix.WorkerKey{ID: uint64(rng.IntN(workers)), Rank: uint32(rng.IntN(2))}
				switch p := rng.IntN(100); {
				case p < 75:
					at := now
					if rng.IntN(20) == 0 {
						at -= rng.Int64N(30 * sec) // a caller that read the clock earlier
					}
					seqs = ch.request(rng, 4, 10, 4, seqs[:0])
					wantAdded, wantEvicted := r.record(w, seqs, at)
					added, evicted = c.Record(w, seqs, at, added[:0], evicted[:0])
					same(t, fmt.Sprintf("op %d: added", op), added, wantAdded)
					same(t, fmt.Sprintf("op %d: evicted", op), evicted, wantEvicted)
				case p < 92:
					want := r.expire(now)
					out = c.Expire(now, out[:0])
					same(t, fmt.Sprintf("op %d: expired", op), out, want)
				default:
					want := r.removeWorker(w)
					out = c.RemoveWorker(w, out[:0])
					same(t, fmt.Sprintf("op %d: removed", op), out, want)
				}
				if c.Len() != len(r.m) || c.pruning != r.pruning {
					t.Fatalf("op %d: Len %d pruning %v, model %d %v", op, c.Len(), c.pruning, len(r.m), r.pruning)
				}
				if c.Len() > c.max {
					t.Fatalf("op %d: Len %d over the cap %d", op, c.Len(), c.max)
				}
				if op%50 == 0 {
					mustCheck(t, c)
					if err := closed(c, ch); err != nil {
						t.Fatalf("op %d: %v", op, err)
					}
					got := contents(c)
					for k, e := range r.m {
						if g, ok := got[k]; !ok || g.last != e.last || g.depth != e.depth {
							t.Fatalf("op %d: %v/%#x: cache %+v %v, model %+v", op, k.w, k.seq, g, ok, e)
						}
					}
				}
			}
		})
	}
}

// TestConcurrent runs Record, Expire and RemoveWorker from several goroutines; with -race it
// checks the locking, and the invariants must hold at the end.
func TestConcurrent(t *testing.T) {
	c := newCache(t, Config{TTL: time.Second, MaxBlocks: 2000})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var ch chainer
			var seqs []uint64
			var a, e []Residency
			for i := range 2000 {
				now := int64(i) * int64(time.Millisecond)
				w := radix.WorkerKey{ID: uint64(rng.IntN(8))}
				switch rng.IntN(10) {
				case 0:
					e = c.Expire(now, e[:0])
				case 1:
					e = c.RemoveWorker(w, e[:0])
				default:
					seqs = ch.request(rng, 8, 32, 8, seqs[:0])
					a, e = c.Record(w, seqs, now, a[:0], e[:0])
				}
			}
		})
	}
	wg.Wait()
	mustCheck(t, c)
}

// steady is a workload of 128-block requests: a family prompt, families drawn by a Zipf law
// (s = 1.1, a few hot, a long tail), routed to the family's worker and every tenth request to a
// random one, then blocks unique to the request.
type steady struct {
	workers  int
	unique   int
	families [][]uint64
	rng      *rand.Rand
	zipf     *rand.Zipf
	seqs     []uint64
	n        uint64
}

func newSteady(workers, families, unique int) *steady {
	rng := rand.New(rand.NewPCG(1, 2))
	s := &steady{workers: workers, unique: unique, rng: rng, zipf: rand.NewZipf(rng, 1.1, 1, uint64(families-1))}
	var ch chainer
	for f := range families {
		var prev uint64
		var spine []uint64
		for i := range 128 - unique {
			prev = ch.next(prev, uint64(f+1)<<32|uint64(i))
			spine = append(spine, prev)
		}
		s.families = append(s.families, spine)
	}
	return s
}

func (s *steady) next() (radix.WorkerKey, []uint64) {
	s.n++
	f := s.zipf.Uint64()
	w := radix.WorkerKey{ID: f % uint64(s.workers)}
	if s.rng.IntN(10) == 0 {
		w.ID = uint64(s.rng.IntN(s.workers))
	}
	s.seqs = append(s.seqs[:0], s.families[f]...)
	var prev uint64
	if len(s.seqs) > 0 {
		prev = s.seqs[len(s.seqs)-1]
	}
	var ch chainer
	for i := range s.unique {
		prev = ch.next(prev, s.n<<8|uint64(i))
		s.seqs = append(s.seqs, prev)
	}
	return w, s.seqs
}

func TestRecordAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not asserted under the race detector")
	}
	c := newCache(t, Config{TTL: time.Minute, MaxBlocks: 8192})
	s := newSteady(16, 64, 32)
	var added, evicted []Residency
	var now int64
	step := func() {
		now += int64(time.Millisecond)
		w, seqs := s.next()
		added, evicted = c.Record(w, seqs, now, added[:0], evicted[:0])
	}
	// Fill the cache and prune it many times, so that slab, maps and buffers have grown.
	for range 2000 {
		step()
	}
	pruned := 0
	if n := testing.AllocsPerRun(1000, func() {
		step()
		pruned += len(evicted)
	}); n != 0 {
		t.Fatalf("Record allocates %v times per call in steady state", n)
	}
	if pruned == 0 {
		t.Fatal("the measured calls did not prune")
	}
	mustCheck(t, c)
}

// TestShrink: a worker that falls far below its peak gets a table sized for what it holds.
func TestShrink(t *testing.T) {
	c := newCache(t, Config{TTL: time.Second, MaxBlocks: 1 << 16})
	w := radix.WorkerKey{ID: 1}
	var ch chainer
	var seqs []uint64
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		seqs = ch.request(rng, 1000, 100, 0, seqs[:0])
		c.Record(w, seqs, 0, nil, nil)
	}
	c.Record(w, []uint64{1, 2, 3}, sec/2, nil, nil)
	peak := c.workers[0].peak
	if peak < shrinkMin {
		t.Fatalf("peak %d, want at least %d", peak, shrinkMin)
	}
	c.Expire(sec, nil)
	if wk := c.workers[0]; wk.n != 3 || wk.peak >= peak/shrinkRatio {
		t.Fatalf("after expiry: %d residencies, peak %d (was %d)", wk.n, wk.peak, peak)
	}
	mustCheck(t, c)
	c.Expire(2*sec, nil)
	if wk := c.workers[0]; wk.n != 0 || wk.m.Len() != 0 {
		t.Fatalf("after expiry of all: %d residencies, map %d", wk.n, wk.m.Len())
	}
	mustCheck(t, c)
}
