package router

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// eventGen makes random event batches for workers 1..workers (ranks 0 and 1) of model "m" at
// block size 4: chains over a small tree of blocks, so that workers share prefixes; removals,
// clears, gaps, unnumbered events and blocks stored twice under two engine hashes.
type eventGen struct {
	r      *rand.Rand
	next   map[[2]uint64]uint64
	held   map[[2]uint64][]uint64 // engine hashes
	stream []*wire.EventBatch
}

func (g *eventGen) batch(workers int) *wire.EventBatch {
	w, rank := uint64(1+g.r.IntN(workers)), uint32(g.r.IntN(2))
	k := [2]uint64{w, uint64(rank)}
	ev := kvevent.Event{Rank: rank}
	switch x := g.r.IntN(100); {
	case x < 3:
		ev.Kind = kvevent.Cleared
		delete(g.held, [2]uint64{w, 0})
		delete(g.held, [2]uint64{w, 1})
	case x < 30 && len(g.held[k]) > 0:
		h := g.held[k]
		i := g.r.IntN(len(h))
		ev.Kind, ev.Hashes = kvevent.Removed, []uint64{h[i]}
		g.held[k] = slices.Delete(h, i, i+1)
	default:
		ev.Kind = kvevent.Stored
		depth := 1 + g.r.IntN(6)
		path := 0
		for range depth {
			path = path*3 + g.r.IntN(3) + 1
		}
		// The whole chain from the root, engine hashes derived from the path (and, now and
		// then, a salt: the same content under a second engine hash).
		salt := uint64(0)
		if g.r.IntN(10) == 0 {
			salt = 1 << 40
		}
		for p, d := path, depth; d > 0; p, d = p/3, d-1 {
			ev.Hashes = append([]uint64{uint64(p)<<8 | salt | uint64(w)<<48}, ev.Hashes...)
			ev.Tokens = append([]uint32{uint32(p), uint32(p) + 1, uint32(p) + 2, uint32(p) + 3}, ev.Tokens...)
		}
		g.held[k] = append(g.held[k], ev.Hashes...)
	}
	switch {
	case g.r.IntN(25) == 0:
		ev.ID = 0
	case g.r.IntN(25) == 0:
		g.next[k] += 3
		ev.ID = g.next[k]
	default:
		g.next[k]++
		ev.ID = g.next[k]
	}
	if g.r.IntN(4) == 0 {
		// An event of a lower storage tier: offloaded copies, indexed apart from the device's.
		ev.Tier = kvevent.Tier(1 + g.r.IntN(3))
	}
	b := &wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{ev}}
	g.stream = append(g.stream, b)
	return b
}

// digest is a router's whole state as text: per worker its registration, cursors and blocks.
func digest(t *testing.T, r *Router) string {
	t.Helper()
	var b bytes.Buffer
	ws := r.Workers()
	slices.SortFunc(ws, func(a, b WorkerInfo) int {
		if a.ID != b.ID {
			return int(a.ID) - int(b.ID)
		}
		return int(a.Rank) - int(b.Rank)
	})
	for _, w := range ws {
		fmt.Fprintf(&b, "%d/%d %s bs=%d cap=%d cached=%d last=%d %s\n", w.ID, w.Rank, w.Model, w.BlockSize, w.Capacity,
			w.CachedBlocks, w.LastEventID, w.Endpoint)
	}
	for _, id := range r.ModelWorkers("m") {
		fmt.Fprintf(&b, "%d: %v\n", id, r.DumpWorker(id, nil))
	}
	return b.String()
}

