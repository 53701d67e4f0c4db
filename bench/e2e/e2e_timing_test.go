package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// benchDaemon starts a Daemon with workers 1 to 8 of model "sim" registered through a Remote.
func benchDaemon(b *testing.B) (*Daemon, *Remote) {
	b.Helper()
	d, err := StartDaemon(DaemonConfig{Router: router.Config{BlockSize: 16, Mode: scoring.KV}, Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Close() })
	rem, err := Dial(d.Target())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rem.Close() })
	for id := uint64(1); id <= 8; id++ {
		if err := rem.Register(router.Registration{ID: id, Model: "sim", BlockSize: 16}); err != nil {
			b.Fatal(err)
		}
	}
	return d, rem
}

// BenchmarkRemoteRoute: one route call over loopback HTTP in the binary format, and the
// complete call that frees it, as the simulation makes them: one at a time.
func BenchmarkRemoteRoute(b *testing.B) {
	for _, n := range []int{1024, 8192} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			_, rem := benchDaemon(b)
			req := wire.RouteRequest{Model: "sim", Tokens: make([]uint32, n)}
			for i := range req.Tokens {
				req.Tokens[i] = uint32(i)
			}
			var resp wire.RouteResponse
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				req.RequestID = fmt.Sprint(i)
				if err := rem.Route(&req, &resp); err != nil {
					b.Fatal(err)
				}
				if err := rem.Complete(req.RequestID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRemoteEvents: event batches published to the stream without waiting, and the time
// until the daemon has applied them all; each batch stores or removes four 16-token blocks.
func BenchmarkRemoteEvents(b *testing.B) {
	_, rem := benchDaemon(b)
	tokens := make([]uint32, 64)
	hashes := make([]uint64, 4)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	batch := wire.EventBatch{Worker: 1, Model: "sim", Events: make([]kvevent.Event, 1)}
	b.ReportAllocs()
	b.ResetTimer()
	// b.N rather than b.Loop: the timer must run through Drain.
	for id := uint64(1); id <= uint64(b.N); id++ {
		e := kvevent.Event{ID: id, Kind: kvevent.Removed, Hashes: hashes}
		if id%2 == 1 {
			e.Kind, e.Tokens, e.BlockSize = kvevent.Stored, tokens, 16
		}
		batch.Events[0] = e
		if err := rem.Events(&batch); err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rem.Drain(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if st := rem.Stats(); st.Errors != 0 {
		b.Fatalf("published %+v", st)
	}
}
