package ingest

import (
	"errors"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// probeNext publishes an empty batch under the rank's next sequence until ready: a new
// subscription reached the PUB socket. Unlike Probe, it may come after other batches.
func probeNext(r *enginetest.Rank, ready func() bool) {
	r.PublishUntil(&wire.EngineBatch{TS: 1}, wire.EngineForm{}, ready)
}

// cachedDepth is how many leading blocks of the prompt made of hashes worker 9's rank 0 holds
// in rt.
func cachedDepth(t *testing.T, rt *router.Router, hashes ...uint64) uint32 {
	t.Helper()
	if err := rt.Flush(); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	if err := rt.Match(&wire.RouteRequest{Model: "m", Tokens: blockTokens(hashes)}, &resp); errors.Is(err, router.ErrUnknownModel) {
		return 0 // nothing applied yet
	} else if err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.Candidates {
		if c.Worker == 9 && c.Rank == 0 {
			return c.CachedBlocks
		}
	}
	return 0
}

// TestSubscriberResume: a subscription that ends (kvrouterd stopped) and a new one that takes
// up the rank's stream after the last batch the index holds (EngineConfig.Resume, which the
// daemon reads from the snapshot it restored) gets what the engine published meanwhile from the
// replay socket: a block removed while nobody listened is not reported, one stored is. Without
// a replay socket the rank is cleared; an engine that restarted meanwhile clears it too. Never
// an overcount.
func TestSubscriberResume(t *testing.T) {
	for _, c := range []struct {
		name            string
		replay, restart bool
		want1, want3    uint32 // blocks of the prompts [1 2] and [3] held at the end
		// An engine that restarts and publishes more batches than it had before the index
		// resumes is not told apart from a gap: see seqTracker.
		stats map[string]int64
	}{
		{"replayed", true, false, 1, 1, map[string]int64{"gaps": 1, "recovered": 1, "clears": 0}},
		{"no replay socket", false, false, 0, 0, map[string]int64{"gaps": 1, "unrecovered": 1, "clears": 1}},
		{"engine restarted", true, true, 0, 0, map[string]int64{"restarts": 1, "clears": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			eng := enginetest.Start(t, enginetest.Options{Replay: c.replay})
			rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
			defer rt.Close()
			cfg := EngineConfig{Resume: rt.Batch}
			r := eng.Rank(0)
			first := startSub(t, source(t, eng, 9, "m"), rt, cfg)
			r.Probe(subReady(first, 0))
			r.Publish(engineBatch(-1, stored(0, 1, 2)), wire.EngineForm{})
			eventually(t, "the store applied", func() bool { return cachedDepth(t, rt, 1, 2) == 2 })
			first.Close()

			second := func() *Subscriber { return startSub(t, source(t, eng, 9, "m"), rt, cfg) }
			if c.restart {
				// The engine restarted while no one listened (its cache empty again) and
				// numbers its batches from 0: its first batch is one the index already
				// holds a batch of.
				r.ResetSeq()
				sub := second()
				r.Probe(subReady(sub, 0))
				eventually(t, "the restart noticed", func() bool { return sub.Stats().Clears == 1 })
				if cachedDepth(t, rt, 1, 2) != 0 {
					t.Fatal("the restarted engine's old blocks are still reported")
				}
				checkStats(t, sub.Stats(), c.stats)
				return
			}
			// While no one listens: block 2 goes, block 3 comes.
			r.Drop(engineBatch(-1, removed(2)), wire.EngineForm{})
			r.Drop(engineBatch(-1, stored(0, 3)), wire.EngineForm{})

			sub := second()
			probeNext(r, subReady(sub, 0))
			eventually(t, "the resumed rank settled", func() bool {
				return cachedDepth(t, rt, 1, 2) == c.want1 && cachedDepth(t, rt, 3) == c.want3
			})
			checkStats(t, sub.Stats(), c.stats)
		})
	}
}

// TestSubscriberHistory: a rank subscribed after its engine has been publishing (registered
// late, or kvrouterd started after the engine) gets the batches the engine's replay buffer still
// holds before the first live one.
func TestSubscriberHistory(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{Replay: true})
	rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
	defer rt.Close()
	r := eng.Rank(0)
	r.Drop(engineBatch(-1, stored(0, 1, 2)), wire.EngineForm{})
	r.Drop(engineBatch(-1, removed(2)), wire.EngineForm{})
	r.Drop(engineBatch(-1, stored(1, 4)), wire.EngineForm{})
	sub := startSub(t, source(t, eng, 9, "m"), rt, EngineConfig{Resume: rt.Batch})
	probeNext(r, subReady(sub, 0))
	eventually(t, "the history applied", func() bool { return cachedDepth(t, rt, 1, 4) == 2 })
	if got := cachedDepth(t, rt, 1, 2); got != 1 {
		t.Fatalf("block 2, removed in the history, still held: depth %d", got)
	}
	checkStats(t, sub.Stats(), map[string]int64{"gaps": 0, "clears": 0, "replays": 1})
}