func restored(t *testing.T, from *Router, chunkSize int) (*Router, SnapshotStats) {
	t.Helper()
	var chunks [][]byte
	st, err := from.Snapshot(chunkSize, func(c []byte) error { chunks = append(chunks, bytes.Clone(c)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if st.Chunks != len(chunks) {
		t.Fatalf("%d chunks emitted, stats say %d", len(chunks), st.Chunks)
	}
	to := New(Config{Shards: 3, ClearOnGap: true, Logger: quiet()})
	t.Cleanup(to.Close)
	got, err := to.Restore(len(chunks), func(i int, dst []byte) ([]byte, error) { return append(dst, chunks[i]...), nil })
	if err != nil {
		t.Fatal(err)
	}
	if got != st {
		t.Fatalf("restored %+v, snapshot wrote %+v", got, st)
	}
	return to, st
}

// A router restored from a snapshot taken mid-stream holds the same state and, given the rest of
// the stream, ends where one that never restarted ends: the same blocks, cursors and answers.
//
// Lower storage tiers are persisted and restored as the device's (TierResidencies, and the
// tiers' extensions in the answers).
func TestSnapshotRestoreEquivalence(t *testing.T) {
	tiered := 0
	for seed := range uint64(4) {
		g := &eventGen{r: rand.New(rand.NewPCG(seed, 9)), next: map[[2]uint64]uint64{}, held: map[[2]uint64][]uint64{}}
		live := New(Config{Shards: 2, ClearOnGap: true, Logger: quiet()})
		t.Cleanup(live.Close)
		if err := live.Register(Registration{ID: 99, Model: "m", BlockSize: 4, Capacity: 500, Ranks: []uint32{0, 3}}); err != nil {
			t.Fatal(err) // registered, never sends an event
		}
		if err := live.Register(Registration{ID: 7, Model: "m", BlockSize: 4, Ranks: []uint32{5}}); err != nil {
			t.Fatal(err) // worker 7's rank 5: registered, never an event, beside ranks that have some
		}
		for id := uint64(1); id <= 7; id++ {
			if err := live.Register(Registration{ID: id, Model: "m", BlockSize: 4, Ranks: []uint32{0, 1}, Endpoint: fmt.Sprintf("tcp://w%d:5557", id)}); err != nil {
				t.Fatal(err)
			}
		}
		apply := func(r *Router, b *wire.EventBatch) {
			if _, err := r.ApplyEvents(b, nil); err != nil {
				t.Fatal(err)
			}
		}
		for range 400 {
			apply(live, g.batch(7))
		}
		restart, st := restored(t, live, 1+int(seed)*700) // seed 0: a chunk per worker
		if st.Workers != 8 || st.Residencies == 0 {
			t.Fatalf("snapshot of %+v", st)
		}
		if a, b := digest(t, live), digest(t, restart); a != b {
			t.Fatalf("seed %d: restored state differs:\nlive\n%s\nrestored\n%s", seed, a, b)
		}
		for range 400 {
			b := g.batch(7)
			apply(live, b)
			apply(restart, b)
		}
		if a, b := digest(t, live), digest(t, restart); a != b {
			t.Fatalf("seed %d: after more events:\nlive\n%s\nrestored\n%s", seed, a, b)
		}
		var q wire.RouteRequest
		var ra, rb wire.RouteResponse
		for p := range 200 {
			q = wire.RouteRequest{Model: "m", Tokens: []uint32{uint32(p % 13), uint32(p%13) + 1, uint32(p%13) + 2, uint32(p%13) + 3}}
			if err := live.Match(&q, &ra); err != nil {
				t.Fatal(err)
			}
			if err := restart.Match(&q, &rb); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(ra.Candidates, rb.Candidates) || !slices.Equal(ra.Tiers, rb.Tiers) {
				t.Fatalf("match %v: %v %v, restored %v %v", q.Tokens, ra.Candidates, ra.Tiers, rb.Candidates, rb.Tiers)
			}
			tiered += len(ra.Tiers)
		}
		if a, b := live.set.Stats().TierResidencies, restart.set.Stats().TierResidencies; a != b || a[kvevent.Host] == 0 {
			t.Fatalf("seed %d: residencies by tier %v, restored %v", seed, a, b)
		}
	}
	if tiered == 0 {
		t.Fatal("no match reached a lower tier: the test shows nothing of them")
	}
}

func TestRestoreRefusesAWorkingRouter(t *testing.T) {
	r := fleet(t, 2)
	if _, err := r.Restore(0, nil); err != ErrNotEmpty {
		t.Fatalf("got %v, want ErrNotEmpty", err)
	}
	empty := New(Config{Logger: quiet()})
	defer empty.Close()
	bad := []byte("KVRW\x01\x00\x04\x00\xff\x00\x00\x00 not a worker")
	if _, err := empty.Restore(1, func(int, []byte) ([]byte, error) { return bad, nil }); err == nil {
		t.Fatal("a corrupt chunk restored without error")
	}
}

func TestClearAll(t *testing.T) {
	r := fleet(t, 3)
	n, err := r.ClearAll()
	if err != nil || n != 3*128 {
		t.Fatalf("cleared %d (%v), want %d", n, err, 3*128)
	}
	for _, w := range r.Workers() {
		if w.CachedBlocks != 0 || w.LastEventID != 1 {
			t.Errorf("worker %d after ClearAll: %d blocks, cursor %d (want 0 and 1, kept)", w.ID, w.CachedBlocks, w.LastEventID)
		}
	}
}

// TestHTTPEndpoint: a worker's HTTP API is registered, listed, updated by a later
// registration naming another, left as it was by one naming none, refused when it is no
// http(s) base URL, and kept by a snapshot.
func TestHTTPEndpoint(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet()})
	defer r.Close()
	if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 4, HTTPEndpoint: "http://w1:8000"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(Registration{ID: 1, Model: "m", Ranks: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	if got := r.HTTPEndpoint(1); got != "http://w1:8000" {
		t.Fatalf("HTTPEndpoint = %q", got)
	}
	for _, bad := range []string{"tcp://w1:5557", "http://", "w1:8000", "http://w1:8000/?x=1", "http://u@w1:8000"} {
		var fe *FieldError
		if err := r.Register(Registration{ID: 2, Model: "m", HTTPEndpoint: bad}); !errors.As(err, &fe) || fe.Field != "http_endpoint" {
			t.Errorf("%q: %v, want a refusal naming http_endpoint", bad, err)
		}
	}
	if err := r.Register(Registration{ID: 1, Model: "m", HTTPEndpoint: "https://w1b:8443/v0"}); err != nil {
		t.Fatal(err)
	}
	for _, w := range r.Workers() {
		if w.HTTPEndpoint != "https://w1b:8443/v0" {
			t.Errorf("rank %d lists %q", w.Rank, w.HTTPEndpoint)
		}
	}
	to, _ := restored(t, r, 1<<20)
	if got := to.HTTPEndpoint(1); got != "https://w1b:8443/v0" {
		t.Errorf("after a restore: %q", got)
	}
}

// FuzzRestore restores a snapshot one of whose chunks a patch overwrote: a chunk that arrives
// with a good checksum may still be anything a peer's stream or a bug wrote. Restore may refuse
// it, but must neither panic nor hang, and a router it restores answers matches.
func FuzzRestore(f *testing.F) {
	g := &eventGen{r: rand.New(rand.NewPCG(3, 9)), next: map[[2]uint64]uint64{}, held: map[[2]uint64][]uint64{}}
	live := New(Config{Shards: 2, Logger: quiet()})
	defer live.Close()
	for id := uint64(1); id <= 5; id++ {
		if err := live.Register(Registration{ID: id, Model: "m", BlockSize: 4, Ranks: []uint32{0, 1}}); err != nil {
			f.Fatal(err)
		}
	}
	for range 300 {
		if _, err := live.ApplyEvents(g.batch(5), nil); err != nil {
			f.Fatal(err)
		}
	}
	var chunks [][]byte
	// Small chunks: several index messages, whose edge segments a restore keeps aside.
	if _, err := live.Snapshot(300, func(c []byte) error { chunks = append(chunks, bytes.Clone(c)); return nil }); err != nil {
		f.Fatal(err)
	}
	if len(chunks) < 4 {
		f.Fatalf("%d chunks", len(chunks))
	}
	f.Add(uint8(0), uint16(0), []byte{})
	f.Add(uint8(len(chunks)-1), uint16(40), []byte{0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(len(chunks)-2), uint16(60), []byte{1, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(1), uint16(9), []byte{0x7f})
	f.Fuzz(func(t *testing.T, which uint8, off uint16, patch []byte) {
		cs := make([][]byte, len(chunks))
		for i, c := range chunks {
			cs[i] = bytes.Clone(c)
		}
		c := cs[int(which)%len(cs)]
		if len(c) > 0 {
			at := int(off) % len(c)
			copy(c[at:], patch)
		}
		r := New(Config{Shards: 2, Logger: quiet()})
		defer r.Close()
		if _, err := r.Restore(len(cs), func(i int, dst []byte) ([]byte, error) { return append(dst, cs[i]...), nil }); err != nil {
			return
		}
		var resp wire.RouteResponse
		for p := range 13 {
			q := wire.RouteRequest{Model: "m", Tokens: []uint32{uint32(p), uint32(p) + 1, uint32(p) + 2, uint32(p) + 3}}
			_ = r.Match(&q, &resp)
		}
	})
}
