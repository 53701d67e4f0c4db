package fuzz

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// observed collects the anomalous outcomes a Router reports.
type observed struct {
	mu  sync.Mutex
	out []shard.Outcome
}

func (o *observed) Observe(oc shard.Outcome) {
	o.mu.Lock()
	o.out = append(o.out, oc)
	o.mu.Unlock()
}

func (o *observed) take() []shard.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.out
	o.out = nil
	return out
}

// engineSeeds are engine batches of the shapes vLLM and SGLang publish: chains from the root and
// from a parent, removals, a clear, another medium, a LoRA adapter, multimodal hashes.
func engineSeeds() []*wire.EngineBatch {
	toks := func(from uint32, blocks int) []uint32 {
		t := make([]uint32, blocks*streamBS)
		for i := range t {
			t[i] = from + uint32(i)
		}
		return t
	}
	stored := func(hashes []uint64, parent uint64, tokens []uint32) kvevent.Event {
		return kvevent.Event{Kind: kvevent.Stored, Hashes: hashes, Parent: parent, HasParent: parent != 0,
			Tokens: tokens, BlockSize: streamBS}
	}
	return []*wire.EngineBatch{
		{TS: 1, Events: []kvevent.Event{stored([]uint64{11, 12, 13}, 0, toks(1, 3))}},
		{TS: 2, Rank: 1, HasRank: true, Events: []kvevent.Event{
			stored([]uint64{21, 22}, 0, toks(1, 2)),
			stored([]uint64{23}, 22, toks(100, 1)),
			{Kind: kvevent.Removed, Hashes: []uint64{21}}}},
		{TS: 3, Events: []kvevent.Event{
			stored([]uint64{1 << 63, 1<<63 | 1}, 0, toks(7, 2)),
			{Kind: kvevent.Removed, Hashes: []uint64{1 << 63, 99}},
			{Kind: kvevent.Cleared},
			stored([]uint64{31}, 0, toks(1, 1))}},
		{TS: 4, Events: []kvevent.Event{
			{Kind: kvevent.Stored, Hashes: []uint64{41}, Tokens: toks(1, 1), Tier: kvevent.Host},
			{Kind: kvevent.Stored, Hashes: []uint64{42}, Tokens: toks(1, 1), LoRA: "adapter-a"},
			{Kind: kvevent.Stored, Hashes: []uint64{43, 44}, Tokens: toks(50, 2), MM: [][]uint64{{0xabc}, nil}}}},
		{TS: 5, Rank: 2, HasRank: true},
	}
}

