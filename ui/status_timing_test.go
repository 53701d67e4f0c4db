package ui_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/ui"
)

// BenchmarkPageStatus measures one document (without its JSON encoding) for a fleet of ranks:
// what every MaxAge of an open page costs the daemon, on the goroutine serving it.
func BenchmarkPageStatus(b *testing.B) {
	for _, ranks := range []int{10, 1000} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			r := router.New(router.Config{BlockSize: 16, Shards: 4, Logger: slog.New(slog.DiscardHandler)})
			defer r.Close()
			for w := range ranks / 2 {
				if err := r.Register(router.Registration{ID: uint64(w), Model: "m", Ranks: []uint32{0, 1}}); err != nil {
					b.Fatal(err)
				}
			}
			p := ui.New(ui.Config{Router: r, LastSnapshot: time.Now})
			now := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				if st := p.Status(now); st.WorkersTotal != ranks {
					b.Fatalf("%d ranks, want %d", st.WorkersTotal, ranks)
				}
			}
		})
	}
}
