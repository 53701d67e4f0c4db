package shard_test

import (
	"maps"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

const bs = 4

// blk returns the tokens of blocks with the given content ids.
func blk(contents ...uint32) []uint32 {
	var t []uint32
	for _, c := range contents {
		for i := range uint32(bs) {
			t = append(t, c*100+i)
		}
	}
	return t
}

func stored(id uint64, hashes []uint64, contents ...uint32) *shard.Event {
	return &shard.Event{Kind: shard.Stored, ID: id, Hashes: hashes, Tokens: blk(contents...)}
}

func child(id, parent uint64, hashes []uint64, contents ...uint32) *shard.Event {
	ev := stored(id, hashes, contents...)
	ev.Parent, ev.HasParent = parent, true
	return ev
}

func removed(id uint64, hashes ...uint64) *shard.Event {
	return &shard.Event{Kind: shard.Removed, ID: id, Hashes: hashes}
}

// depths matches the prompt made of contents and returns each holder (worker, rank) → depth.
func depths(t *testing.T, ix *radix.Index, contents ...uint32) map[radix.WorkerKey]int {
	t.Helper()
	var m radix.Match
	ix.MatchTokens(blk(contents...), radix.BaseSeed, &m)
	out := map[radix.WorkerKey]int{}
	for i, s := range m.Slots {
		w, _ := ix.Worker(s)
		out[w] = int(m.Depth[i])
	}
	return out
}

type collector []shard.Outcome

func (c *collector) Observe(o shard.Outcome) { *c = append(*c, o) }

func TestApplierEvents(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	var seen collector
	a := shard.NewApplier(0, &seen)
	w := radix.WorkerKey{ID: 7}
	f := func(ev *shard.Event, want shard.Outcome, wantDepth int) {
		t.Helper()
		want.Worker, want.Rank, want.EventID, want.Kind = 7, ev.Rank, ev.ID, ev.Kind
		if got := a.Apply(ix, 7, ev); got != want {
			t.Fatalf("event %d: outcome %+v, want %+v", ev.ID, got, want)
		}
		got := depths(t, ix, 1, 2, 3, 4, 5)[w]
		if got != wantDepth {
			t.Fatalf("event %d: depth %d, want %d", ev.ID, got, wantDepth)
		}
	}
	f(stored(1, []uint64{101, 102, 103}, 1, 2, 3), shard.Outcome{Applied: 3}, 3)
	f(child(2, 103, []uint64{104}, 4), shard.Outcome{Applied: 1}, 4)
	f(child(3, 999, []uint64{105}, 5), shard.Outcome{Status: shard.UnknownParent}, 4)
	f(stored(3, []uint64{1}, 9), shard.Outcome{Status: shard.Duplicate}, 4)
	f(stored(2, []uint64{1}, 9), shard.Outcome{Status: shard.Duplicate}, 4)
	f(removed(4, 102), shard.Outcome{Applied: 1}, 1) // mid-chain: the chain ends at block 1
	f(removed(5, 555, 101), shard.Outcome{Status: shard.UnknownBlocks, Applied: 1, Skipped: 1}, 0)
	f(stored(9, []uint64{101}, 1), shard.Outcome{Applied: 1, Gap: 3}, 1)

	bad := stored(10, []uint64{201}, 2)
	bad.BlockSize = bs * 2
	f(bad, shard.Outcome{Status: shard.BadBlockSize}, 1)
	bad = stored(11, []uint64{201, 202}, 2)
	bad.Tokens = bad.Tokens[:len(bad.Tokens)-1]
	f(bad, shard.Outcome{Status: shard.BadTokens}, 1)
	f(&shard.Event{Kind: 77, ID: 12}, shard.Outcome{Status: shard.BadKind}, 1)

	// An offloaded copy coming and going does not touch the device copy with the same hash:
	// it goes to the host tier (parent 101 is the device's), and a disk removal of 101 names
	// nothing the disk tier holds.
	host := child(13, 101, []uint64{102}, 2)
	host.Tier = shard.Host
	f(host, shard.Outcome{Applied: 1}, 1)
	hostRm := removed(14, 101)
	hostRm.Tier = shard.Disk
	f(hostRm, shard.Outcome{Status: shard.UnknownBlocks, Skipped: 1}, 1)

	// Unnumbered events skip the cursor. Blocks 3 and 4 were never removed: depth 4 again.
	f(child(0, 101, []uint64{102}, 2), shard.Outcome{Applied: 1}, 4)
	if c := a.Cursor(7, 0); c != 14 {
		t.Fatalf("cursor %d, want 14", c)
	}
	for _, o := range seen {
		if !o.Anomalous() {
			t.Fatalf("observer got a normal outcome %+v", o)
		}
	}
	if len(seen) != 9 {
		t.Fatalf("observer got %d outcomes, want 9: %v", len(seen), seen)
	}
	st := a.Stats()
	if st.ByStatus[shard.Duplicate] != 2 || st.ByStatus[shard.UnknownParent] != 1 || st.Gaps != 1 || st.MissedIDs != 3 {
		t.Fatalf("stats %+v", st)
	}
	if st.Residencies != 5 || st.StoredBlocks != 7 || st.RemovedBlocks != 2 || st.TierResidencies != [4]int64{4, 1, 0, 0} {
		t.Fatalf("residencies %d (by tier %v) stored %d removed %d", st.Residencies, st.TierResidencies, st.StoredBlocks, st.RemovedBlocks)
	}
}

// tiers returns worker 7 rank 0's match of the prompt made of contents through the tiers:
// device depth, host, disk and external extensions.
func tiers(t *testing.T, ix *radix.Index, contents ...uint32) [4]int32 {
	t.Helper()
	var m radix.Match
	ix.MatchTokens(blk(contents...), radix.BaseSeed, &m)
	for _, x := range m.Tiers {
		if w, _ := ix.Worker(x.Slot); w == (radix.WorkerKey{ID: 7}) {
			return x.Blocks
		}
	}
	for i, s := range m.Slots {
		if w, _ := ix.Worker(s); w == (radix.WorkerKey{ID: 7}) {
			return [4]int32{m.Depth[i]}
		}
	}
	return [4]int32{}
}

// Lower-tier events are applied to their own tier: stored (with a parent held in another tier),
// removed and cleared per tier, each tier's engine hashes apart from the others'; a rank's
// removal and a clear after a gap clear every tier; the budget counts every tier.
func TestApplierTiers(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	a := shard.NewApplier(0, nil)
	a.ClearOnGap = true
	in := func(tier shard.Tier, ev *shard.Event) *shard.Event { ev.Tier = tier; return ev }
	apply := func(ev *shard.Event, want shard.Outcome, wantTiers [4]int32) {
		t.Helper()
		want.Worker, want.Rank, want.EventID, want.Kind = 7, ev.Rank, ev.ID, ev.Kind
		if got := a.Apply(ix, 7, ev); got != want {
			t.Fatalf("event %d: outcome %+v, want %+v", ev.ID, got, want)
		}
		if got := tiers(t, ix, 1, 2, 3, 4, 5, 6); got != wantTiers {
			t.Fatalf("event %d: tiers %v, want %v", ev.ID, got, wantTiers)
		}
	}
	apply(stored(1, []uint64{101, 102}, 1, 2), shard.Outcome{Applied: 2}, [4]int32{2})
	// Offload: block 3 goes to the host under its device parent 102, block 4 to disk under
	// the host's 103, block 5 to external under disk's 104.
	apply(in(shard.Host, child(2, 102, []uint64{103}, 3)), shard.Outcome{Applied: 1}, [4]int32{2, 1})
	apply(in(shard.Disk, child(3, 103, []uint64{104}, 4)), shard.Outcome{Applied: 1}, [4]int32{2, 1, 1})
	apply(in(shard.External, child(4, 104, []uint64{105}, 5)), shard.Outcome{Applied: 1}, [4]int32{2, 1, 1, 1})
	// The host also holds copies of blocks 1 and 2 under the same engine hashes: the device's
	// are untouched by the host's removal of them.
	apply(in(shard.Host, stored(5, []uint64{101, 102}, 1, 2)), shard.Outcome{Applied: 2}, [4]int32{2, 1, 1, 1})
	apply(in(shard.Host, removed(6, 101, 102)), shard.Outcome{Applied: 2}, [4]int32{2, 1, 1, 1})
	// The device evicts block 2: the host's block 3 no longer continues the device prefix.
	apply(removed(7, 102), shard.Outcome{Applied: 1}, [4]int32{1})
	apply(child(8, 101, []uint64{102}, 2), shard.Outcome{Applied: 1}, [4]int32{2, 1, 1, 1})
	if n := a.TierBlocks(7, shard.Host); n != 1 {
		t.Fatalf("host engine hashes %d, want 1", n)
	}
	// A clear of the disk tier clears the disk alone: the external block after it is stranded.
	apply(in(shard.Disk, &shard.Event{Kind: shard.Cleared, ID: 9}), shard.Outcome{Applied: 1}, [4]int32{2, 1})
	// A removal in a tier the rank never used names unknown blocks.
	ev := in(shard.External, removed(11, 999))
	ev.Rank = 1
	want := shard.Outcome{Worker: 7, Rank: 1, EventID: 11, Kind: shard.Removed, Status: shard.UnknownBlocks, Skipped: 1}
	if got := a.Apply(ix, 7, ev); got != want {
		t.Fatalf("removal on a fresh rank's tier: %+v", got)
	}
	if st := a.Stats(); st.Residencies != 4 || st.TierResidencies != [4]int64{2, 1, 0, 1} {
		t.Fatalf("residencies %d by tier %v", st.Residencies, st.TierResidencies)
	}
	// A gap clears every tier of the rank before the event applies.
	o := a.Apply(ix, 7, in(shard.Host, stored(20, []uint64{201}, 9)))
	if o.Gap != 10 || o.Cleared != 4 || o.Applied != 1 {
		t.Fatalf("gap outcome %+v", o)
	}
	if got := tiers(t, ix, 1, 2, 3); got != ([4]int32{}) {
		t.Fatalf("tiers after the gap %v", got)
	}
	// Removing the rank clears every tier and frees its slot.
	if n := a.RemoveRank(7, 0); n != 1 {
		t.Fatalf("RemoveRank removed %d, want 1", n)
	}
	if st := a.Stats(); st.Residencies != 0 || st.TierResidencies != ([4]int64{}) {
		t.Fatalf("after removal: residencies %d by tier %v", st.Residencies, st.TierResidencies)
	}
}

// The residency budget counts every tier: a host block takes the room a device block would.
func TestApplierTierBudget(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	a := shard.NewApplier(2, nil)
	if o := a.Apply(ix, 7, stored(1, []uint64{101}, 1)); o.Applied != 1 {
		t.Fatal(o)
	}
	ev := stored(2, []uint64{201, 202}, 2, 3)
	ev.Tier = shard.Host
	if o := a.Apply(ix, 7, ev); o.Applied != 1 || o.Status != shard.OverBudget || o.Skipped != 1 {
		t.Fatalf("host store over the budget: %+v", o)
	}
}

// Cleared on one rank clears that rank alone: each (worker, rank) is its own cache. The other
// ranks keep their blocks, cursors and chains, and no other worker changes.
func TestApplierClearOneRank(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	a := shard.NewApplier(0, nil)
	for _, rank := range []uint32{0, 1, 2} {
		ev := stored(1, []uint64{1, 2}, 1, 2)
		ev.Rank = rank
		a.Apply(ix, 5, ev)
	}
	a.Apply(ix, 6, stored(1, []uint64{1, 2}, 1, 2))
	o := a.Apply(ix, 5, &shard.Event{Kind: shard.Cleared, ID: 2, Rank: 1})
	if o.Status != shard.OK || o.Applied != 2 {
		t.Fatalf("clear: %+v, want rank 1's 2 blocks removed", o)
	}
	want := map[radix.WorkerKey]int{{ID: 5, Rank: 0}: 2, {ID: 5, Rank: 2}: 2, {ID: 6}: 2}
	if got := depths(t, ix, 1, 2); !maps.Equal(got, want) {
		t.Fatalf("after clear: %v, want %v", got, want)
	}
	// Ranks 0 and 2 keep their own cursors (1); rank 1 moved to 2.
	if a.Cursor(5, 0) != 1 || a.Cursor(5, 1) != 2 || a.Cursor(5, 2) != 1 {
		t.Fatal("clear changed other ranks' cursors")
	}
	// Rank 2 still chains onto its own blocks: a store with rank 2's last block as parent applies.
	ev := stored(2, []uint64{3}, 3)
	ev.Rank, ev.HasParent, ev.Parent = 2, true, 2
	if o := a.Apply(ix, 5, ev); o.Status != shard.OK || o.Applied != 1 {
		t.Fatalf("rank 2's chained store after rank 1's clear: %+v", o)
	}
}

// Two engine hashes for the same content (e.g. different cache salts): one removal must not drop
// the block while the other still holds it.
func TestApplierSameContentTwoHashes(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	a := shard.NewApplier(0, nil)
	a.Apply(ix, 1, stored(1, []uint64{11, 12}, 1, 2))
	if o := a.Apply(ix, 1, stored(2, []uint64{21, 22}, 1, 2)); o.Applied != 0 || o.Status != shard.OK {
		t.Fatalf("second hash of held content: %+v, want nothing new", o)
	}
	a.Apply(ix, 1, removed(3, 11, 12))
	if d := depths(t, ix, 1, 2)[radix.WorkerKey{ID: 1}]; d != 2 {
		t.Fatalf("after removing one copy: depth %d, want 2", d)
	}
	a.Apply(ix, 1, removed(4, 21))
	if d := depths(t, ix, 1, 2)[radix.WorkerKey{ID: 1}]; d != 0 {
		t.Fatalf("after removing both copies: depth %d, want 0", d)
	}
	// An engine hash reused for other content moves the residency.
	a.Apply(ix, 1, stored(5, []uint64{31}, 1))
	a.Apply(ix, 1, stored(6, []uint64{31}, 3))
	if d := depths(t, ix, 1)[radix.WorkerKey{ID: 1}]; d != 0 {
		t.Fatal("old content still held after its engine hash was reused")
	}
	if d := depths(t, ix, 3)[radix.WorkerKey{ID: 1}]; d != 1 {
		t.Fatal("new content not held")
	}
	if n := ix.Blocks(0); n != 2 { // 22 (content 1,2 block 2) and 31
		t.Fatalf("blocks %d, want 2", n)
	}
}

func TestApplierBudget(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	a := shard.NewApplier(3, nil)
	o := a.Apply(ix, 1, stored(1, []uint64{1, 2, 3, 4, 5}, 1, 2, 3, 4, 5))
	if o.Status != shard.OverBudget || o.Applied != 3 || o.Skipped != 2 {
		t.Fatalf("store past the budget: %+v", o)
	}
	// The skipped block is unknown: its children are refused, not put at the wrong depth.
	if o := a.Apply(ix, 1, child(2, 4, []uint64{6}, 6)); o.Status != shard.UnknownParent {
		t.Fatalf("child of a skipped block: %+v", o)
	}
	// Content already held under another hash needs no budget.
	if o := a.Apply(ix, 1, stored(3, []uint64{9}, 1)); o.Status != shard.OK {
		t.Fatalf("same content at the limit: %+v", o)
	}
	a.Apply(ix, 1, removed(4, 3))
	if o := a.Apply(ix, 1, child(5, 2, []uint64{3}, 3)); o.Status != shard.OK || o.Applied != 1 {
		t.Fatalf("store after room was made: %+v", o)
	}
	if st := ix.Stats(); st.Residencies != 3 {
		t.Fatalf("residencies %d, want 3", st.Residencies)
	}
}

func TestApplierWorkers(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	other, _ := radix.New(radix.Config{BlockSize: bs})
	a := shard.NewApplier(0, nil)
	a.Apply(ix, 1, stored(1, []uint64{1}, 1))
	if o := a.Apply(other, 1, stored(2, []uint64{2}, 2)); o.Status != shard.WrongModel {
		t.Fatalf("event for another model: %+v", o)
	}
	ev := stored(1, []uint64{1}, 1)
	ev.Rank = 3
	a.Apply(ix, 1, ev)
	if n := a.RemoveWorker(1); n != 2 {
		t.Fatalf("RemoveWorker removed %d, want 2", n)
	}
	if _, ok := ix.Lookup(radix.WorkerKey{ID: 1, Rank: 3}); ok {
		t.Fatal("removed worker still has a slot")
	}
	if a.Cursor(1, 0) != 0 {
		t.Fatal("removed worker kept its cursor")
	}
	// It may come back, to any model.
	if o := a.Apply(other, 1, stored(1, []uint64{2}, 2)); o.Status != shard.OK {
		t.Fatalf("returning worker: %+v", o)
	}
}

// With ClearOnGap an event after a gap first drops its rank's blocks (a missed removal would
// otherwise leave them reported), then applies; other ranks keep theirs.
func TestApplierClearOnGap(t *testing.T) {
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	a := shard.NewApplier(0, nil)
	a.ClearOnGap = true
	if o := a.Apply(ix, 7, stored(1, []uint64{101, 102}, 1, 2)); o.Status != shard.OK {
		t.Fatal(o)
	}
	r1 := stored(1, []uint64{201}, 1)
	r1.Rank = 1
	if o := a.Apply(ix, 7, r1); o.Status != shard.OK {
		t.Fatal(o)
	}
	o := a.Apply(ix, 7, stored(4, []uint64{301}, 3))
	if o.Status != shard.OK || o.Gap != 2 || o.Cleared != 2 || o.Applied != 1 {
		t.Fatalf("outcome %+v, want gap 2, 2 cleared, 1 applied", o)
	}
	if d := depths(t, ix, 1, 2)[radix.WorkerKey{ID: 7}]; d != 0 {
		t.Fatalf("rank 0 still caches %d blocks of the old prompt", d)
	}
	if d := depths(t, ix, 1)[radix.WorkerKey{ID: 7, Rank: 1}]; d != 1 {
		t.Fatalf("rank 1 lost its block: depth %d", d)
	}
	if st := a.Stats(); st.GapClears != 1 || st.Residencies != 2 {
		t.Fatalf("stats %+v, want one gap clear and 2 residencies", st)
	}
}
