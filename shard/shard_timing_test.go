package shard_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

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
						ix, a, n := buildThroughApplier(res, workers, shared, false, false)
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

// BenchmarkShardMemoryTree is BenchmarkShardMemory with --keep-block-tree (Applier.KeepTree):
// what each block's local hash and parent cost on top.
func BenchmarkShardMemoryTree(b *testing.B) {
	for _, workers := range []int{8, 1000} {
		for _, shared := range []bool{false, true} {
			kind := map[bool]string{false: "unique", true: "shared"}[shared]
			b.Run(fmt.Sprintf("residencies=1e+06/workers=%d/%s", workers, kind), func(b *testing.B) {
				for range b.N {
					before := memstat.HeapInUse()
					ix, a, n := buildThroughApplier(1e6, workers, shared, true, false)
					after := memstat.HeapInUse()
					b.ReportMetric(float64(after-before)/float64(n), "B/residency")
					runtime.KeepAlive(ix)
					runtime.KeepAlive(a)
				}
			})
		}
	}
}

// BenchmarkShardMemoryTiers is BenchmarkShardMemory with lower storage tiers in use: each
// conversation an engine stores on its device is also offloaded to its host tier half of the
// time (the same engine hashes, as an offloading engine names them) and to disk a quarter of the
// time. B/residency counts every tier's residencies; their split is reported beside it.
func BenchmarkShardMemoryTiers(b *testing.B) {
	for _, workers := range []int{8, 1000} {
		for _, shared := range []bool{false, true} {
			kind := map[bool]string{false: "unique", true: "shared"}[shared]
			b.Run(fmt.Sprintf("residencies=1e+06/workers=%d/%s", workers, kind), func(b *testing.B) {
				for range b.N {
					before := memstat.HeapInUse()
					ix, a, n := buildThroughApplier(1e6, workers, shared, false, true)
					after := memstat.HeapInUse()
					b.ReportMetric(float64(after-before)/float64(n), "B/residency")
					b.ReportMetric(float64(n), "residencies")
					st := a.Stats()
					b.ReportMetric(float64(st.TierResidencies[shard.Host]), "host-residencies")
					b.ReportMetric(float64(st.TierResidencies[shard.Disk]), "disk-residencies")
					runtime.KeepAlive(ix)
					runtime.KeepAlive(a)
				}
			})
		}
	}
}

// buildThroughApplier stores conversations of workers through an Applier until the device tier
// holds about residencies; with tiers, copies of them go to the host and disk tiers too (see
// BenchmarkShardMemoryTiers). It returns the index, the Applier and the residencies of every
// tier.
func buildThroughApplier(residencies, workers int, shared, tree, tiers bool) (*radix.Index, *shard.Applier, int64) {
	ix, _ := radix.New(radix.Config{BlockSize: benchBlockSize})
	a := shard.NewApplier(0, nil)
	a.KeepTree = tree
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
			ev := shard.Event{Kind: shard.Stored, Hashes: hashes[:n], Tokens: tokens[:n*benchBlockSize]}
			a.Apply(ix, uint64(h), &ev)
			if tiers {
				if r.IntN(2) == 0 {
					ev.Tier = shard.Host
					a.Apply(ix, uint64(h), &ev)
				}
				if r.IntN(4) == 0 {
					ev.Tier = shard.Disk
					a.Apply(ix, uint64(h), &ev)
				}
			}
			held[h] += n // engine blocks, so that a worker's quota is reached even when all are shared
		}
	}
	return ix, a, a.Stats().Residencies
}

