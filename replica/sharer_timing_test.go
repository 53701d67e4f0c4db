package replica

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// BenchmarkSharerBooked measures what sharing adds to a booking on the route path: encode the
// booking and hand it to the NATS connection (over TCP to the embedded server, where this
// connection has no echo, as the daemon's).
func BenchmarkSharerBooked(b *testing.B) {
	s := embedded(b)
	for _, blocks := range []int{8, 128, 2048} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			sh, err := New(Config{Replica: "A", Logger: quietLog()})
			if err != nil {
				b.Fatal(err)
			}
			if err := sh.Start(ownConn(b, s.ClientURL()), nopSink{}); err != nil {
				b.Fatal(err)
			}
			defer sh.Close()
			seqs := make([]uint64, blocks)
			id := "0b5c1c6e-9a43-4a8e-8f6e-2f0d1e3c4b5a"
			const model = "meta-llama/Llama-3.1-8B"
			b.SetBytes(int64(len(Append(nil, &Msg{Op: OpBooked, Replica: "A", ID: id, Model: model, Seqs: seqs}))))
			b.ReportAllocs()
			for b.Loop() {
				sh.Booked(model, radix.WorkerKey{ID: 3}, id, seqs, 2048, 300*time.Second)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, blocks := range []int{8, 128, 2048} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			msg := Append(nil, &Msg{Op: OpBooked, Replica: "9f3c2a7be1d04c55", ID: "0b5c1c6e-9a43-4a8e-8f6e-2f0d1e3c4b5a",
				Model: "meta-llama/Llama-3.1-8B", TTL: 300_000, Seqs: make([]uint64, blocks)})
			var m Msg
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if err := Decode(msg, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRouteShared measures a request's route and completion (128-block prompt, 8
// workers), without sharing and with it: two replicas on the embedded server, the other one
// applying every booking and completion.
func BenchmarkRouteShared(b *testing.B) {
	s := embedded(b)
	for _, share := range []bool{false, true} {
		b.Run(fmt.Sprintf("share=%v", share), func(b *testing.B) {
			var sh *Sharer
			cfg := router.Config{Shards: 1, Logger: quietLog()}
			if share {
				var err error
				if sh, err = New(Config{Replica: "A", Logger: quietLog()}); err != nil {
					b.Fatal(err)
				}
				cfg.Share = sh
			}
			r := router.New(cfg)
			defer r.Close()
			other := router.New(router.Config{Shards: 1, Logger: quietLog()})
			defer other.Close()
			for w := uint64(1); w <= 8; w++ {
				for _, x := range []*router.Router{r, other} {
					if err := x.Register(router.Registration{ID: w, Model: "m", BlockSize: 16}); err != nil {
						b.Fatal(err)
					}
				}
			}
			if share {
				if err := sh.Start(ownConn(b, s.ClientURL()), r); err != nil {
					b.Fatal(err)
				}
				defer sh.Close()
				osh, err := New(Config{Replica: "B", Logger: quietLog()})
				if err != nil {
					b.Fatal(err)
				}
				if err := osh.Start(ownConn(b, s.ClientURL()), other); err != nil {
					b.Fatal(err)
				}
				defer osh.Close()
			}
			req := wire.RouteRequest{RequestID: "req", Model: "m", Tokens: toks(0, 2048)}
			var resp wire.RouteResponse
			b.ReportAllocs()
			for b.Loop() {
				if err := r.Route(&req, &resp); err != nil {
					b.Fatal(err)
				}
				if err := r.Complete(req.RequestID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
