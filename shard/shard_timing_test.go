package shard_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/memstat"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

// engine is a simulated engine for benchmarks: it stores chains of blocks (each event 16 blocks
// chained onto its previous one, starting a new conversation now and then) and, once it holds
// capacity blocks, evicts its oldest 16 with every store, as an LRU cache under steady load does.
type engine struct {
	id       uint64
	capacity int
	next     uint64   // next engine hash
	held     []uint64 // FIFO of held engine hashes
	head     int
	last     uint64
	hasLast  bool
	r        *rand.Rand
	tokens   []uint32
	stored   shard.Event
	removed  shard.Event
}

const (
	benchBlockSize = 16
	benchEvent     = 16 // blocks per stored event
)

func newEngine(id uint64, capacity int) *engine {
	e := &engine{id: id, capacity: capacity, next: id << 40, r: rand.New(rand.NewPCG(id, 1))}
	e.tokens = make([]uint32, benchEvent*benchBlockSize)
	for i := range e.tokens {
		e.tokens[i] = e.r.Uint32N(150000)
	}
	e.stored = shard.Event{Kind: shard.Stored, Hashes: make([]uint64, benchEvent), Tokens: e.tokens}
	e.removed = shard.Event{Kind: shard.Removed, Hashes: make([]uint64, benchEvent)}
	return e
}

// step fills e.stored with the next store and reports whether e.removed holds an eviction too.
func (e *engine) step() bool {
	if !e.hasLast || e.r.IntN(8) == 0 {
		e.stored.HasParent = false // a new conversation
		e.tokens[0] = e.r.Uint32N(150000)
	} else {
		e.stored.Parent, e.stored.HasParent = e.last, true
	}
	for i := range e.stored.Hashes {
		e.next++
		e.stored.Hashes[i] = e.next
		e.held = append(e.held, e.next)
	}
	e.last, e.hasLast = e.next, true
	if len(e.held)-e.head <= e.capacity {
		return false
	}
	copy(e.removed.Hashes, e.held[e.head:e.head+benchEvent])
	e.head += benchEvent
	if e.head > 1<<16 {
		e.held = append(e.held[:0], e.held[e.head:]...)
		e.head = 0
	}
	return true
}

// BenchmarkShardApply measures events enqueued, applied and drained (the timer includes the final
// barrier) in steady state: 64 engines each holding capacity blocks, every step one engine
// storing 16 new blocks and evicting its 16 oldest. blocks/s counts both. shards=1 is the rate of
// one applying core (the producer runs on the other). batch is the number of such steps per
// batch: 1 is the worst case for per-batch costs; engines publish a batch per scheduler step,
// usually with several events.
func BenchmarkShardApply(b *testing.B) {
	for _, shards := range []int{1, 2} {
		for _, capacity := range []int{2048, 16384} {
			for _, steps := range []int{1, 4} {
				name := fmt.Sprintf("shards=%d/residencies=%d/batch=%d", shards, 64*capacity, steps)
				b.Run(name, func(b *testing.B) { benchShardApply(b, shards, capacity, steps) })
			}
		}
	}
}

func benchShardApply(b *testing.B, shards, capacity, steps int) {
	ix, _ := radix.New(radix.Config{BlockSize: benchBlockSize})
	set := shard.New(shard.Config{Shards: shards})
	defer set.Close()
	engines := make([]*engine, 64)
	for i := range engines {
		engines[i] = newEngine(uint64(i+1), capacity)
	}
	// send enqueues one batch of n steps of engine e and returns the blocks in it.
	send := func(e *engine, n int) int {
		batch := set.NewBatch(ix, e.id)
		blocks := 0
		for range n {
			evict := e.step()
			batch.Add(&e.stored)
			blocks += benchEvent
			if evict {
				batch.Add(&e.removed)
				blocks += benchEvent
			}
		}
		set.Enqueue(batch)
		return blocks
	}
	for _, e := range engines { // fill up to the first eviction: steady state
		for send(e, 1) == benchEvent {
		}
	}
	set.Barrier()
	before := set.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	blocks := 0
	for i := 0; i < b.N; i += steps {
		blocks += send(engines[i/steps%len(engines)], steps)
	}
	set.Barrier()
	b.StopTimer()
	st := set.Stats()
	if st.Events-before.Events != int64(blocks/benchEvent) || st.SkippedBlocks != 0 {
		b.Fatalf("stats after the run: %+v", st)
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(blocks), "ns/block")
}

