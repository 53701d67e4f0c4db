package ingest

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
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
	if err := rt.Match(&wire.RouteRequest{Model: "m", Tokens: blockTokens(hashes)}, &resp); errors.Is(err, router.ErrUnknownModel) || errors.Is(err, router.ErrUnknownWorker) {
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
			// The subscriber counts the gap's outcome once the replay is over, which may be
			// just after its batches are applied.
			eventually(t, "the resume counted", func() bool { return statsDiff(sub.Stats(), c.stats) == "" })
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

// TestSubscriberResumeDifferential runs random streams of stores, removals and clears on the
// two ranks of an engine, stopping kvrouterd at random points (its subscription closed, its
// router snapshotted and restored into a new one, as a restart does) while the engine goes on
// publishing, and compares every rank's blocks with the reference model after each restart and
// at the end. Per-rank clears touch that rank alone; what the engine published during a
// downtime is replayed into the restored index while the engine's bounded replay buffer still
// holds it, and the rank is cleared when it no longer does, which the model then does too.
// Zero mismatches.
func TestSubscriberResumeDifferential(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { resumeDifferential(t, seed) })
	}
}

func resumeDifferential(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 77))
	eng := enginetest.Start(t, enginetest.Options{Ranks: 2, Replay: true})
	ref := refmodel.NewFleet(testBlock, 0)
	rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
	defer func() { rt.Close() }()
	start := func() *Subscriber {
		sub := startSub(t, source(t, eng, 9, "m"), rt, EngineConfig{Resume: rt.Batch})
		for r := range eng.Ranks() {
			fr := eng.Rank(r)
			probeNext(fr, subReady(sub, r))
		}
		return sub
	}
	// The engine's replay buffer keeps the last bufLen batches of each rank.
	bufLen := uint64(2 + rng.IntN(12))
	keep := func(fr *enginetest.Rank) { fr.Forget(max(fr.Next(), bufLen) - bufLen) }
	sub := start()
	held := [2][]uint64{}   // engine hashes each rank holds, as the reference applies them
	var stoppedAt [2]uint64 // each rank's next sequence when kvrouterd stopped
	next := uint64(1)
	up := true
	check := func(when string) {
		t.Helper()
		// Every batch published so far has been handed on once the subscription's batch count
		// covers the engine's sequences.
		eventually(t, "the batches handed on", func() bool {
			st := sub.Stats()
			return st.Ranks[0].LastSeq+1 == eng.Rank(0).Next() && st.Ranks[1].LastSeq+1 == eng.Rank(1).Next()
		})
		if err := rt.Flush(); err != nil {
			t.Fatal(err)
		}
		got := map[uint32]map[uint64]bool{0: {}, 1: {}}
		for _, d := range rt.DumpWorker(9, nil) {
			got[d.Rank][d.Seq] = true
		}
		for rank := range uint32(2) {
			want := ref.Index.BlocksOf(radix.WorkerKey{ID: 9, Rank: rank})
			if !maps.Equal(got[rank], want) && !(len(got[rank]) == 0 && len(want) == 0) {
				t.Fatalf("seed %d, %s: rank %d holds %d blocks, the model %d", seed, when, rank, len(got[rank]), len(want))
			}
		}
	}
	// restart starts the subscription again. A rank whose batches since the stop have left
	// the engine's buffer cannot be caught up: it is cleared, in the model too.
	restart := func() {
		for r := range eng.Ranks() {
			fr := eng.Rank(r)
			if fr.Next() > stoppedAt[r] && max(fr.Next(), bufLen)-bufLen > stoppedAt[r] {
				ref.Apply(9, &kvevent.Event{Kind: kvevent.Cleared, Rank: uint32(r)})
				held[r] = nil
			}
		}
		sub = start()
		up = true
	}
	for step := range 240 {
		rank := rng.IntN(2)
		var ev kvevent.Event
		switch p := rng.IntN(20); {
		case p == 0:
			ev = kvevent.Event{Kind: kvevent.Cleared}
			held[rank] = nil
		case p < 7 && len(held[rank]) > 0:
			h := held[rank][rng.IntN(len(held[rank]))]
			ev = removed(h)
			held[rank] = slices.DeleteFunc(held[rank], func(x uint64) bool { return x == h })
		default:
			parent := uint64(0)
			if len(held[rank]) > 0 && rng.IntN(2) == 0 {
				parent = held[rank][rng.IntN(len(held[rank]))]
			}
			hs := []uint64{next, next + 1}
			next += 2
			ev = stored(parent, hs...)
			held[rank] = append(held[rank], hs...)
		}
		ev.Rank = uint32(rank)
		refEv := ev
		ref.Apply(9, &refEv)
		b := engineBatch(-1, ev)
		form := wire.EngineForm{MapBatch: rank == 1, MapEvents: rank == 1}
		if up {
			eng.Rank(rank).Publish(b, form)
		} else {
			eng.Rank(rank).Drop(b, form)
		}
		keep(eng.Rank(rank))
		switch {
		case up && rng.IntN(30) == 0: // kvrouterd stops; the engine goes on
			check(fmt.Sprintf("step %d, before a stop", step))
			sub.Close()
			var chunks [][]byte
			if _, err := rt.Snapshot(0, func(c []byte) error { chunks = append(chunks, bytes.Clone(c)); return nil }); err != nil {
				t.Fatal(err)
			}
			rt.Close()
			rt = router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
			if _, err := rt.Restore(len(chunks), func(i int, dst []byte) ([]byte, error) { return append(dst, chunks[i]...), nil }); err != nil {
				t.Fatal(err)
			}
			for r := range eng.Ranks() {
				fr := eng.Rank(r)
				stoppedAt[r] = fr.Next()
			}
			up = false
		case !up && rng.IntN(8) == 0: // kvrouterd back, from its snapshot
			restart()
			check(fmt.Sprintf("step %d, after a restart", step))
		}
	}
	if !up {
		restart()
	}
	check("the end")
}

