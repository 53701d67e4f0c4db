package router

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

func stored(id uint64, rank uint32, bs int, toks []uint32, parent uint64, hashes ...uint64) kvevent.Event {
	return kvevent.Event{Kind: kvevent.Stored, ID: id, Rank: rank, BlockSize: bs, Tokens: toks, Hashes: hashes, Parent: parent, HasParent: parent != 0}
}

// TestIngestDiscovers checks that a stream's first events register their worker and ranks, and
// apply after Flush.
func TestIngestDiscovers(t *testing.T) {
	r := New(Config{Shards: 2, Logger: quiet()})
	defer r.Close()
	evs := []kvevent.Event{stored(1, 0, 4, seq(0, 8), 0, 11, 12), stored(1, 1, 4, seq(0, 4), 0, 21)}
	if err := r.Ingest(7, "m", evs); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if bs, ok := r.ModelBlockSize("m"); !ok || bs != 4 {
		t.Fatalf("model block size %d %v, want 4 from the events", bs, ok)
	}
	var resp wire.RouteResponse
	if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: seq(0, 8)}, &resp); err != nil {
		t.Fatal(err)
	}
	got := map[uint32]uint32{}
	for _, c := range resp.Candidates {
		got[c.Rank] = c.CachedBlocks
	}
	if len(got) != 2 || got[0] != 2 || got[1] != 1 {
		t.Fatalf("cached blocks by rank %v, want rank 0: 2, rank 1: 1", got)
	}
	if st := r.Stats(); st.Discovered != 1 { // one worker, both ranks at once
		t.Errorf("discovered %d, want 1", st.Discovered)
	}
	for _, w := range r.Workers() {
		if w.EventLag != 0 {
			t.Errorf("worker %d rank %d: lag %d after Flush", w.ID, w.Rank, w.EventLag)
		}
	}
}

// TestIngestRefuses checks that a batch that fails its checks changes nothing.
func TestIngestRefuses(t *testing.T) {
	r := New(Config{Shards: 2, Logger: quiet()})
	defer r.Close()
	var fe *FieldError
	if err := r.Ingest(1, "", []kvevent.Event{stored(1, 0, 4, seq(0, 4), 0, 1)}); !errors.As(err, &fe) || fe.Field != "worker_id" {
		t.Fatalf("unknown worker without a model: %v", err)
	}
	if err := r.Ingest(1, "m", []kvevent.Event{stored(1, 0, 4, seq(0, 4), 0, 1)}); err != nil {
		t.Fatal(err)
	}
	// A second good event, then one with the wrong token count in the same batch: neither applies.
	bad := []kvevent.Event{stored(2, 0, 4, seq(4, 4), 1, 2), stored(3, 0, 4, seq(8, 3), 2, 3)}
	if err := r.Ingest(1, "m", bad); !errors.As(err, &fe) || fe.Field != "events[1].token_ids" {
		t.Fatalf("short tokens: %v", err)
	}
	if err := r.Ingest(1, "other", bad[:1]); !errors.Is(err, ErrConflict) {
		t.Fatalf("another model: %v", err)
	}
	if err := r.Ingest(2, "m", []kvevent.Event{stored(1, 0, 8, seq(0, 8), 0, 1)}); !errors.As(err, &fe) || fe.Field != "block_size" {
		t.Fatalf("a new worker stating another block size: %v", err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: seq(0, 12)}, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Candidates) != 1 || resp.Candidates[0].CachedBlocks != 1 {
		t.Fatalf("candidates %+v, want worker 1 with its first block only", resp.Candidates)
	}
}

// TestDropSilent checks the liveness rule: only workers that send load reports time out, and
// they come back with their next event.
func TestDropSilent(t *testing.T) {
	var now atomic.Int64
	r := New(Config{Shards: 1, Logger: quiet(), Now: now.Load})
	defer r.Close()
	if err := r.Ingest(1, "m", []kvevent.Event{stored(1, 0, 4, seq(0, 4), 0, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := r.Ingest(2, "m", []kvevent.Event{stored(1, 0, 4, seq(0, 4), 0, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := r.Report(&LoadReport{Worker: 2, Model: "m", ActiveBlocks: 5, KVUsage: 0.5, MaxBatchedTokens: 8192}); err != nil {
		t.Fatal(err)
	}
	if err := r.Report(&LoadReport{Worker: 2, Model: "m", KVUsage: 1.5}); err == nil {
		t.Fatal("kv_usage 1.5 accepted")
	}
	now.Store(int64(10 * time.Second))
	if n := r.DropSilent(5 * time.Second); n != 1 {
		t.Fatalf("dropped %d, want worker 2 only (worker 1 sends no reports)", n)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	ws := r.Workers()
	if len(ws) != 1 || ws[0].ID != 1 {
		t.Fatalf("workers %+v, want 1", ws)
	}
	// Its next event registers it again, with what it now stores.
	if err := r.Ingest(2, "m", []kvevent.Event{stored(2, 0, 4, seq(100, 4), 0, 9)}); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: seq(0, 4)}, &resp); err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.Candidates {
		if want := map[uint64]uint32{1: 1, 2: 0}[c.Worker]; c.CachedBlocks != want {
			t.Errorf("worker %d caches %d blocks of the prompt, want %d", c.Worker, c.CachedBlocks, want)
		}
	}
	if st := r.Stats(); st.TimedOut != 1 {
		t.Errorf("timed out %d, want 1", st.TimedOut)
	}
}

// TestIngestRefusedChangesNothing: a batch refused for its content registers nothing, also when
// its worker and model are new (it used to register them first, fixing the model's block size
// from a malformed batch, after which correct batches were refused).
func TestIngestRefusedChangesNothing(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet()})
	defer r.Close()
	bad := []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 48, Hashes: []uint64{1}, Tokens: make([]uint32, 4)}}
	var fe *FieldError
	if err := r.Ingest(7, "m", bad); !errors.As(err, &fe) || fe.Field != "events[0].token_ids" {
		t.Fatalf("short tokens: %v", err)
	}
	if len(r.Workers()) != 0 || len(r.Models()) != 0 {
		t.Fatalf("a refused batch registered %v, %v", r.Workers(), r.Models())
	}
	good := []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 16, Hashes: []uint64{1}, Tokens: make([]uint32, 16)}}
	if err := r.Ingest(7, "m", good); err != nil {
		t.Fatalf("the next, correct batch: %v", err)
	}
	if bs, ok := r.ModelBlockSize("m"); !ok || bs != 16 {
		t.Fatalf("model m: block size %d, %v; want 16", bs, ok)
	}
}
