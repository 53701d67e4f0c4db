package router

import (
	"fmt"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// BenchmarkRouterRegister measures one registration of a worker's ranks beside a fleet of
// other workers: up to the cap (wire.MaxSnapshotRanks), accepted, then unregistered again; and
// far past it (100,000), refused.
func BenchmarkRouterRegister(b *testing.B) {
	for _, bc := range []struct{ fleet, ranks int }{{0, 1}, {0, wire.MaxSnapshotRanks}, {100, wire.MaxSnapshotRanks}, {0, 100_000}} {
		b.Run(fmt.Sprintf("fleet=%d/ranks=%d", bc.fleet, bc.ranks), func(b *testing.B) {
			r := New(Config{Logger: quiet()})
			defer r.Close()
			for id := range bc.fleet {
				if err := r.Register(Registration{ID: uint64(1000 + id), Model: "m", Ranks: ranks(0, wire.MaxSnapshotRanks)}); err != nil {
					b.Fatal(err)
				}
			}
			rs := ranks(0, bc.ranks)
			b.ReportAllocs()
			for b.Loop() {
				err := r.Register(Registration{ID: 1, Model: "m", Ranks: rs})
				if bc.ranks > wire.MaxSnapshotRanks {
					if err == nil {
						b.Fatal("accepted past the cap")
					}
					continue
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := r.Unregister(1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
