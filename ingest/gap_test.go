package ingest

import (
	"fmt"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestSubscriberGapPolicy: a rank loses a batch that removed a block and one that stored a
// block, over real sockets into a router. With a replay socket the gap is closed whatever the
// policy: the index is exact. Without one the batches are lost for good: KeepOnGap false (the
// daemon's --clear-on-gap) clears the rank before the batch that revealed the gap; KeepOnGap
// true keeps its blocks, as Dynamo does, and goes on — the block the lost removal named stays
// listed, the chain the lost store started is refused as an unknown parent, and the rest of
// the rank's cache is still there.
func TestSubscriberGapPolicy(t *testing.T) {
	for _, c := range []struct {
		replay, keep bool
		// The leading blocks held, after the gap, of the prompts [1 2 3 4], [10], [20 21] and
		// [30]: 30 is stored by the batch that reveals the gap, 20 and 21 by the lost batches,
		// 21 by the batch after them too (its parent 20 lost).
		want  [4]uint32
		stats map[string]int64
	}{
		{false, false, [4]uint32{0, 0, 0, 1}, map[string]int64{"gaps": 1, "unrecovered": 1, "kept": 0, "clears": 1, "replays": 0}},
		{false, true, [4]uint32{4, 1, 0, 1}, map[string]int64{"gaps": 1, "unrecovered": 1, "kept": 1, "clears": 0, "replays": 0}},
		{true, false, [4]uint32{4, 0, 2, 1}, map[string]int64{"gaps": 1, "recovered": 1, "unrecovered": 0, "clears": 0, "replayed": 2}},
		{true, true, [4]uint32{4, 0, 2, 1}, map[string]int64{"gaps": 1, "recovered": 1, "unrecovered": 0, "kept": 0, "clears": 0, "replayed": 2}},
	} {
		t.Run(fmt.Sprintf("replay=%v/keepOnGap=%v", c.replay, c.keep), func(t *testing.T) {
			rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
			defer rt.Close()
			eng := enginetest.Start(t, enginetest.Options{Replay: c.replay})
			sub := startSub(t, source(t, eng, 9, "m"), rt, EngineConfig{KeepOnGap: c.keep})
			r := eng.Rank(0)
			r.Probe(subReady(sub, 0))

			r.Publish(engineBatch(-1, stored(0, 1, 2, 3, 4), stored(0, 10)), wire.EngineForm{})
			r.Drop(engineBatch(-1, removed(10)), wire.EngineForm{})
			r.Drop(engineBatch(-1, stored(0, 20)), wire.EngineForm{})
			last := r.Publish(engineBatch(-1, stored(0, 30), stored(20, 21)), wire.EngineForm{})
			eventually(t, "the batch after the gap", func() bool { return sub.Stats().Ranks[0].LastSeq == last })

			got := [4]uint32{cachedDepth(t, rt, 1, 2, 3, 4), cachedDepth(t, rt, 10), cachedDepth(t, rt, 20, 21), cachedDepth(t, rt, 30)}
			if got != c.want {
				t.Errorf("held %v, want %v", got, c.want)
			}
			checkStats(t, sub.Stats(), c.stats)
		})
	}
}

// TestSubscriberResumeGapPolicy: a subscription that takes up a rank's stream after the last
// batch the index holds (a restarted kvrouterd) and finds the batches published meanwhile lost
// follows the same policy: cleared, or kept with KeepOnGap.
func TestSubscriberResumeGapPolicy(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepOnGap=%v", keep), func(t *testing.T) {
			rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
			defer rt.Close()
			eng := enginetest.Start(t, enginetest.Options{})
			r := eng.Rank(0)
			sub := startSub(t, source(t, eng, 9, "m"), rt, EngineConfig{})
			r.Probe(subReady(sub, 0))
			first := r.Publish(engineBatch(-1, stored(0, 1, 2)), wire.EngineForm{})
			eventually(t, "the first batch", func() bool { return sub.Stats().Ranks[0].LastSeq == first })
			sub.Close()

			r.Drop(engineBatch(-1, removed(2)), wire.EngineForm{}) // published while nobody listened
			sub2 := startSub(t, source(t, eng, 9, "m"), rt, EngineConfig{KeepOnGap: keep, Resume: rt.Batch})
			probeNext(r, func() bool { return sub2.Stats().Batches > 0 })

			want, stats := uint32(0), map[string]int64{"gaps": 1, "unrecovered": 1, "clears": 1, "kept": 0}
			if keep {
				want, stats = 2, map[string]int64{"gaps": 1, "unrecovered": 1, "clears": 0, "kept": 1} // the lost removal's block stays listed
			}
			if got := cachedDepth(t, rt, 1, 2); got != want {
				t.Errorf("held %d blocks, want %d", got, want)
			}
			checkStats(t, sub2.Stats(), stats)
		})
	}
}
