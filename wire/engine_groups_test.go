package wire_test

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// A hybrid model's groups (group 0 sliding window, group 1 full attention here) are learned
// from stored events and decide the removals that name only a group index, in later batches
// too, per rank and per publisher (Dynamo's zmq_wire filter_reason and learn_metadata).
func TestEngineGroupsLearned(t *testing.T) {
	// A stored event of group g and kind k, positional or a tagged map.
	storedArr := func(h uint64, g uint64, k string) mp {
		return mp(nil).stored(11).arr(1).u(h).nil().arr(2).u(1).u(2).u(2).nil().str("GPU").nil().nil().u(g).str(k)
	}
	storedMap := func(h uint64, g uint64, k string) mp {
		return mp(nil).mapn(6).str("type").str("BlockStored").str("block_hashes").arr(1).u(h).
			str("token_ids").arr(2).u(1).u(2).str("block_size").u(2).str("group_idx").u(g).str("kv_cache_spec_kind").str(k)
	}
	// vLLM's removals: the group index only.
	removedArr := func(h, g uint64) mp { return mp(nil).arr(4).str("BlockRemoved").arr(1).u(h).str("GPU").u(g) }
	removedMap := func(h, g uint64) mp {
		return mp(nil).mapn(3).str("type").str("BlockRemoved").str("block_hashes").arr(1).u(h).str("group_idx").u(g)
	}
	ranked := func(rank uint64, n int, events mp) []byte {
		return append(mp(nil).arr(3).f(1.5).arr(n), events...).u(rank)
	}
	removedHashes := func(b *wire.EngineBatch) []uint64 {
		var hs []uint64
		for _, e := range b.Events {
			if e.Kind == kvevent.Removed {
				hs = append(hs, e.Hashes...)
			}
		}
		return hs
	}
	check := func(name string, b *wire.EngineBatch, payload []byte, want []uint64, filtered int) {
		t.Helper()
		if err := b.Decode(payload); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := removedHashes(b); len(got) != len(want) || (len(want) > 0 && got[0] != want[0]) || b.Filtered != filtered {
			t.Errorf("%s: removals kept %v, filtered %d; want %v, %d", name, got, b.Filtered, want, filtered)
		}
	}

	for _, form := range []struct {
		name    string
		stored  func(h, g uint64, k string) mp
		removed func(h, g uint64) mp
	}{{"positional", storedArr, removedArr}, {"tagged map", storedMap, removedMap}} {
		t.Run(form.name, func(t *testing.T) {
			teach := ranked(0, 2, append(form.stored(0xa, 1, "full_attention"), form.stored(0xa, 0, "sliding_window")...))

			// Unlearned: the index alone decides, 0 kept.
			var fresh wire.EngineBatch
			check("unlearned group 0", &fresh, ranked(0, 1, form.removed(0xd, 0)), []uint64{0xd}, 0)
			check("unlearned group 1", &fresh, ranked(0, 1, form.removed(0xe, 1)), nil, 1)

			// Learned in one batch, applied in the next: the sliding window's removal of D is
			// dropped, the full-attention group's removal of E kept.
			var b wire.EngineBatch
			check("teach", &b, teach, nil, 1)
			check("sliding-window removal", &b, ranked(0, 1, form.removed(0xd, 0)), nil, 1)
			check("full-attention removal", &b, ranked(0, 1, form.removed(0xe, 1)), []uint64{0xe}, 0)
			// Another rank has not been taught.
			check("other rank", &b, ranked(1, 1, form.removed(0xe, 1)), nil, 1)
			// A later store that says otherwise replaces what was learned.
			check("relearn", &b, ranked(0, 2, append(form.stored(0xb, 0, "full_attention"), form.removed(0xd, 0)...)), []uint64{0xd}, 0)

			// A reader of several publishers keeps a table per publisher.
			var p1, p2 wire.EngineGroups
			var shared wire.EngineBatch
			shared.Groups = &p1
			check("publisher 1 taught", &shared, teach, nil, 1)
			shared.Groups = &p2
			check("publisher 2 untaught", &shared, ranked(0, 1, form.removed(0xe, 1)), nil, 1)
			shared.Groups = &p1
			check("publisher 1 again", &shared, ranked(0, 1, form.removed(0xe, 1)), []uint64{0xe}, 0)
		})
	}

	// Position 9 of a BlockStored may hold Dynamo's own block_mm_infos: the group fields follow.
	var b wire.EngineBatch
	check("block_mm_infos first", &b, ranked(0, 2, append(mp(nil).stored(13).arr(1).u(1).nil().arr(2).u(1).u(2).u(2).nil().nil().nil().nil().
		arr(1).nil().u(3).str("mla_attention").u(64), removedArr(0x1, 3)...)), []uint64{0x1}, 0)
}

// Deciding groups allocates nothing once the batch and its table have grown.
func TestEngineGroupsAllocs(t *testing.T) {
	payload := readHex(t, "engine/hybrid_removals.hex")
	var b wire.EngineBatch
	if err := b.Decode(payload); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := b.Decode(payload); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per decode, want 0", n)
	}
}
