package ingest

import (
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// BenchmarkZMQIngest measures the whole path: a fake engine publishing through real zmq4
// sockets on loopback into a Subscriber that feeds a router.Router (router), or a sink that
// drops the events (nop: transport and decoding alone). Each op is one batch of 32 stored
// events of 16 blocks of 16 tokens; blocks/s counts its stored blocks, applied once the
// router's Flush returns. The engine cycles through 256 distinct batches; from the second
// round on it removes a batch's blocks before storing them again, as a full cache evicts as
// much as it stores, so that the index stays at 131,072 blocks (and an op is two messages).
// The publisher stays at most 256 batches ahead of the subscriber: zmq4's PUB queue is
// unbounded.
func BenchmarkZMQIngest(b *testing.B) {
	b.Run("router", func(b *testing.B) {
		rt := router.New(router.Config{Shards: 2, BlockSize: 16, Logger: zmqTestLog()})
		defer rt.Close()
		benchZMQIngest(b, rt, rt.Flush)
	})
	b.Run("nop", func(b *testing.B) {
		benchZMQIngest(b, nopSink{}, func() error { return nil })
	})
}

func benchZMQIngest(b *testing.B, sink EventSink, flush func() error) {
	const (
		events, blocks, bs = 32, 16, 16
		distinct           = 256
		window             = 256
	)
	stores := make([][]byte, distinct)
	removes := make([][]byte, distinct)
	for i := range distinct {
		var st, rm []kvevent.Event
		for e := range events {
			hs := make([]uint64, blocks)
			toks := make([]uint32, 0, blocks*bs)
			for k := range hs {
				hs[k] = uint64((i*events+e)*blocks+k) + 1
				for j := range bs {
					toks = append(toks, uint32(hs[k])*bs+uint32(j))
				}
			}
			st = append(st, kvevent.Event{Kind: kvevent.Stored, Hashes: hs, BlockSize: bs, Tokens: toks})
			rm = append(rm, kvevent.Event{Kind: kvevent.Removed, Hashes: hs})
		}
		stores[i] = wire.AppendEngineBatch(nil, engineBatch(-1, st...), wire.EngineForm{})
		removes[i] = wire.AppendEngineBatch(nil, engineBatch(-1, rm...), wire.EngineForm{})
	}
	b.SetBytes(int64(len(stores[0])))
	b.ReportAllocs()

	eng := enginetest.Start(b, enginetest.Options{})
	sub := startSub(b, source(b, eng, 1, "bench"), sink, EngineConfig{})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))
	handed := func() int64 { return sub.s.ranks[0].c[cBatches].Load() }
	base := handed()

	b.ResetTimer()
	start := time.Now()
	sent := int64(0)
	seq := uint64(1)
	publish := func(p []byte) {
		for sent-(handed()-base) >= window {
			time.Sleep(20 * time.Microsecond)
		}
		r.Send(nil, be8(seq), p)
		seq++
		sent++
	}
	for i := range b.N {
		k := i % distinct
		if i >= distinct {
			publish(removes[k])
		}
		publish(stores[k])
	}
	for handed()-base < sent {
		time.Sleep(50 * time.Microsecond)
	}
	if err := flush(); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N*events*blocks)/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(float64(sent)/elapsed.Seconds(), "msgs/s")
	st := sub.Stats()
	if st.DecodeErrors != 0 || st.Gaps != 0 || st.Undelivered != 0 {
		b.Fatalf("stats %+v", st)
	}
}
