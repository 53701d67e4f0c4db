package shard_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

// A generated stream is applied to an Applier; at random points its state is exported and
// imported into a fresh Applier and index, which then takes the rest of the stream. The restored
// one must agree with the model at every step after — outcomes (cursors drive duplicate and gap
// detection), matches and per-worker blocks — including blocks stored under two engine hashes and
// removals of one of them.
func TestExportImport(t *testing.T) {
	for _, budget := range []int64{0, 40} {
		t.Run(fmt.Sprintf("budget=%d", budget), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(budget)))
			const bs, workers, ranks = 4, 5, 2
			newIndex := func() *radix.Index {
				ix, err := radix.New(radix.Config{BlockSize: bs})
				if err != nil {
					t.Fatal(err)
				}
				return ix
			}
			ix, a := newIndex(), shard.NewApplier(budget, nil)
			fleet := refmodel.NewFleet(bs, budget)
			g := newGen(r, bs, workers, ranks, 1)
			var m radix.Match
			var exp []shard.RankState
			for step := range 4000 {
				if step%500 == 499 {
					// Restart from the state as it is now.
					ix2, a2 := newIndex(), shard.NewApplier(budget, nil)
					for w := uint64(1); w <= workers; w++ {
						exp = a.Export(w, exp[:0])
						if len(exp) == 0 {
							continue
						}
						r.Shuffle(len(exp), func(i, j int) { exp[i], exp[j] = exp[j], exp[i] })
						if _, err := a2.Import(ix2, w, exp); err != nil {
							t.Fatalf("step %d: import worker %d: %v", step, w, err)
						}
						if _, err := a2.Import(ix2, w, exp); !errors.Is(err, shard.ErrExists) {
							t.Fatalf("second import of worker %d: %v", w, err)
						}
						for _, rs := range exp {
							if got := a2.Cursor(w, rs.Rank); got != a.Cursor(w, rs.Rank) {
								t.Fatalf("worker %d rank %d: cursor %d after import, %d before", w, rs.Rank, got, a.Cursor(w, rs.Rank))
							}
						}
					}
					if got, want := a2.Stats(), a.Stats(); got.Residencies != want.Residencies || got.TierResidencies != want.TierResidencies {
						t.Fatalf("step %d: %d residencies imported (by tier %v), %d exported (%v)", step, got.Residencies, got.TierResidencies, want.Residencies, want.TierResidencies)
					}
					compareWorkers(t, ix2, fleet.Tiers)
					ix, a = ix2, a2
				}
				o := g.nextOp()
				if o.remove {
					if got, want := a.RemoveWorker(o.worker), fleet.RemoveWorker(o.worker); got != want {
						t.Fatalf("step %d: RemoveWorker(%d) removed %d, model %d", step, o.worker, got, want)
					}
				} else if got, want := a.Apply(ix, o.worker, &o.ev), fleet.Apply(o.worker, &o.ev); got != want {
					t.Fatalf("step %d: %s event: outcome\n  %v\nmodel\n  %v", step, o.ev.Kind, got, want)
				}
				compareIndex(t, ix, fleet.Tiers, g.query(r), &m)
			}
			compareWorkers(t, ix, fleet.Tiers)
		})
	}
}