// TestSubscriberLateHistoryAtOnce: a rank subscribed to an engine that has gone idle (a replica
// started or registered late) holds the engine's whole cache as soon as its first connection is
// made, with no live batch after: the history is fetched on connecting, not on the next batch.
func TestSubscriberLateHistoryAtOnce(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{Replay: true})
	rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
	defer rt.Close()
	r := eng.Rank(0)
	r.Drop(engineBatch(-1, stored(0, 1, 2)), wire.EngineForm{})
	r.Drop(engineBatch(-1, stored(2, 3)), wire.EngineForm{})
	startSub(t, source(t, eng, 9, "m"), rt, EngineConfig{Resume: rt.Batch}) // returns once caught up
	if got := cachedDepth(t, rt, 1, 2, 3); got != 3 {
		t.Fatalf("%d cached blocks once subscribed, want 3 with no further batch", got)
	}
}

// TestSubscriberRestartFirstBatch: an engine that restarts while subscribed publishes its first
// batch (sequence 0) before the subscription reaches its new PUB socket. The restart shows at
// its next batch; batch 0 comes from the new engine's replay buffer, after the clear and before
// that batch, every time.
func TestSubscriberRestartFirstBatch(t *testing.T) {
	eng := enginetest.Start(t, enginetest.Options{Replay: true})
	sink := &recSink{}
	sub := startSub(t, source(t, eng, 3, "m"), sink, EngineConfig{})
	r := eng.Rank(0)
	r.Probe(subReady(sub, 0))
	b1, b2 := engineBatch(-1, stored(0, 1)), engineBatch(-1, stored(1, 2))
	r.Publish(b1, wire.EngineForm{})
	r.Publish(b2, wire.EngineForm{})
	waitEvents(t, sink, slices.Concat(lines(0, b1), lines(0, b2)))

	r.Restart()
	first, second := engineBatch(-1, stored(0, 5)), engineBatch(-1, stored(5, 6))
	r.Drop(first, wire.EngineForm{}) // batch 0: published before anyone listened again
	r.PublishUntil(second, wire.EngineForm{}, func() bool { return sub.Stats().Restarts > 0 })
	waitEvents(t, sink, slices.Concat(lines(0, b1), lines(0, b2), []string{cleared(0)}, lines(0, first), lines(0, second)))
	checkStats(t, sub.Stats(), map[string]int64{"restarts": 1, "clears": 1, "unrecovered": 0})
}
