package fuzz

import (
	"bytes"
	"fmt"
	"maps"
	"testing"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

const (
	streamBS      = 4 // block size of the stream's model
	streamWorkers = 3
	streamRanks   = 2
	maxDepth      = 6
)

// pathTokens returns the tokens of the prompt that walks the tree of blocks by path (each step
// 1..3): the content of a block depends on its step and depth, so that prompts share prefixes
// the way requests of one conversation do.
func pathTokens(path []byte) []uint32 {
	var toks []uint32
	for d, c := range path {
		toks = append(toks, uint32(c), uint32(d), uint32(c)*10+uint32(d), 7)
	}
	return toks
}

// treePrompts returns prompts that together reach every block of the first two levels of the
// tree and a third of the third.
func treePrompts() [][]byte {
	var ps [][]byte
	for a := byte(1); a <= 3; a++ {
		for b := byte(1); b <= 3; b++ {
			ps = append(ps, []byte{a, b, 1 + (a+b)%3})
		}
	}
	return ps
}

// engineHash is the engine's id of the block ending path on worker w: distinct per worker,
// prefix and salt (salt 1 stores the same content under a second engine hash).
func engineHash(w uint64, path []byte, salt uint64) uint64 {
	p := uint64(0)
	for _, c := range path {
		p = p*4 + uint64(c)
	}
	return w<<48 | salt<<40 | p<<4 | 1
}

// streamGen turns fuzz bytes into event batches of one model: stored chains over a small tree,
// with or without their parent, removals of known and unknown engine hashes, clears, other tiers,
// engine hashes reused for other content, and event ids in order, repeated, skipped or absent.
type streamGen struct {
	in   *input
	next map[radix.WorkerKey]uint64
}

func (g *streamGen) path() []byte {
	p := make([]byte, 1+g.in.n(maxDepth))
	for i := range p {
		p[i] = byte(1 + g.in.n(3))
	}
	return p
}

func (g *streamGen) event(w uint64) kvevent.Event {
	in := g.in
	ev := kvevent.Event{Rank: uint32(in.n(streamRanks))}
	k := radix.WorkerKey{ID: w, Rank: ev.Rank}
	switch x := in.n(16); {
	case x == 0:
		ev.Kind = kvevent.Cleared
	case x < 5:
		ev.Kind = kvevent.Removed
		for range 1 + in.n(3) {
			if in.n(8) == 0 {
				ev.Hashes = append(ev.Hashes, uint64(in.n(4))) // never stored: unknown
				continue
			}
			p := g.path()
			ev.Hashes = append(ev.Hashes, engineHash(w, p, uint64(in.n(4)/3)))
		}
	default:
		ev.Kind = kvevent.Stored
		p := g.path()
		from := in.n(len(p))
		salt := uint64(in.n(4) / 3)
		if from > 0 {
			ev.HasParent, ev.Parent = true, engineHash(w, p[:from], salt)
		}
		for d := from; d < len(p); d++ {
			h := engineHash(w, p[:d+1], salt)
			if in.n(16) == 0 {
				h = uint64(1+in.n(3)) << 2 // an engine hash reused for another block
			}
			ev.Hashes = append(ev.Hashes, h)
		}
		ev.Tokens = pathTokens(p)[from*streamBS:]
		if in.n(2) == 0 {
			ev.BlockSize = streamBS
		}
	}
	if ev.Kind != kvevent.Cleared && in.n(16) == 0 {
		ev.Tier = kvevent.Host
	}
	switch x := in.n(16); {
	case x == 0: // unnumbered
	case x == 1: // repeated (or, first, 0)
		ev.ID = g.next[k]
	case x == 2: // skips ids
		g.next[k] += 2 + uint64(in.n(3))
		ev.ID = g.next[k]
	default:
		g.next[k]++
		ev.ID = g.next[k]
	}
	return ev
}

func (g *streamGen) batch() *wire.EventBatch {
	b := &wire.EventBatch{Worker: uint64(1 + g.in.n(streamWorkers)), Model: "m"}
	for range 1 + g.in.n(4) {
		b.Events = append(b.Events, g.event(b.Worker))
	}
	return b
}

// checkMatches matches prompts on each router and on the model: every worker's cached prefix,
// in blocks, and its block count must be the model's.
func checkMatches(t *testing.T, when string, fleet *refmodel.Fleet, prompts [][]byte, rs ...*router.Router) {
	t.Helper()
	var resp wire.RouteResponse
	for _, p := range prompts {
		toks := pathTokens(p)
		want := fleet.Index.Match(refmodel.SeqHashes(toks, streamBS, ""))
		for i, r := range rs {
			if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: toks}, &resp); err != nil {
				t.Fatalf("%s: router %d: match %v: %v", when, i, p, err)
			}
			got := map[radix.WorkerKey]int{}
			for _, c := range resp.Candidates {
				w := radix.WorkerKey{ID: c.Worker, Rank: c.Rank}
				if c.CachedBlocks > 0 {
					got[w] = int(c.CachedBlocks)
				}
				if n := fleet.Index.Blocks(w); int(c.TreeBlocks) != n {
					t.Fatalf("%s: router %d: worker %v holds %d blocks, model %d", when, i, w, c.TreeBlocks, n)
				}
			}
			if !maps.Equal(got, want) {
				t.Fatalf("%s: router %d: prompt %v: depths %v, model %v", when, i, p, got, want)
			}
		}
	}
}