// hybrid is what vLLM publishes for a hybrid model whose KV-cache group 0 is sliding-window
// and group 1 full attention, positional or as tagged maps: teach stores two chained blocks in
// both groups, under the same engine hashes, each event naming its group and kind; remove has
// group 0 evict the second block and group 1 evict the first, naming the group index alone, as
// vLLM's removals do. Only group 1's events reach the index (wire/SPEC.md §10.4).
func hybrid(tagged bool) (teach, remove []byte) {
	event := func(b []byte, kind string, fields int) []byte {
		if tagged {
			b = msgp.AppendMapHeader(b, uint32(fields))
			b = msgp.AppendString(b, "type")
			return msgp.AppendString(b, kind)
		}
		return msgp.AppendString(msgp.AppendArrayHeader(b, uint32(fields)), kind)
	}
	key := func(b []byte, k string) []byte {
		if tagged {
			return msgp.AppendString(b, k)
		}
		return b
	}
	teach = msgp.AppendFloat64(msgp.AppendArrayHeader(nil, 3), 7)
	teach = msgp.AppendArrayHeader(teach, 4)
	for _, g := range []struct {
		idx  int
		kind string
	}{{1, "full_attention"}, {0, "sliding_window"}} {
		for blk := range 2 {
			if tagged {
				teach = event(teach, "BlockStored", 7)
			} else {
				teach = event(teach, "BlockStored", 11)
			}
			teach = msgp.AppendUint64(msgp.AppendArrayHeader(key(teach, "block_hashes"), 1), uint64(501+blk))
			teach = key(teach, "parent_block_hash")
			if blk == 0 {
				teach = msgp.AppendNil(teach)
			} else {
				teach = msgp.AppendUint64(teach, 501)
			}
			teach = msgp.AppendArrayHeader(key(teach, "token_ids"), streamBS)
			for i := range streamBS {
				teach = msgp.AppendInt(teach, 1+blk*streamBS+i)
			}
			teach = msgp.AppendInt(key(teach, "block_size"), streamBS)
			if !tagged {
				teach = msgp.AppendNil(teach) // lora_id
				teach = msgp.AppendString(teach, "GPU")
				teach = msgp.AppendNil(msgp.AppendNil(teach)) // lora_name, extra_keys
			}
			teach = msgp.AppendInt(key(teach, "group_idx"), g.idx)
			teach = msgp.AppendString(key(teach, "kv_cache_spec_kind"), g.kind)
		}
	}
	teach = msgp.AppendNil(teach)
	remove = msgp.AppendFloat64(msgp.AppendArrayHeader(nil, 3), 8)
	remove = msgp.AppendArrayHeader(remove, 2)
	for _, r := range []struct{ hash, group int }{{502, 0}, {501, 1}} {
		remove = event(remove, "BlockRemoved", 4)
		remove = msgp.AppendUint64(msgp.AppendArrayHeader(key(remove, "block_hashes"), 1), uint64(r.hash))
		remove = msgp.AppendString(key(remove, "medium"), "GPU")
		remove = msgp.AppendInt(key(remove, "group_idx"), r.group)
	}
	return teach, msgp.AppendNil(remove)
}

// sglangEagle is what an SGLang worker running EAGLE publishes once it caches tokens 1…9 at page
// size streamBS: the tokens' pairs (token i, token i+1), two pages of them, one BlockStored each,
// chained by signed hashes, token_ids the page's pairs (wire/SPEC.md §10.4).
func sglangEagle() []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 6)
	b = msgp.AppendArrayHeader(b, 2)
	for p := range 2 {
		b = msgp.AppendArrayHeader(b, 7)
		b = msgp.AppendString(b, "BlockStored")
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendInt64(b, -100-int64(p))
		if p == 0 {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendInt64(b, -100)
		}
		b = msgp.AppendArrayHeader(b, streamBS)
		for i := p*streamBS + 1; i <= (p+1)*streamBS; i++ {
			b = msgp.AppendArrayHeader(b, 2)
			b = msgp.AppendInt(b, i)
			b = msgp.AppendInt(b, i+1)
		}
		b = msgp.AppendInt(b, streamBS)
		b = msgp.AppendNil(b)
		b = msgp.AppendString(b, "GPU")
	}
	return msgp.AppendInt(b, 0)
}

// trtllmMM is a TensorRT-LLM batch: one BlockStored (a tagged map) of a block whose last
// position holds image, given as its identifier (a str token id) and named in mm_keys.
func trtllmMM(hash int64, image string) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 7)
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendMapHeader(b, 7)
	b = msgp.AppendString(b, "type")
	b = msgp.AppendString(b, "BlockStored")
	b = msgp.AppendString(b, "block_hashes")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendInt64(b, hash)
	b = msgp.AppendString(b, "parent_block_hash")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "token_ids")
	b = msgp.AppendArrayHeader(b, streamBS)
	for i := 1; i < streamBS; i++ {
		b = msgp.AppendInt(b, i)
	}
	b = msgp.AppendString(b, image)
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt(b, streamBS)
	b = msgp.AppendString(b, "medium")
	b = msgp.AppendString(b, "GPU")
	b = msgp.AppendString(b, "mm_keys")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendMapHeader(b, 4)
	b = msgp.AppendString(b, "type")
	b = msgp.AppendString(b, "mm_key")
	b = msgp.AppendString(b, "hash")
	b = msgp.AppendString(b, image)
	b = msgp.AppendString(b, "start_offset")
	b = msgp.AppendInt(b, streamBS-1)
	b = msgp.AppendString(b, "uuid")
	b = msgp.AppendString(b, "u-"+image[:4])
	return msgp.AppendInt(b, 0)
}

