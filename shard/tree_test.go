package shard

import (
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
)

// treeTokens returns n blocks of bs tokens starting at token first.
func treeTokens(first, n, bs int) []uint32 {
	t := make([]uint32, n*bs)
	for i := range t {
		t[i] = uint32(first + i)
	}
	return t
}

// TestDumpTree: with KeepTree, a worker's blocks come back with Dynamo's local hashes, each after
// its parent and naming it by engine hash; a block whose parent went away is left out (no match
// reaches it); the tree survives Export and Import; without KeepTree every block is left out.
func TestDumpTree(t *testing.T) {
	const bs = 4
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	a := NewApplier(0, nil)
	a.KeepTree = true
	var h radix.Hasher
	// Chain A: engine 10, 11, 12 (root first); chain B: engine 20 at the root, then 21 in a
	// second event chained onto 20; a salted chain C: engine 30.
	tokA := treeTokens(0, 3, bs)
	mustApply(t, a, ix, 1, &Event{Kind: Stored, Hashes: []uint64{10, 11, 12}, Tokens: tokA})
	mustApply(t, a, ix, 1, &Event{Kind: Stored, Hashes: []uint64{20}, Tokens: treeTokens(100, 1, bs)})
	mustApply(t, a, ix, 1, &Event{Kind: Stored, Hashes: []uint64{21}, Parent: 20, HasParent: true, Tokens: treeTokens(200, 1, bs)})
	mustApply(t, a, ix, 1, &Event{Kind: Stored, Hashes: []uint64{30}, Tokens: treeTokens(0, 1, bs), Salt: "tenant-a"})

	got, left := a.DumpTree(1, nil)
	if left != 0 || len(got) != 6 {
		t.Fatalf("dumped %d blocks, left %d: %+v", len(got), left, got)
	}
	localsA := h.AppendLocal(nil, tokA, bs, radix.BaseSeed)
	pos := map[uint64]int{}
	for i, b := range got {
		pos[b.Engine] = i
	}
	for i, eh := range []uint64{10, 11, 12} {
		b := got[pos[eh]]
		if b.Local != localsA[i] {
			t.Errorf("engine %d: local %x, want %x", eh, b.Local, localsA[i])
		}
		if i == 0 && b.HasParent || i > 0 && (!b.HasParent || b.Parent != eh-1 || pos[eh] != pos[eh-1]+1) {
			t.Errorf("engine %d: parent %d (%v) at %d, want the block before it, just before it", eh, b.Parent, b.HasParent, pos[eh])
		}
	}
	if b := got[pos[21]]; !b.HasParent || b.Parent != 20 || pos[21] < pos[20] {
		t.Errorf("engine 21: %+v, want after its parent 20", b)
	}
	salted := h.AppendLocal(nil, treeTokens(0, 1, bs), bs, radix.Seed("", "tenant-a"))
	if b := got[pos[30]]; b.Local != salted[0] || b.Seq != salted[0] || b.Local == localsA[0] {
		t.Errorf("salted block: %+v, want local and sequence hash %x", b, salted[0])
	}

	// The tree through a snapshot.
	rs := a.Export(1, nil)
	b := NewApplier(0, nil)
	b.KeepTree = true
	ix2, _ := radix.New(radix.Config{BlockSize: bs})
	if _, err := b.Import(ix2, 1, rs); err != nil {
		t.Fatal(err)
	}
	if again, left := b.DumpTree(1, nil); left != 0 || !slices.Equal(again, got) {
		t.Errorf("after Import: %+v (left %d), want %+v", again, left, got)
	}

	// The middle of chain A goes: 12 is unreachable and left out.
	mustApply(t, a, ix, 1, &Event{Kind: Removed, Hashes: []uint64{11}})
	if got, left = a.DumpTree(1, nil); left != 1 || len(got) != 4 {
		t.Errorf("after removing 11: %d blocks, %d left out, want 4 and 1", len(got), left)
	}

	// A store of local hashes (a Dynamo dump's event) builds the same index as the tokens.
	c := NewApplier(0, nil)
	ix3, _ := radix.New(radix.Config{BlockSize: bs})
	mustApply(t, c, ix3, 1, &Event{Kind: Stored, Hashes: []uint64{10, 11, 12}, Locals: localsA})
	seqs := h.AppendSequence(nil, tokA, bs, radix.BaseSeed)
	for _, seq := range seqs {
		if !ix3.Has(seq, 0) {
			t.Errorf("local-hash store: sequence %x missing", seq)
		}
	}
	if got, left := c.DumpTree(1, nil); len(got) != 0 || left != 3 {
		t.Errorf("without KeepTree: %d blocks, %d left out, want 0 and 3", len(got), left)
	}
}

func mustApply(t *testing.T, a *Applier, ix *radix.Index, id uint64, ev *Event) {
	t.Helper()
	if o := a.Apply(ix, id, ev); o.Status != OK {
		t.Fatalf("apply %+v: %v", ev, o)
	}
}

// TestDumpTreeTiers: lower-tier blocks are listed after the device's, tagged with their tier,
// a host block offloaded under a device parent naming it by the device's engine hash; replaying
// the dump (as a peer recovering from it does) rebuilds every tier.
func TestDumpTreeTiers(t *testing.T) {
	const bs = 4
	ix, _ := radix.New(radix.Config{BlockSize: bs})
	a := NewApplier(0, nil)
	a.KeepTree = true
	mustApply(t, a, ix, 1, &Event{Kind: Stored, Hashes: []uint64{10, 11}, Tokens: treeTokens(0, 2, bs)})
	mustApply(t, a, ix, 1, &Event{Kind: Stored, Tier: Host, Hashes: []uint64{12, 13}, Parent: 11, HasParent: true, Tokens: treeTokens(8, 2, bs)})
	mustApply(t, a, ix, 1, &Event{Kind: Stored, Tier: Disk, Hashes: []uint64{14}, Parent: 13, HasParent: true, Tokens: treeTokens(16, 1, bs)})
	got, left := a.DumpTree(1, nil)
	if left != 0 || len(got) != 5 {
		t.Fatalf("dumped %d blocks, left %d: %+v", len(got), left, got)
	}
	wantTiers := []Tier{Device, Device, Host, Host, Disk}
	wantParents := []uint64{0, 10, 11, 12, 13}
	for i, b := range got {
		if b.Tier != wantTiers[i] || b.Engine != uint64(10+i) || b.HasParent != (i > 0) || b.Parent != wantParents[i] {
			t.Errorf("block %d: %+v, want engine %d in tier %v after %d", i, b, 10+i, wantTiers[i], wantParents[i])
		}
	}
	// Replayed in order with local hashes, the dump rebuilds the same tiers.
	c := NewApplier(0, nil)
	ix2, _ := radix.New(radix.Config{BlockSize: bs})
	for _, b := range got {
		mustApply(t, c, ix2, 1, &Event{Kind: Stored, Tier: b.Tier, Hashes: []uint64{b.Engine}, Parent: b.Parent, HasParent: b.HasParent, Locals: []uint64{b.Local}})
	}
	var m1, m2 radix.Match
	ix.MatchTokens(treeTokens(0, 5, bs), radix.BaseSeed, &m1)
	ix2.MatchTokens(treeTokens(0, 5, bs), radix.BaseSeed, &m2)
	if len(m1.Tiers) != 1 || m1.Tiers[0].Blocks != [4]int32{2, 2, 1, 0} || !slices.Equal(m1.Tiers, m2.Tiers) {
		t.Fatalf("tiers %+v, replayed %+v; want device 2, host 2, disk 1", m1.Tiers, m2.Tiers)
	}
}
