package router

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/wire"
)

func trackingKey(t testing.TB, b byte) *radix.TrackingKey {
	t.Helper()
	k, err := radix.NewTrackingKey(bytes.Repeat([]byte{b}, 32), "2026-01")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// keyedIDs are the keyed tracking identities of tokens for model "m" (block size 16).
func keyedIDs(k *radix.TrackingKey, tokens []uint32, lora string) []uint64 {
	bs, cs := k.Seeds(radix.TrackingScope{Model: "m", Group: "default", BlockSize: 16, LoRA: lora})
	var h radix.Hasher
	return h.AppendTracking(nil, tokens, 16, bs, cs)
}

// TestTrackingKeyBooks: with a tracking key, a request is matched against the index by its
// public hashes but booked, shared with the replicas and selected under its keyed identities;
// a replica under the same key counts the blocks as shared with the same prompt, one under
// another key (or none) does not.
func TestTrackingKeyBooks(t *testing.T) {
	k1, k2 := trackingKey(t, 1), trackingKey(t, 2)
	f := &fakeSharer{}
	local := sharedFleet(t, Config{Share: f, TrackingKey: k1})
	public := sharedFleet(t, Config{})
	if a, b := answer(t, local, 0), answer(t, public, 0); !slices.Equal(a, b) {
		t.Fatalf("the key changed the match:\nkeyed  %+v\npublic %+v", a, b)
	}
	book := func(r *Router, id string, fam int, lora string) shareCall {
		t.Helper()
		req := wire.RouteRequest{RequestID: id, Model: "m", Tokens: prompt(fam), LoRA: lora, Mode: wire.ModeDirect, HasPinned: true, PinnedWorker: 2}
		var resp wire.RouteResponse
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		return f.take()[0]
	}
	c := book(local, "x", 0, "")
	if want := keyedIDs(k1, prompt(0), ""); !slices.Equal(c.seqs, want) {
		t.Fatalf("shared %v, want the keyed identities %v", c.seqs, want)
	}
	var h radix.Hasher
	if pub := h.AppendSequence(nil, prompt(0), 16, radix.LoRASeed("")); slices.ContainsFunc(c.seqs, func(s uint64) bool { return slices.Contains(pub, s) }) {
		t.Fatalf("a keyed identity is a public hash: %v, %v", c.seqs, pub)
	}
	// Family 1 shares 6 blocks with x: worker 2 then counts 8 + 8 − 6 decode blocks.
	if a := answer(t, local, 1); a[1].ActiveBlocks != 10 {
		t.Fatalf("keyed router, worker 2: %+v", a[1])
	}
	for _, r := range []struct {
		name string
		key  *radix.TrackingKey
		want uint32
	}{{"same key", k1, 10}, {"another key", k2, 16}, {"no key", nil, 16}} {
		remote := sharedFleet(t, Config{TrackingKey: r.key})
		if err := remote.BookRemote("A", c.model, c.worker, c.id, c.seqs, c.prefill, time.Minute); err != nil {
			t.Fatal(err)
		}
		if a := answer(t, remote, 1); a[1].ActiveBlocks != r.want {
			t.Errorf("%s: worker 2 counts %d decode blocks, want %d", r.name, a[1].ActiveBlocks, r.want)
		}
	}
	// An adapter's requests are booked under the adapter's scope.
	if c := book(local, "y", 2, "adapter-a"); !slices.Equal(c.seqs, keyedIDs(k1, prompt(2), "adapter-a")) {
		t.Fatalf("adapter: shared %v", c.seqs)
	}
	// A selection books the keyed identities, unless the client gave its own.
	var sel Selection
	if err := local.Select(&wire.RouteRequest{Model: "m", Tokens: prompt(0)}, SelectOptions{}, &sel); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sel.Seqs, keyedIDs(k1, prompt(0), "")) {
		t.Fatalf("selection books %v", sel.Seqs)
	}
	given := []uint64{11, 12, 13, 14, 15, 16, 17, 18}
	if err := local.Select(&wire.RouteRequest{Model: "m", Tokens: prompt(0)}, SelectOptions{Seqs: given}, &sel); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sel.Seqs, given) {
		t.Fatalf("selection with given hashes books %v", sel.Seqs)
	}
}

// TestTrackingKeyAllocs: keyed identities add no allocation to a route, with or without an
// adapter.
func TestTrackingKeyAllocs(t *testing.T) {
	r := sharedFleet(t, Config{Share: nopSharer{}, TrackingKey: trackingKey(t, 1)})
	for _, lora := range []string{"", "adapter-a"} {
		req := wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: prompt(0), LoRA: lora}
		var resp wire.RouteResponse
		allocFree(t, "a keyed route", func() {
			if err := r.Route(&req, &resp); err != nil {
				t.Fatal(err)
			}
			if err := r.Complete(req.RequestID); err != nil {
				t.Fatal(err)
			}
		})
	}
}
