package shard_test

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

// source is where a generator's choices come from: a PRNG for randomized tests, the fuzzer's
// bytes for fuzz targets.
type source interface {
	IntN(n int) int
}

// byteSource answers IntN from fuzz input; once the input is used up it answers 0 and done is set.
type byteSource struct {
	data []byte
	done bool
}

func (b *byteSource) IntN(n int) int {
	if len(b.data) < 2 {
		b.done = true
		return 0
	}
	v := int(b.data[0])<<8 | int(b.data[1])
	b.data = b.data[2:]
	return v % n
}

// op is one step of a stream: an event of a worker, or the worker's removal.
type op struct {
	worker uint64
	remove bool
	ev     shard.Event
}

type heldBlock struct {
	eh   uint64
	path []uint64 // sequence hashes from the root to this block, for queries
}

// gen produces event streams like engines publish them, with the mistakes transports make:
// chains stored onto shared prefixes, removals in the middle of chains, clears, several data-
// parallel ranks, LoRA and multimodal blocks, the same content under two engine hashes, engine
// hashes reused for other content, unknown parents and blocks, wrong block sizes and token
// counts, other tiers, worker removal, and event ids with gaps, duplicates and reordering.
type gen struct {
	src      source
	bs       int
	workers  int
	ranks    int
	base     uint64 // worker ids are base .. base+workers-1
	alphabet int
	next     map[radix.WorkerKey]uint64
	held     map[heldKey][]heldBlock
	history  []op
	pending  []op
}

// heldKey names the blocks one rank holds in one storage tier.
type heldKey struct {
	radix.WorkerKey
	tier shard.Tier
}

func newGen(src source, bs, workers, ranks int, base uint64) *gen {
	return &gen{src: src, bs: bs, workers: workers, ranks: ranks, base: base, alphabet: 4,
		next: map[radix.WorkerKey]uint64{}, held: map[heldKey][]heldBlock{}}
}

// tier picks an event's storage tier: mostly the device, often the host (an engine offloading),
// sometimes disk or external.
func (g *gen) tier() shard.Tier {
	switch x := g.src.IntN(20); {
	case x < 11:
		return shard.Device
	case x < 16:
		return shard.Host
	case x < 18:
		return shard.Disk
	}
	return shard.External
}

func (g *gen) chance(n int) bool { return g.src.IntN(n) == 0 }

func (g *gen) tokens(c int) []uint32 {
	t := make([]uint32, g.bs)
	for i := range t {
		t[i] = uint32(c*1000 + i)
	}
	return t
}

func ehash(parent uint64, c int, lora string, salt int) uint64 {
	return refmodel.SeqHash(parent^uint64(len(lora))<<48^uint64(salt)<<56, uint64(c)+1)
}

func (g *gen) nextOp() op {
	if n := len(g.pending); n > 0 {
		o := g.pending[n-1]
		g.pending = g.pending[:n-1]
		return o
	}
	if g.chance(40) {
		// Reordered: the later event arrives first, the earlier one then looks like a duplicate.
		k := g.pick()
		first := g.event(k)
		g.pending = append(g.pending, first)
		return g.event(k)
	}
	k := g.pick()
	switch x := g.src.IntN(100); {
	case x < 2:
		for key := range g.held {
			if key.ID == k.ID {
				delete(g.held, key)
			}
		}
		return op{worker: k.ID, remove: true}
	case x < 5 && len(g.history) > 0:
		return g.history[g.src.IntN(len(g.history))] // a duplicate delivery
	}
	return g.event(k)
}

func (g *gen) pick() radix.WorkerKey {
	return radix.WorkerKey{ID: g.base + uint64(g.src.IntN(g.workers)), Rank: uint32(g.src.IntN(g.ranks))}
}

func (g *gen) event(k radix.WorkerKey) op {
	ev := shard.Event{Rank: k.Rank, Tier: g.tier()}
	switch x := g.src.IntN(100); {
	case x < 3:
		// A clear of one tier of one rank.
		ev.Kind = shard.Cleared
		delete(g.held, heldKey{k, ev.Tier})
	case x < 35:
		g.removal(k, &ev)
	default:
		g.store(k, &ev)
	}
	switch {
	case g.chance(30):
		g.next[k] += 2 + uint64(g.src.IntN(3)) // a gap
		ev.ID = g.next[k]
	case g.chance(40):
		ev.ID = 0 // unnumbered
	default:
		g.next[k]++
		ev.ID = g.next[k]
	}
	o := op{worker: k.ID, ev: ev}
	g.history = append(g.history, o)
	return o
}

func (g *gen) removal(k radix.WorkerKey, ev *shard.Event) {
	ev.Kind = shard.Removed
	hk := heldKey{k, ev.Tier}
	held := g.held[hk]
	for range 1 + g.src.IntN(3) {
		if len(held) == 0 {
			break
		}
		i := g.src.IntN(len(held))
		ev.Hashes = append(ev.Hashes, held[i].eh)
		held = slices.Delete(held, i, i+1)
	}
	g.held[hk] = held
	if g.chance(10) || len(ev.Hashes) == 0 {
		ev.Hashes = append(ev.Hashes, uint64(g.src.IntN(1<<16))<<20|7) // unknown
	}
	if g.chance(30) {
		// A removal naming another tier than the blocks': it must not touch them.
		ev.Tier = g.tier()
	}
}

