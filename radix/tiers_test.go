package radix_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

// tierResult turns m.Tiers into worker → [device, host, disk, external].
func tierResult(t testing.TB, ix *radix.Index, m *radix.Match) map[uint64][4]int32 {
	t.Helper()
	out := map[uint64][4]int32{}
	for i, x := range m.Tiers {
		if i > 0 && m.Tiers[i-1].Slot >= x.Slot {
			t.Fatalf("tier slots not ascending: %v", m.Tiers)
		}
		w, ok := ix.Worker(x.Slot)
		if !ok {
			t.Fatalf("slot %d in a tier match is not in use", x.Slot)
		}
		out[w.ID] = x.Blocks
	}
	return out
}

// TestMatchTiers: lower tiers extend the device depth in Dynamo's order (host from the device
// depth, disk after host, external after disk), a slot may start a lower tier at block 0, and
// the device match itself is unchanged.
func TestMatchTiers(t *testing.T) {
	ix := newIndex(t, 4)
	q := chain(11, 12, 13, 14, 15, 16)
	if ix.Tiered() || ix.TierIndex(kvevent.Host) != nil {
		t.Fatal("a new index has lower tiers")
	}
	host, disk, ext := ix.EnsureTier(kvevent.Host), ix.EnsureTier(kvevent.Disk), ix.EnsureTier(kvevent.External)
	if ix.EnsureTier(kvevent.Host) != host || ix.TierIndex(kvevent.Disk) != disk || host.Tier() != kvevent.Host {
		t.Fatal("EnsureTier does not return the one index of its tier")
	}
	add := func(x *radix.Index, s radix.Slot, blocks ...int) {
		for _, b := range blocks {
			x.Add(q[b], s)
		}
	}
	w7, w8, w9, w10 := acquire(t, ix, 7), acquire(t, ix, 8), acquire(t, ix, 9), acquire(t, ix, 10)
	// Worker 7: device [0,1], host [2], disk [3,4], external [5] → 2, 1, 2, 1.
	add(ix, w7, 0, 1)
	add(host, w7, 2)
	add(disk, w7, 3, 4)
	add(ext, w7, 5)
	// Worker 8: device [0,1] only.
	add(ix, w8, 0, 1)
	// Worker 9: host [0,1,2] and device nothing; host [4] is beyond its gap; disk [3].
	add(host, w9, 0, 1, 2, 4)
	add(disk, w9, 3)
	// Worker 10: disk [0] only; host [1] comes after the disk run, too late.
	add(disk, w10, 0)
	add(host, w10, 1)
	var m radix.Match
	ix.Match(q, &m)
	if got := result(t, ix, &m); len(got) != 2 || got[radix.WorkerKey{ID: 7}] != 2 || got[radix.WorkerKey{ID: 8}] != 2 {
		t.Fatalf("device match %v", got)
	}
	got := tierResult(t, ix, &m)
	want := map[uint64][4]int32{7: {2, 1, 2, 1}, 9: {0, 3, 1, 0}, 10: {0, 0, 1, 0}}
	if len(got) != len(want) {
		t.Fatalf("tiers %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("worker %d: tiers %v, want %v", id, got[id], w)
		}
	}
	for _, x := range m.Tiers {
		if w, _ := ix.Worker(x.Slot); w.ID == 7 && x.Total() != 6 {
			t.Errorf("worker 7 total %d, want 6", x.Total())
		}
	}
	if n := testing.AllocsPerRun(100, func() { ix.Match(q, &m) }); n != 0 {
		t.Errorf("a tiered match allocates %v times", n)
	}
	// Each tier counts its own blocks; a slot holding blocks in any tier is not released.
	if ix.Blocks(w7) != 2 || host.Blocks(w7) != 1 || disk.Blocks(w7) != 2 || ext.Blocks(w7) != 1 {
		t.Errorf("block counts %d %d %d %d", ix.Blocks(w7), host.Blocks(w7), disk.Blocks(w7), ext.Blocks(w7))
	}
	if err := ix.Release(w9); !errors.Is(err, radix.ErrBusy) {
		t.Errorf("release of a slot with host blocks: %v", err)
	}
	// Without lower-tier hits the tier list is empty.
	ix.Match(chain(99), &m)
	if len(m.Tiers) != 0 {
		t.Errorf("tiers of an unknown prompt: %v", m.Tiers)
	}
}

// TestMatchTiersRandom checks the tier walk against the reference model on random holdings of
// one chain by many slots (bitsets of holders included), over every tier.
func TestMatchTiersRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 2))
	for round := range 40 {
		ix := newIndex(t, 4)
		var models [kvevent.NumTiers]*refmodel.Index
		models[kvevent.Device] = refmodel.NewIndex()
		q := chain(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
		workers := []int{3, 40, 200}[round%3]
		slots := make([]radix.Slot, workers)
		for w := range slots {
			slots[w] = acquire(t, ix, uint64(w))
		}
		for tier := range kvevent.NumTiers {
			if tier > 0 && r.IntN(4) == 0 {
				continue // a tier the model never used
			}
			tix := ix.EnsureTier(kvevent.Tier(tier))
			if models[tier] == nil {
				models[tier] = refmodel.NewIndex()
			}
			for w, s := range slots {
				// Runs of blocks with holes: what offloading and eviction leave.
				for i, k := range q {
					if r.IntN(3) > 0 && (i == 0 || r.IntN(4) > 0) {
						tix.Add(k, s)
						models[tier].Add(k, radix.WorkerKey{ID: uint64(w)})
					}
				}
			}
		}
		var m radix.Match
		for cut := 1; cut <= len(q); cut += 1 + r.IntN(5) {
			ix.Match(q[:cut], &m)
			if err := refmodel.CheckTiers(models, ix, q[:cut], &m); err != nil {
				t.Fatalf("round %d, %d workers, query of %d: %v", round, workers, cut, err)
			}
		}
	}
}
