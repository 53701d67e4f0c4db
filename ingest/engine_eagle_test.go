package ingest

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestSubscriberEAGLE: the blocks an SGLang worker running EAGLE publishes, token ids as pairs,
// give it the cache credit for a request of the same tokens, through the ZMQ subscription into a
// router; at page size 4, against a worker holding the first block only, and at SGLang's
// default page size 1.
func TestSubscriberEAGLE(t *testing.T) {
	rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
	defer rt.Close()
	prompt := []uint32{128000, 791, 4062, 14198, 39935, 35308, 927, 279, 16053, 5679, 13, 578, 3290}

	for _, c := range []struct {
		model      string
		pageSize   int
		eagle      uint64 // the EAGLE worker
		plain      uint64 // a worker publishing plain token ids, the first block only; 0: none
		wantCached uint32
	}{
		{"eagle-p4", 4, 42, 43, 3}, // 13 tokens: 12 pairs, 3 pages
		{"eagle-p1", 1, 44, 0, 12}, // 12 pairs, 12 pages; the last token is the prompt's last
	} {
		t.Run(c.model, func(t *testing.T) {
			eng := enginetest.Start(t, enginetest.Options{})
			sub := startSub(t, source(t, eng, c.eagle, c.model), rt, EngineConfig{})
			eng.Rank(0).Probe(subReady(sub, 0))
			payload := enginetest.SGLangEAGLE(prompt, c.pageSize, -0x3b1f0e2a47550163)
			seq := eng.Rank(0).Record(payload)
			eng.Rank(0).Send(nil, enginetest.SeqFrame(seq), payload)
			want := int64(2) // the probe, then the batch
			if c.plain != 0 {
				plain := enginetest.Start(t, enginetest.Options{})
				psub := startSub(t, source(t, plain, c.plain, c.model), rt, EngineConfig{})
				plain.Rank(0).Probe(subReady(psub, 0))
				plain.Rank(0).Publish(engineBatch(-1, kvevent.Event{Kind: kvevent.Stored, BlockSize: c.pageSize,
					Hashes: []uint64{7}, Tokens: prompt[:c.pageSize]}), wire.EngineForm{})
				eventually(t, "the plain worker's batch", func() bool { return psub.Stats().Batches >= 2 })
			}
			eventually(t, "the EAGLE worker's batch", func() bool { st := sub.Stats(); return st.Batches+st.DecodeErrors >= want })
			if st := sub.Stats(); st.DecodeErrors != 0 {
				t.Fatalf("%d decode errors: the pairs were refused", st.DecodeErrors)
			}
			if err := rt.Flush(); err != nil {
				t.Fatal(err)
			}

			var resp wire.RouteResponse
			req := wire.RouteRequest{RequestID: "req-" + c.model, Model: c.model, Tokens: prompt}
			if err := rt.Route(&req, &resp); err != nil {
				t.Fatal(err)
			}
			cached := map[uint64]uint32{}
			for _, cand := range resp.Candidates {
				cached[cand.Worker] = cand.CachedBlocks
			}
			if resp.Worker != c.eagle || cached[c.eagle] != c.wantCached {
				t.Fatalf("routed to %d, cached blocks by worker %v; want %d with %d", resp.Worker, cached, c.eagle, c.wantCached)
			}
			// The same tokens hash alike however they were published.
			if c.plain != 0 && cached[c.plain] != 1 {
				t.Fatalf("plain worker %d: %d cached blocks, want 1", c.plain, cached[c.plain])
			}
		})
	}
}
