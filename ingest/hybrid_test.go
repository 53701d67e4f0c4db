package ingest

import (
	"context"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// hybridEvent is one event of a hybrid model's KV-cache group: a store of a chain under
// parent, or a removal naming only the group index, as vLLM publishes them.
type hybridEvent struct {
	removal bool
	parent  uint64
	hashes  []uint64
	group   int
	kind    string // stores only
}

// hybridPayload encodes evs as vLLM does: positional events in an array batch (its tuple form,
// group fields at positions 9-11 of a store and 3 of a removal), or tagged-map events in a map
// batch (its current form).
func hybridPayload(tagged bool, evs ...hybridEvent) []byte {
	var b []byte
	if tagged {
		b = msgp.AppendMapHeader(b, 2)
		b = msgp.AppendFloat64(msgp.AppendString(b, "ts"), 1700000000.5)
		b = msgp.AppendString(b, "events")
	} else {
		b = msgp.AppendFloat64(msgp.AppendArrayHeader(b, 2), 1700000000.5)
	}
	b = msgp.AppendArrayHeader(b, uint32(len(evs)))
	key := func(k string) {
		if tagged {
			b = msgp.AppendString(b, k)
		}
	}
	for _, e := range evs {
		hashes := func() {
			key("block_hashes")
			b = msgp.AppendArrayHeader(b, uint32(len(e.hashes)))
			for _, h := range e.hashes {
				b = msgp.AppendUint64(b, h)
			}
		}
		if e.removal {
			if tagged {
				b = msgp.AppendString(msgp.AppendString(msgp.AppendMapHeader(b, 4), "type"), "BlockRemoved")
			} else {
				b = msgp.AppendString(msgp.AppendArrayHeader(b, 4), "BlockRemoved")
			}
			hashes()
			key("medium")
			b = msgp.AppendString(b, "GPU")
			key("group_idx")
			b = msgp.AppendInt(b, e.group)
			continue
		}
		if tagged {
			b = msgp.AppendString(msgp.AppendString(msgp.AppendMapHeader(b, 8), "type"), "BlockStored")
		} else {
			b = msgp.AppendString(msgp.AppendArrayHeader(b, 11), "BlockStored")
		}
		hashes()
		key("parent_block_hash")
		if e.parent == 0 {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendUint64(b, e.parent)
		}
		key("token_ids")
		toks := blockTokens(e.hashes)
		b = msgp.AppendArrayHeader(b, uint32(len(toks)))
		for _, t := range toks {
			b = msgp.AppendUint32(b, t)
		}
		key("block_size")
		b = msgp.AppendInt(b, testBlock)
		if !tagged {
			b = msgp.AppendNil(b) // lora_id
		}
		key("medium")
		b = msgp.AppendString(b, "GPU")
		if !tagged {
			b = msgp.AppendNil(msgp.AppendNil(b)) // lora_name, extra_keys
		}
		key("group_idx")
		b = msgp.AppendInt(b, e.group)
		key("kv_cache_spec_kind")
		b = msgp.AppendString(b, e.kind)
	}
	return b
}

// TestSubscriberHybridRemovals: a hybrid model (group 0 sliding window, group 1 full attention,
// as gpt-oss lays them out) publishes its groups' events over real sockets in both of vLLM's
// forms. The sliding window evicting prompt D's blocks leaves them in the index; the full-
// attention group evicting prompt E's removes them: A and D keep their 4 blocks, E has none.
func TestSubscriberHybridRemovals(t *testing.T) {
	chain := func(first uint64) []uint64 { return []uint64{first, first + 1, first + 2, first + 3} }
	prompts := map[string][]uint64{"A": chain(1), "D": chain(11), "E": chain(21)}
	for _, tagged := range []bool{false, true} {
		name := "positional"
		if tagged {
			name = "tagged map"
		}
		t.Run(name, func(t *testing.T) {
			rt := router.New(router.Config{Shards: 2, Logger: zmqTestLog()})
			defer rt.Close()
			eng := enginetest.Start(t, enginetest.Options{})
			sub := startSub(t, source(t, eng, 5, "gpt-oss"), rt, EngineConfig{})
			r := eng.Rank(0)
			r.Probe(subReady(sub, 0))

			var stores []hybridEvent
			for _, p := range []string{"A", "D", "E"} {
				for _, g := range []struct {
					idx  int
					kind string
				}{{1, "full_attention"}, {0, "sliding_window"}} {
					stores = append(stores, hybridEvent{hashes: prompts[p], group: g.idx, kind: g.kind})
				}
			}
			publish := func(payload []byte) {
				seq := r.Record(payload)
				r.Send([]byte(""), enginetest.SeqFrame(seq), payload)
				eventually(t, "batch handed on", func() bool { return sub.Stats().Ranks[0].LastSeq == seq })
			}
			publish(hybridPayload(tagged, stores...))
			publish(hybridPayload(tagged,
				hybridEvent{removal: true, hashes: prompts["D"], group: 0},
				hybridEvent{removal: true, hashes: prompts["E"], group: 1}))
			if err := rt.Flush(); err != nil {
				t.Fatal(err)
			}
			got := map[string]uint32{}
			for p, hs := range prompts {
				var resp wire.RouteResponse
				if err := rt.Match(&wire.RouteRequest{Model: "gpt-oss", Tokens: blockTokens(hs)}, &resp); err != nil {
					t.Fatal(err)
				}
				for _, c := range resp.Candidates {
					got[p] += c.CachedBlocks
				}
			}
			if want := map[string]uint32{"A": 4, "D": 4, "E": 0}; got["A"] != want["A"] || got["D"] != want["D"] || got["E"] != want["E"] {
				t.Errorf("cached blocks %v, want %v", got, want)
			}
			checkStats(t, sub.Stats(), map[string]int64{"decode": 0, "events": 4})
		})
	}
}

// TestConsumerHybridRemovalsPerWorker: engine payloads read from the stream learn a hybrid
// model's groups per worker: worker 5's stores teach that its group 1 is full attention, so its
// group-1 removal applies; worker 6 taught nothing, so its group-1 removal is dropped as an
// untaught nonzero group, whatever worker 5 taught.
func TestConsumerHybridRemovalsPerWorker(t *testing.T) {
	r := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer r.Close()
	ctx := context.Background()
	cons, pub := consumerAndPublisher(t, r)
	const model = "gpt-oss"
	a := []uint64{1}
	send := func(worker uint64, payload []byte) uint64 {
		t.Helper()
		seq, err := pub.Engine(ctx, model, worker, 0, 0, payload)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	send(5, hybridPayload(false, hybridEvent{hashes: a, group: 1, kind: "full_attention"}, hybridEvent{hashes: a, group: 0, kind: "sliding_window"}))
	plain := wire.AppendEngineBatch(nil, engineBatch(-1, stored(0, 1)), wire.EngineForm{})
	send(6, plain)
	send(5, hybridPayload(true, hybridEvent{removal: true, hashes: a, group: 1}))
	last := send(6, hybridPayload(false, hybridEvent{removal: true, hashes: a, group: 1}))
	waitFor(t, "every batch", func() bool { return cons.LastSeq() == last })
	if got := cached(t, r, model, blockTokens(a)); got[5<<8] != 0 || got[6<<8] != 1 {
		t.Fatalf("cached blocks by worker<<8|rank: %v; want worker 5: 0, worker 6: 1", got)
	}
}