// FuzzEngineIngest hands pairs of engine payloads (msgpack, every form vLLM and SGLang use) to
// the path the ZMQ Subscriber and the NATS consumer take: wire.EngineBatch.Decode, the socket's
// rank for a batch that states none, router.Ingest. A payload the decoder refuses gets a
// *wire.Error naming a field, one the router refuses a *router.FieldError, and neither changes
// the router. After each accepted batch the index holds exactly the blocks the reference fleet
// (internal/refmodel) holds, per rank, the anomalies the router reports are the model's, and
// matches from the root agree with the model's.
func FuzzEngineIngest(f *testing.F) {
	seeds := engineSeeds()
	forms := []wire.EngineForm{{}, {MapBatch: true, MapEvents: true}, {MapEvents: true},
		{Hashes: wire.HashInt64}, {Hashes: wire.HashBytes32}, {MapBatch: true, Hashes: wire.HashBytes32}}
	for i, form := range forms {
		a, b := seeds[i%len(seeds)], seeds[(i+1)%len(seeds)]
		f.Add(wire.AppendEngineBatch(nil, a, form), wire.AppendEngineBatch(nil, b, form), uint8(i))
	}
	f.Add(wire.AppendEngineBatch(nil, seeds[0], forms[0]), []byte{0x93, 0xcb}, uint8(0)) // truncated
	f.Add([]byte{}, wire.AppendEngineBatch(nil, seeds[2], forms[1]), uint8(3))
	f.Add(sglangEagle(), wire.AppendEngineBatch(nil, seeds[1], forms[0]), uint8(0))
	f.Add(trtllmMM(-200, strings.Repeat("ab", 32)), trtllmMM(-201, strings.Repeat("cd", 32)), uint8(0))
	for _, tagged := range []bool{false, true} {
		teach, remove := hybrid(tagged)
		f.Add(teach, remove, uint8(0))
	}
	f.Fuzz(func(t *testing.T, p1, p2 []byte, sockRank uint8) {
		var obs observed
		r := router.New(router.Config{BlockSize: streamBS, Shards: 2, Observer: &obs, Logger: quiet()})
		defer r.Close()
		const id, model = 7, "m"
		var (
			fleet *refmodel.Fleet
			b     wire.EngineBatch
			roots [][]uint32 // tokens of chains stored from the root
		)
		for i, payload := range [][]byte{p1, p2} {
			if err := b.Decode(payload); err != nil {
				var we *wire.Error
				if !errors.As(err, &we) || we.Field == "" {
					t.Fatalf("payload %d %x: refused with %v (%T), not a *wire.Error naming a field", i, payload, err, err)
				}
				continue
			}
			if !b.HasRank {
				for j := range b.Events {
					b.Events[j].Rank = uint32(sockRank % 4)
				}
			}
			if len(b.Events) == 0 {
				continue // the Subscriber sends nothing, which would register rank 0
			}
			workers, dump := r.Workers(), r.DumpWorker(id, nil)
			if err := r.Ingest(id, model, b.Events); err != nil {
				var fe *router.FieldError
				if !errors.As(err, &fe) || fe.Field == "" {
					t.Fatalf("payload %d %x: refused with %v (%T), not a *router.FieldError naming a field", i, payload, err, err)
				}
				if err := r.Flush(); err != nil {
					t.Fatal(err)
				}
				w, d := r.Workers(), r.DumpWorker(id, nil)
				if strings.HasSuffix(fe.Field, "block_size") && refusedBlockSizes(w) <= refusedBlockSizes(workers) {
					t.Fatalf("payload %d refused (%v) but the refusal is not counted: %+v", i, err, w)
				}
				if !reflect.DeepEqual(indexView(w), indexView(workers)) || !reflect.DeepEqual(d, dump) {
					t.Fatalf("payload %d refused (%v) but the router changed:\n%+v\n%v\n-> %+v\n%v", i, err, workers, dump, w, d)
				}
				continue
			}
			if err := r.Flush(); err != nil {
				t.Fatal(err)
			}
			if fleet == nil {
				bs, ok := r.ModelBlockSize(model)
				if !ok {
					t.Fatalf("payload %d accepted, and model %q does not exist", i, model)
				}
				fleet = refmodel.NewFleet(bs, 0)
			}
			var want []shard.Outcome
			for j := range b.Events {
				ev := &b.Events[j]
				if o := fleet.Apply(id, ev); o.Anomalous() {
					want = append(want, o)
				}
				if ev.Kind == kvevent.Stored && !ev.HasParent && ev.LoRA == "" && ev.MM == nil && len(ev.Tokens) > 0 {
					roots = append(roots, append([]uint32(nil), ev.Tokens...))
				}
			}
			if got := obs.take(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("payload %d %+v: anomalies %v, model %v", i, b.Events, got, want)
			}
			checkHolds(t, r, fleet, id)
			var resp wire.RouteResponse
			for _, toks := range roots {
				if err := r.Match(&wire.RouteRequest{Model: model, Tokens: toks}, &resp); err != nil {
					t.Fatal(err)
				}
				got := map[radix.WorkerKey]int{}
				for _, c := range resp.Candidates {
					if c.CachedBlocks > 0 {
						got[radix.WorkerKey{ID: c.Worker, Rank: c.Rank}] = int(c.CachedBlocks)
					}
				}
				if want := fleet.Index.Match(refmodel.SeqHashes(toks, fleet.BlockSize, "")); !maps.Equal(got, want) {
					t.Fatalf("payload %d: match %v: depths %v, model %v", i, toks, got, want)
				}
			}
		}
	})
}

