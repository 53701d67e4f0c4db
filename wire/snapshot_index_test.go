package wire_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

var goldenIndex = wire.SnapshotIndex{
	Model: "m", Tier: kvevent.Host, Salt: 0x5a17,
	Slots:   []wire.SnapshotSlot{{ID: 7, Rank: 0}, {ID: 7, Rank: 1}, {ID: 9, Rank: 0}},
	Keys:    []uint64{0x1111, 0x2222, 0x3333},
	Counts:  []uint32{1, 3, 2},
	Holders: []uint32{2, 0, 1, 2, 0, 2},
}

// TestSnapshotIndexRoundTrip: the index section's message and the header decode to what was
// written, with the layout SPEC.md §12 gives; bad holders, counts and versions are refused with
// the field named.
func TestSnapshotIndexRoundTrip(t *testing.T) {
	x := goldenIndex
	if err := x.Validate(); err != nil {
		t.Fatal(err)
	}
	b := wire.AppendSnapshotIndex(nil, &x)
	// Header 12, model 2+1, tier 4, salt 8, n_slots 4 + 3×12, n_blocks 4 + 3×12, n_holders 4 + 6×4.
	if want := 12 + 3 + 4 + 8 + 4 + 36 + 4 + 36 + 4 + 24; len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	var got wire.SnapshotIndex
	if err := wire.DecodeSnapshotIndex(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, x) {
		t.Fatalf("decoded %+v, want %+v", got, x)
	}
	bad := func(name, field string, mutate func(*wire.SnapshotIndex)) {
		t.Helper()
		y := goldenIndex
		y.Counts, y.Holders = append([]uint32(nil), y.Counts...), append([]uint32(nil), y.Holders...)
		mutate(&y)
		var e *wire.Error
		if err := wire.DecodeSnapshotIndex(wire.AppendSnapshotIndex(nil, &y), &got); !errors.As(err, &e) || e.Field != field {
			t.Errorf("%s: %v, want an error naming %s", name, err, field)
		}
	}
	bad("a slot out of range", "holders[1]", func(y *wire.SnapshotIndex) { y.Holders[1] = 3 })
	bad("holders not ascending", "holders[2]", func(y *wire.SnapshotIndex) { y.Holders[2] = 0 })
	bad("a block without holders", "counts[0]", func(y *wire.SnapshotIndex) { y.Counts[0] = 0 })
	bad("more holders counted than written", "counts[2]", func(y *wire.SnapshotIndex) { y.Counts[2] = 3 })
	bad("holders left over", "n_holders", func(y *wire.SnapshotIndex) { y.Counts[2] = 1 })
	bad("a tier that does not exist", "tier", func(y *wire.SnapshotIndex) { y.Tier = kvevent.NumTiers })

	h := wire.AppendSnapshotHeader(nil, wire.SnapshotHeader{Version: wire.SnapshotVersion, IndexSection: true})
	var hd wire.SnapshotHeader
	if err := wire.DecodeSnapshotHeader(h, &hd); err != nil || !hd.IndexSection || hd.Version != 2 {
		t.Fatalf("header %+v, %v", hd, err)
	}
	if typ, _, err := wire.ParseHeader(h); err != nil || typ != wire.TypeSnapshotHeader {
		t.Fatalf("ParseHeader: %v %v", typ, err)
	}
	future := wire.AppendSnapshotHeader(nil, wire.SnapshotHeader{Version: 3})
	if err := wire.DecodeSnapshotHeader(future, &hd); !errors.Is(err, wire.ErrVersion) || !bytes.Contains([]byte(err.Error()), []byte("format 3")) {
		t.Errorf("a later format: %v, want ErrVersion naming it", err)
	}
}

func FuzzDecodeSnapshotIndex(f *testing.F) {
	prev := wire.AppendSnapshotIndex(nil, &goldenIndex)
	f.Add(prev)
	f.Add(wire.AppendSnapshotHeader(nil, wire.SnapshotHeader{Version: 2, IndexSection: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h wire.SnapshotHeader
		if wire.DecodeSnapshotHeader(b, &h) == nil {
			if enc := wire.AppendSnapshotHeader(nil, h); !bytes.Equal(enc, b) {
				t.Fatalf("header re-encoded\n%x\nfrom\n%x", enc, b)
			}
		}
		var fresh, reused wire.SnapshotIndex
		if err := wire.DecodeSnapshotIndex(prev, &reused); err != nil {
			t.Fatal(err)
		}
		err := wire.DecodeSnapshotIndex(b, &fresh)
		if err2 := wire.DecodeSnapshotIndex(b, &reused); (err == nil) != (err2 == nil) {
			t.Fatalf("fresh: %v, reused: %v", err, err2)
		}
		if err != nil {
			return
		}
		if err := fresh.Validate(); err != nil {
			t.Fatalf("decoded a value that does not validate: %v", err)
		}
		if enc := wire.AppendSnapshotIndex(nil, &fresh); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", enc, b)
		}
		if enc := wire.AppendSnapshotIndex(nil, &reused); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded after reuse\n%x\nfrom\n%x", enc, b)
		}
	})
}