func newStreamRouter(t *testing.T, shards int) *router.Router {
	r := router.New(router.Config{BlockSize: streamBS, Shards: shards, Logger: quiet()})
	t.Cleanup(r.Close)
	return r
}

// FuzzEventStream sends a stream of event batches through the binary wire format into a router
// (ApplyEvents, or Ingest and Flush), snapshots it mid-stream, restores the snapshot into a fresh
// router and sends the rest of the stream to both. Every outcome ApplyEvents reports must be the
// reference model's (internal/refmodel), and at the snapshot and at the end every worker's match
// depth and block count on a set of prompts must be the model's, on both routers.
func FuzzEventStream(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x05\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"))
	f.Add(bytes.Repeat([]byte{7, 3, 1, 2, 9, 4, 4, 0, 1, 2, 5, 200}, 40))
	f.Add(bytes.Repeat([]byte{1, 0, 2, 5, 3, 1, 2, 2, 2, 1, 6, 0, 16, 3, 48, 2, 2, 1}, 30))
	f.Add(bytes.Repeat([]byte{255, 128, 64, 32, 16, 8, 4, 2, 1, 0, 3, 5, 7, 11, 13}, 50))
	for seed := range 4 {
		b := make([]byte, 600)
		x := uint32(seed*7919 + 1)
		for i := range b {
			x = x*1664525 + 1013904223
			b[i] = byte(x >> 24)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &input{b: data}
		live := newStreamRouter(t, 1+in.n(3))
		for id := uint64(1); id <= streamWorkers; id++ {
			if err := live.Register(router.Registration{ID: id, Model: "m", BlockSize: streamBS, Ranks: []uint32{0, 1}}); err != nil {
				t.Fatal(err)
			}
		}
		fleet := refmodel.NewFleet(streamBS, 0)
		g := &streamGen{in: in, next: map[radix.WorkerKey]uint64{}}
		prompts := treePrompts()
		for range 6 {
			prompts = append(prompts, g.path())
		}

		var (
			msg     []byte
			dec     wire.EventBatch
			outs    []shard.Outcome
			batches = 1 + in.n(64)
			snapAt  = in.n(batches + 1)
			restart *router.Router
		)
		send := func(r *router.Router, b *wire.EventBatch, apply bool) {
			if apply {
				var err error
				if outs, err = r.ApplyEvents(b, outs[:0]); err != nil {
					t.Fatalf("batch %+v refused: %v", b, err)
				}
				return
			}
			if err := r.Ingest(b.Worker, b.Model, b.Events); err != nil {
				t.Fatalf("batch %+v refused: %v", b, err)
			}
		}
		for i := 0; i <= batches; i++ {
			if i == snapAt {
				if err := live.Flush(); err != nil {
					t.Fatal(err)
				}
				checkMatches(t, "before the snapshot", fleet, prompts, live)
				restart = restore(t, live, in)
				checkMatches(t, "restored", fleet, prompts, live, restart)
			}
			if i == batches {
				break
			}
			b := g.batch()
			msg = wire.AppendEventBatch(msg[:0], b)
			if err := wire.DecodeEventBatch(msg, &dec); err != nil {
				t.Fatalf("batch %+v: %v", b, err)
			}
			apply := in.n(2) == 0
			send(live, &dec, apply)
			var want []shard.Outcome
			for j := range dec.Events {
				want = append(want, fleet.Apply(dec.Worker, &dec.Events[j]))
			}
			if apply && fmt.Sprint(outs) != fmt.Sprint(want) {
				t.Fatalf("batch %d %+v:\noutcomes %v\nmodel    %v", i, b, outs, want)
			}
			if restart != nil {
				send(restart, &dec, false)
			}
		}
		for _, r := range []*router.Router{live, restart} {
			if err := r.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		checkMatches(t, "at the end", fleet, prompts, live, restart)
	})
}

// restore snapshots from into chunks of a size the input picks and restores them into a new
// router.
func restore(t *testing.T, from *router.Router, in *input) *router.Router {
	t.Helper()
	var chunks [][]byte
	st, err := from.Snapshot(1+in.n(4)*200, func(c []byte) error { chunks = append(chunks, bytes.Clone(c)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	to := newStreamRouter(t, 1+in.n(3))
	got, err := to.Restore(len(chunks), func(i int, dst []byte) ([]byte, error) { return append(dst, chunks[i]...), nil })
	if err != nil {
		t.Fatal(err)
	}
	if got != st {
		t.Fatalf("restored %+v, snapshot wrote %+v", got, st)
	}
	return to
}
