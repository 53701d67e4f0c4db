package shard_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

// runSerial applies a generated stream to an Applier and to the model, and compares every
// outcome, a few queries after every step, and everything at the end. It returns false when the
// source ran dry before any op (fuzz input too short).
func runSerial(t testing.TB, src source, blockSize int, budget int64, steps int, r *rand.Rand) {
	ix, err := radix.New(radix.Config{BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	a := shard.NewApplier(budget, nil)
	fleet := refmodel.NewFleet(blockSize, budget)
	g := newGen(src, blockSize, 5, 2, 1)
	var m radix.Match
	for step := 0; step < steps; step++ {
		o := g.nextOp()
		if bs, ok := src.(*byteSource); ok && bs.done {
			break
		}
		if o.remove {
			if got, want := a.RemoveWorker(o.worker), fleet.RemoveWorker(o.worker); got != want {
				t.Fatalf("step %d: RemoveWorker(%d) removed %d, model %d", step, o.worker, got, want)
			}
		} else {
			got, want := a.Apply(ix, o.worker, &o.ev), fleet.Apply(o.worker, &o.ev)
			if got != want {
				t.Fatalf("step %d: %s event: outcome\n  %v\nmodel\n  %v", step, o.ev.Kind, got, want)
			}
		}
		for range 2 {
			compareIndex(t, ix, fleet.Tiers, g.query(r), &m)
		}
	}
	compareWorkers(t, ix, fleet.Tiers)
	for w := range uint64(5) {
		for rk := range uint32(2) {
			if got, want := a.Cursor(w+1, rk), fleet.Cursor(w+1, rk); got != want {
				t.Fatalf("worker %d rank %d: cursor %d, model %d", w+1, rk, got, want)
			}
		}
	}
}

func TestApplierDifferential(t *testing.T) {
	steps := 6000
	if testing.Short() {
		steps = 1500
	}
	for _, blockSize := range []int{1, 4, 16} {
		for _, budget := range []int64{0, 25} {
			t.Run(fmt.Sprintf("bs=%d/budget=%d", blockSize, budget), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(blockSize), uint64(budget)))
				runSerial(t, r, blockSize, budget, steps, r)
			})
		}
	}
}

func FuzzApply(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{16, 200, 2000} {
		seed := make([]byte, n)
		for i := range seed {
			seed[i] = byte(r.Uint32())
		}
		f.Add(byte(0), seed)
		f.Add(byte(5), seed)
	}
	f.Fuzz(func(t *testing.T, cfg byte, data []byte) {
		blockSize := []int{1, 2, 4}[cfg%3]
		budget := []int64{0, 0, 3, 12}[cfg/3%4]
		runSerial(t, &byteSource{data: data}, blockSize, budget, 1<<20, rand.New(rand.NewPCG(uint64(len(data)), 0)))
	})
}

// syncObserver collects anomalous outcomes from all shards.
type syncObserver struct {
	mu  sync.Mutex
	got []shard.Outcome
}

func (s *syncObserver) Observe(o shard.Outcome) {
	s.mu.Lock()
	s.got = append(s.got, o)
	s.mu.Unlock()
}

func sortOutcomes(os []shard.Outcome) {
	slices.SortFunc(os, func(a, b shard.Outcome) int {
		if c := fmt.Sprint(a); c != fmt.Sprint(b) {
			if c < fmt.Sprint(b) {
				return -1
			}
			return 1
		}
		return 0
	})
}