func (g *gen) store(k radix.WorkerKey, ev *shard.Event) {
	ev.Kind = shard.Stored
	hk := heldKey{k, ev.Tier}
	held := g.held[hk]
	// The parent may be held in another tier of the rank (a device block's child offloaded).
	parents := held
	if g.chance(3) {
		parents = g.held[heldKey{k, g.tier()}]
	}
	var parentEH uint64
	var path []uint64
	if len(parents) > 0 && !g.chance(4) {
		p := parents[g.src.IntN(len(parents))]
		parentEH, path = p.eh, slices.Clone(p.path)
		ev.Parent, ev.HasParent = p.eh, true
	}
	if g.chance(30) {
		ev.Parent, ev.HasParent = uint64(g.src.IntN(1<<16))<<20|9, true // a parent never stored
	}
	if g.chance(8) {
		ev.LoRA = "adapter-x"
	}
	salt := 0
	if g.chance(12) {
		salt = 1 // same content, other engine hash
	}
	for range 1 + g.src.IntN(4) {
		c := g.src.IntN(g.alphabet)
		tokens := g.tokens(c)
		var mm []uint64
		if g.chance(10) {
			for range 1 + g.src.IntN(3) {
				mm = append(mm, uint64(g.src.IntN(5)))
			}
		}
		if mm != nil || ev.MM != nil {
			for len(ev.MM) < len(ev.Hashes) {
				ev.MM = append(ev.MM, nil)
			}
			ev.MM = append(ev.MM, mm)
		}
		eh := ehash(parentEH, c, ev.LoRA, salt)
		if g.chance(40) && len(held) > 0 {
			eh = held[g.src.IntN(len(held))].eh // the engine reuses a hash for other content
		}
		parentEH = eh
		l := refmodel.LocalHash(tokens, ev.LoRA, mm)
		if len(path) > 0 {
			l = refmodel.SeqHash(path[len(path)-1], l)
		}
		path = append(path, l)
		ev.Hashes = append(ev.Hashes, eh)
		ev.Tokens = append(ev.Tokens, tokens...)
		held = append(held, heldBlock{eh: eh, path: slices.Clone(path)})
	}
	g.held[hk] = held
	switch {
	case g.chance(50):
		ev.BlockSize = g.bs + 1
	case g.chance(50):
		ev.Tokens = ev.Tokens[:len(ev.Tokens)-1]
	case g.chance(10):
		ev.BlockSize = g.bs
	}
}

// query returns a request's sequence hashes: a stored path, cut or extended, or random content.
func (g *gen) query(r *rand.Rand) []uint64 {
	var all []heldBlock
	for _, k := range slices.SortedFunc(maps.Keys(g.held), cmpHeld) {
		all = append(all, g.held[k]...)
	}
	if len(all) == 0 || r.IntN(5) == 0 {
		var tokens []uint32
		for range 1 + r.IntN(6) {
			tokens = append(tokens, g.tokens(r.IntN(g.alphabet))...)
		}
		return refmodel.SeqHashes(tokens, g.bs, "")
	}
	q := slices.Clone(all[r.IntN(len(all))].path)
	switch r.IntN(3) {
	case 0:
		q = q[:1+r.IntN(len(q))]
	case 1:
		q = append(q, refmodel.SeqHash(q[len(q)-1], uint64(r.IntN(4))))
	}
	return q
}

func cmpHeld(a, b heldKey) int {
	if c := cmpKey(a.WorkerKey, b.WorkerKey); c != 0 {
		return c
	}
	return int(a.tier) - int(b.tier)
}

func cmpKey(a, b radix.WorkerKey) int {
	if a.ID != b.ID {
		return int(a.ID) - int(b.ID)
	}
	return int(a.Rank) - int(b.Rank)
}

// compareIndex checks a query against the model: every worker's depth and cached count, and
// its extensions through the lower tiers.
func compareIndex(t testing.TB, ix *radix.Index, tiers [kvevent.NumTiers]*refmodel.Index, q []uint64, m *radix.Match) {
	t.Helper()
	if err := tiers[kvevent.Device].CheckMatch(ix, q, m); err != nil {
		t.Fatal(err)
	}
	if err := refmodel.CheckTiers(tiers, ix, q, m); err != nil {
		t.Fatal(err)
	}
}

// compareWorkers checks every worker's total blocks in every tier against the model.
func compareWorkers(t testing.TB, ix *radix.Index, tiers [kvevent.NumTiers]*refmodel.Index) {
	t.Helper()
	for tier, model := range tiers {
		got := map[radix.WorkerKey]int{}
		if tix := ix.TierIndex(kvevent.Tier(tier)); tix != nil {
			for _, w := range tix.AppendWorkers(nil) {
				if w.Blocks != 0 {
					got[w.Worker] = int(w.Blocks)
				}
			}
		}
		want := map[radix.WorkerKey]int{}
		if model != nil {
			want = model.Workers()
		}
		if !maps.Equal(got, want) {
			t.Fatalf("tier %v worker blocks: index %v, model %v", kvevent.Tier(tier), got, want)
		}
	}
}