// BenchmarkApplierApply is BenchmarkShardApply without goroutines or queues: the cost of applying
// a block on one core (hashing, engine map, index).
func BenchmarkApplierApply(b *testing.B) {
	ix, _ := radix.New(radix.Config{BlockSize: benchBlockSize})
	a := shard.NewApplier(0, nil)
	engines := make([]*engine, 64)
	for i := range engines {
		engines[i] = newEngine(uint64(i+1), 16384)
	}
	apply := func(e *engine) int {
		n := benchEvent
		evict := e.step()
		a.Apply(ix, e.id, &e.stored)
		if evict {
			a.Apply(ix, e.id, &e.removed)
			n += benchEvent
		}
		return n
	}
	for _, e := range engines {
		for apply(e) == benchEvent {
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	blocks := 0
	for i := range b.N {
		blocks += apply(engines[i%len(engines)])
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(blocks), "ns/block")
}

// BenchmarkShardMemory reports the heap held per residency ((block, worker) pair) by the index
// and the shards' per-worker state (engine-hash maps included), built through the Applier.
// "unique": no block shared between workers (the most per residency); "shared": conversations
// start with one of 16 shared 8-block system prompts and a quarter of them sit on two workers.
func BenchmarkShardMemory(b *testing.B) {
	for _, res := range []int{1e6, 1e7} {
		for _, workers := range []int{8, 1000} {
			for _, shared := range []bool{false, true} {
				kind := map[bool]string{false: "unique", true: "shared"}[shared]
				b.Run(fmt.Sprintf("residencies=%.0e/workers=%d/%s", float64(res), workers, kind), func(b *testing.B) {
					if testing.Short() && res > 1e6 {
						b.Skip("10^7 residencies: not in -short")
					}
					for range b.N {
						before := memstat.HeapInUse()
						ix, a, n := buildThroughApplier(res, workers, shared)
						after := memstat.HeapInUse()
						b.ReportMetric(float64(after-before)/float64(n), "B/residency")
						b.ReportMetric(float64(n), "residencies")
						runtime.KeepAlive(ix)
						runtime.KeepAlive(a)
					}
				})
			}
		}
	}
}

func buildThroughApplier(residencies, workers int, shared bool) (*radix.Index, *shard.Applier, int64) {
	ix, _ := radix.New(radix.Config{BlockSize: benchBlockSize})
	a := shard.NewApplier(0, nil)
	r := rand.New(rand.NewPCG(uint64(residencies), uint64(workers)))
	const convBlocks = 56
	tokens := make([]uint32, (8+convBlocks)*benchBlockSize)
	hashes := make([]uint64, 8+convBlocks)
	prompts := make([][]uint32, 16)
	for p := range prompts {
		prompts[p] = make([]uint32, 8*benchBlockSize)
		for i := range prompts[p] {
			prompts[p][i] = r.Uint32N(150000)
		}
	}
	per := residencies / workers
	next := uint64(1)
	held := make([]int, workers)
	for w := 0; w < workers; {
		if held[w] >= per {
			w++
			continue
		}
		for i := range tokens {
			tokens[i] = r.Uint32N(150000)
		}
		prompt := -1
		if shared {
			prompt = r.IntN(len(prompts))
			copy(tokens, prompts[prompt])
		}
		n := min(8+convBlocks, per-held[w])
		holders := []int{w}
		if shared && r.IntN(4) == 0 {
			holders = append(holders, r.IntN(workers))
		}
		for _, h := range holders {
			for i := range hashes[:n] {
				if prompt >= 0 && i < 8 {
					// An engine names the same prefix the same way each time it caches it.
					hashes[i] = 1<<63 | uint64(h)<<16 | uint64(prompt)<<8 | uint64(i)
					continue
				}
				hashes[i] = next // otherwise engine hashes are per worker: no sharing there
				next++
			}
			a.Apply(ix, uint64(h), &shard.Event{Kind: shard.Stored, Hashes: hashes[:n], Tokens: tokens[:n*benchBlockSize]})
			held[h] += n // engine blocks, so that a worker's quota is reached even when all are shared
		}
	}
	return ix, a, ix.Stats().Residencies
}