// Several producers (each owning its workers, as ingestion does) feed a Set of shards while
// readers match; at the end the index, every anomaly reported and the counters must equal the
// model's.
func TestSetDifferential(t *testing.T) {
	const producers, workersEach = 3, 6
	steps := 4000
	if testing.Short() {
		steps = 1000
	}
	for _, shards := range []int{1, 4, 7} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			ix, _ := radix.New(radix.Config{BlockSize: 4})
			obs := &syncObserver{}
			set := shard.New(shard.Config{Shards: shards, QueueLen: 8, Observer: obs})
			defer set.Close()

			var stop atomic.Bool
			var readers sync.WaitGroup
			for g := range 2 {
				readers.Add(1)
				go func() {
					defer readers.Done()
					r := rand.New(rand.NewPCG(uint64(g), 3))
					gq := newGen(r, 4, 1, 1, 0)
					var m radix.Match
					for !stop.Load() {
						var tokens []uint32
						for range 1 + r.IntN(6) {
							tokens = append(tokens, gq.tokens(r.IntN(4))...)
						}
						ix.MatchTokens(tokens, radix.BaseSeed, &m)
						for i := range m.Slots {
							if m.Depth[i] < 1 || int(m.Depth[i]) > len(tokens)/4 || (i > 0 && m.Slots[i] <= m.Slots[i-1]) {
								panic(fmt.Sprintf("malformed match under load: %v %v", m.Slots, m.Depth))
							}
						}
					}
				}()
			}

			fleets := make([]*refmodel.Fleet, producers)
			gens := make([]*gen, producers)
			var wantAnomalies [][]shard.Outcome = make([][]shard.Outcome, producers)
			var prod sync.WaitGroup
			for p := range producers {
				fleets[p] = refmodel.NewFleet(4, 0)
				gens[p] = newGen(rand.New(rand.NewPCG(uint64(p), uint64(shards))), 4, workersEach, 3, uint64(1+p*workersEach))
				prod.Add(1)
				go func() {
					defer prod.Done()
					for range steps {
						o := gens[p].nextOp()
						if o.remove {
							fleets[p].RemoveWorker(o.worker)
							if err := set.RemoveWorker(o.worker); err != nil {
								panic(err)
							}
							continue
						}
						if want := fleets[p].Apply(o.worker, &o.ev); want.Anomalous() {
							wantAnomalies[p] = append(wantAnomalies[p], want)
						}
						b := set.NewBatch(ix, o.worker)
						b.Add(&o.ev)
						if err := set.Enqueue(b); err != nil {
							panic(err)
						}
					}
				}()
			}
			prod.Wait()
			if err := set.Barrier(); err != nil {
				t.Fatal(err)
			}
			stop.Store(true)
			readers.Wait()

			// The union of the producers' models (their workers are disjoint), tier by tier.
			var all [kvevent.NumTiers]*refmodel.Index
			var want []shard.Outcome
			for p := range producers {
				for tier, model := range fleets[p].Tiers {
					if model == nil {
						continue
					}
					if all[tier] == nil {
						all[tier] = refmodel.NewIndex()
					}
					for w := range model.Workers() {
						for seq := range model.BlocksOf(w) {
							all[tier].Add(seq, w)
						}
					}
				}
				want = append(want, wantAnomalies[p]...)
			}
			r := rand.New(rand.NewPCG(9, 9))
			var m radix.Match
			for p := range producers {
				for range 500 {
					compareIndex(t, ix, all, gens[p].query(r), &m)
				}
			}
			compareWorkers(t, ix, all)

			sortOutcomes(want)
			sortOutcomes(obs.got)
			if !slices.Equal(obs.got, want) {
				t.Fatalf("observer saw %d anomalies, model %d", len(obs.got), len(want))
			}
			st := set.Stats()
			total := 0
			for tier, model := range all {
				n := 0
				if model != nil {
					for _, c := range model.Workers() {
						n += c
					}
				}
				if st.TierResidencies[tier] != int64(n) {
					t.Errorf("stats: %d residencies in tier %v (model %d)", st.TierResidencies[tier], kvevent.Tier(tier), n)
				}
				total += n
			}
			if st.Residencies != int64(total) || st.QueueDepth != 0 {
				t.Fatalf("stats: %d residencies (model %d), queue depth %d", st.Residencies, total, st.QueueDepth)
			}
		})
	}
}