// BenchmarkMatchUnderLoad measures match latency while events apply: workers engines each hold
// a shared 8-block system prompt and capacity blocks of their own conversations, and one
// goroutine keeps enqueueing their steady-state events (16 stored, 16 evicted per step, round
// robin over the engines) through the shards as fast as they apply. Each op matches a 64-block
// query: the system prompt, which every worker holds, then blocks no one holds. The op's time
// is the match alone; p50/p99/p99.9 are of single matches, in µs; writer-blocks/s is what the
// writer applied meanwhile.
func BenchmarkMatchUnderLoad(b *testing.B) {
	for _, workers := range []int{8, 1000, 10000} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			// 2^20 residencies at most, 256 per worker at least, whole events.
			capacity := max(256, 1<<20/workers) / benchEvent * benchEvent
			benchMatchUnderLoad(b, workers, capacity)
		})
	}
}

func benchMatchUnderLoad(b *testing.B, workers, capacity int) {
	ix, _ := radix.New(radix.Config{BlockSize: benchBlockSize})
	set := shard.New(shard.Config{})
	defer set.Close()
	sys := make([]uint32, 8*benchBlockSize)
	for i := range sys {
		sys[i] = uint32(i + 7)
	}
	engines := make([]*engine, workers)
	for i := range engines {
		e := newEngine(uint64(i+1), capacity)
		engines[i] = e
		prefix := shard.Event{Kind: shard.Stored, Tokens: sys}
		for j := range 8 {
			prefix.Hashes = append(prefix.Hashes, 1<<62|uint64(j)) // outside the engine's own hashes
		}
		batch := set.NewBatch(ix, e.id)
		batch.Add(&prefix)
		for { // fill up to the first eviction: steady state
			evict := e.step()
			batch.Add(&e.stored)
			if evict {
				batch.Add(&e.removed)
				break
			}
		}
		set.Enqueue(batch)
	}
	set.Barrier()
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		blocks := 0
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- blocks
				return
			default:
			}
			e := engines[i%len(engines)]
			batch := set.NewBatch(ix, e.id)
			if e.step() {
				batch.Add(&e.removed)
				blocks += benchEvent
			}
			batch.Add(&e.stored)
			blocks += benchEvent
			set.Enqueue(batch)
		}
	}()
	query := append([]uint32(nil), sys...)
	for range 56 * benchBlockSize {
		query = append(query, 1<<30) // held by no one
	}
	var m radix.Match
	var h radix.Hasher
	seqs := h.AppendSequence(nil, query, benchBlockSize, radix.BaseSeed)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		t0 := time.Now()
		ix.Match(seqs, &m)
		lat = append(lat, time.Since(t0))
		if len(m.Slots) != workers {
			b.Fatalf("%d holders of the system prompt, want %d", len(m.Slots), workers)
		}
	}
	el := time.Since(start)
	b.StopTimer()
	close(stop)
	blocks := <-done
	set.Barrier()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / 1e3 }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(q(0.999), "p99.9-µs")
	b.ReportMetric(float64(blocks)/el.Seconds(), "writer-blocks/s")
}

// TestMemoryPerResidencyTiers holds the budget the tiers came with: with host and disk tiers in
// use, the index and the Applier's state together take at most 64 B of heap per residency
// (counted over every tier), for unique and shared prompts. BenchmarkShardMemoryTiers measures
// the same at 10^6.
func TestMemoryPerResidencyTiers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 2×10^5 residencies")
	}
	for _, shared := range []bool{false, true} {
		before := memstat.HeapInUse()
		ix, a, n := buildThroughApplier(2e5, 8, shared, false, true)
		after := memstat.HeapInUse()
		st := a.Stats()
		if st.TierResidencies[shard.Host] == 0 || st.TierResidencies[shard.Disk] == 0 {
			t.Fatalf("no lower tier in use: %+v", st.TierResidencies)
		}
		if per := float64(after-before) / float64(n); per > 64 {
			t.Errorf("shared %v: %.1f B per residency over %d residencies, budget 64", shared, per, n)
		} else {
			t.Logf("shared %v: %.1f B per residency over %d residencies", shared, per, n)
		}
		runtime.KeepAlive(ix)
		runtime.KeepAlive(a)
	}
}