// checkHolds compares, rank by rank, the sequence hashes worker id holds in the router with the
// model's.
func checkHolds(t *testing.T, r *router.Router, fleet *refmodel.Fleet, id uint64) {
	t.Helper()
	got := map[uint32]map[uint64]bool{}
	for _, d := range r.DumpWorker(id, nil) {
		if got[d.Rank] == nil {
			got[d.Rank] = map[uint64]bool{}
		}
		got[d.Rank][d.Seq] = true
	}
	for _, w := range r.Workers() {
		want := fleet.Index.BlocksOf(radix.WorkerKey{ID: w.ID, Rank: w.Rank})
		if g := got[w.Rank]; !maps.Equal(g, want) && !(len(g) == 0 && len(want) == 0) {
			t.Fatalf("worker %d rank %d holds %d blocks %v, model %d %v", w.ID, w.Rank, len(g), g, len(want), want)
		}
		if int(w.CachedBlocks) != len(want) {
			t.Fatalf("worker %d rank %d lists %d cached blocks, model %d", w.ID, w.Rank, w.CachedBlocks, len(want))
		}
		delete(got, w.Rank)
	}
	if len(got) != 0 {
		t.Fatalf("blocks dumped for ranks not listed: %v", got)
	}
}

// indexView is ws without what a refusal records about a worker (its problems and refused
// block-size events): a refused payload may count itself there, and must change nothing else.
func indexView(ws []router.WorkerInfo) []router.WorkerInfo {
	ws = slices.Clone(ws)
	for i := range ws {
		ws[i].Problems, ws[i].BlockSizeRefused = nil, 0
	}
	return ws
}

// refusedBlockSizes sums ws' stored events refused for their block size.
func refusedBlockSizes(ws []router.WorkerInfo) int64 {
	var n int64
	for _, w := range ws {
		n += w.BlockSizeRefused
	}
	return n
}
