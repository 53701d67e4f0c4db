package radix

import (
	"bytes"
	"slices"
	"testing"
)

// TestTrackingGolden pins the keyed identities to Dynamo's own vector (lib/kv-router
// tracking_hash.rs, keyed_hash_vector_pins_scope_and_chain_framing): the same key, key id,
// scope and tokens give the same three identities.
func TestTrackingGolden(t *testing.T) {
	k, err := NewTrackingKey(bytes.Repeat([]byte{0x5a}, 32), "2026-01")
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 12)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	bs, cs := k.Seeds(TrackingScope{Model: "model-a", Group: "tenant-a", BlockSize: 4, Salt: "cache-a", LoRA: "adapter-a"})
	var h Hasher
	got := h.AppendTracking(nil, tokens, 4, bs, cs)
	want := []uint64{4_363_769_719_052_127_296, 14_998_523_962_162_619_427, 13_920_914_207_884_994_756}
	if !slices.Equal(got, want) {
		t.Errorf("keyed identities %v, want Dynamo's %v", got, want)
	}
}

// TestTrackingScope: the same key and scope give the same identities; another key, key id, or
// any field of the scope gives others, and none equals the public sequence hash.
func TestTrackingScope(t *testing.T) {
	tokens := make([]uint32, 48)
	for i := range tokens {
		tokens[i] = uint32(7 * i)
	}
	ids := func(key byte, id string, sc TrackingScope) []uint64 {
		t.Helper()
		k, err := NewTrackingKey(bytes.Repeat([]byte{key}, 32), id)
		if err != nil {
			t.Fatal(err)
		}
		var h Hasher
		bs, cs := k.Seeds(sc)
		return h.AppendTracking(nil, tokens, sc.BlockSize, bs, cs)
	}
	base := TrackingScope{Model: "m", Group: "default", BlockSize: 16}
	ref := ids(1, "e1", base)
	if len(ref) != 3 || !slices.Equal(ref, ids(1, "e1", base)) {
		t.Fatalf("not stable: %v", ref)
	}
	var h Hasher
	public := h.AppendSequence(nil, tokens, 16, BaseSeed)
	for i := range ref {
		if ref[i] == public[i] {
			t.Errorf("block %d: keyed identity equals the public hash", i)
		}
	}
	for name, other := range map[string][]uint64{
		"key":    ids(2, "e1", base),
		"key id": ids(1, "e2", base),
		"model":  ids(1, "e1", TrackingScope{Model: "n", Group: "default", BlockSize: 16}),
		"group":  ids(1, "e1", TrackingScope{Model: "m", Group: "g", BlockSize: 16}),
		"salt":   ids(1, "e1", TrackingScope{Model: "m", Group: "default", BlockSize: 16, Salt: "s"}),
		"lora":   ids(1, "e1", TrackingScope{Model: "m", Group: "default", BlockSize: 16, LoRA: "a"}),
	} {
		for i := range ref {
			if other[i] == ref[i] {
				t.Errorf("another %s: block %d has the same identity", name, i)
			}
		}
	}
	// A block size other than 16 takes the general path.
	if got := ids(1, "e1", TrackingScope{Model: "m", Group: "default", BlockSize: 8}); len(got) != 6 {
		t.Errorf("block size 8: %d identities", len(got))
	}
}

func TestTrackingKeyInvalid(t *testing.T) {
	f := func(key []byte, id string) {
		t.Helper()
		if _, err := NewTrackingKey(key, id); err == nil {
			t.Errorf("key of %d bytes, id %q: accepted", len(key), id)
		}
	}
	f(make([]byte, 31), "e")
	f(make([]byte, 33), "e")
	f(make([]byte, 32), "")
	f(make([]byte, 32), " e")
	f(make([]byte, 32), "e\n")
}

// TestTrackingAllocs: keyed identities, seeds derived once per scope, allocate nothing in
// steady state.
func TestTrackingAllocs(t *testing.T) {
	k, _ := NewTrackingKey(make([]byte, 32), "e")
	bs, cs := k.Seeds(TrackingScope{Model: "m", BlockSize: 16})
	tokens := make([]uint32, 4096)
	var h Hasher
	dst := make([]uint64, 0, 256)
	if n := testing.AllocsPerRun(100, func() { dst = h.AppendTracking(dst[:0], tokens, 16, bs, cs) }); n != 0 {
		t.Errorf("%v allocations per call", n)
	}
}
