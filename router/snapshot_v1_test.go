package router

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/wire"
)

// v1Fixture is a snapshot in the first format (a run of worker messages, no index section), as
// kvrouterd wrote it before the index was stored by block (written by Router.Snapshot at commit
// 61c9f85 with chunks of 900 bytes): the chunks of v1Live's router, each a little-endian u32
// length and the chunk's bytes.
var v1Fixture = filepath.Join("testdata", "snapshot-v1.bin")

// v1Live is the router the fixture was taken of: TestSnapshotRestoreEquivalence's first seed.
func v1Live(t *testing.T) (*Router, *eventGen) {
	t.Helper()
	g := &eventGen{r: rand.New(rand.NewPCG(0, 9)), next: map[[2]uint64]uint64{}, held: map[[2]uint64][]uint64{}}
	live := New(Config{Shards: 2, ClearOnGap: true, Logger: quiet()})
	t.Cleanup(live.Close)
	if err := live.Register(Registration{ID: 99, Model: "m", BlockSize: 4, Capacity: 500, Ranks: []uint32{0, 3}}); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 7; id++ {
		if err := live.Register(Registration{ID: id, Model: "m", BlockSize: 4, Ranks: []uint32{0, 1}, Endpoint: fmt.Sprintf("tcp://w%d:5557", id)}); err != nil {
			t.Fatal(err)
		}
	}
	for range 400 {
		if _, err := live.ApplyEvents(g.batch(7), nil); err != nil {
			t.Fatal(err)
		}
	}
	return live, g
}

// TestRestoreV1Snapshot: a snapshot of the first format, written by the kvrouterd of before the
// index was stored by block, still restores: the same state as the router it was taken of, the
// same answers, and the same state after more events.
func TestRestoreV1Snapshot(t *testing.T) {
	b, err := os.ReadFile(v1Fixture)
	if err != nil {
		t.Fatal(err)
	}
	var chunks [][]byte
	for len(b) > 0 {
		n := binary.LittleEndian.Uint32(b)
		chunks, b = append(chunks, b[4:4+n]), b[4+n:]
	}
	if len(chunks) < 2 {
		t.Fatalf("%d chunks", len(chunks))
	}
	if typ, _, err := wire.ParseHeader(chunks[0]); err != nil || typ != wire.TypeSnapshotWorker {
		t.Fatalf("the fixture starts with a message of type %v (%v), not a worker's: not the first format", typ, err)
	}
	live, g := v1Live(t)
	r := New(Config{Shards: 3, ClearOnGap: true, Logger: quiet()})
	t.Cleanup(r.Close)
	st, err := r.Restore(len(chunks), func(i int, dst []byte) ([]byte, error) { return append(dst, chunks[i]...), nil })
	if err != nil {
		t.Fatal(err)
	}
	if st.Workers != 8 || st.Residencies == 0 {
		t.Fatalf("restored %+v", st)
	}
	if a, b := digest(t, live), digest(t, r); a != b {
		t.Fatalf("restored state differs:\nlive\n%s\nrestored\n%s", a, b)
	}
	for range 300 {
		b := g.batch(7)
		for _, x := range []*Router{live, r} {
			if _, err := x.ApplyEvents(b, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if a, b := digest(t, live), digest(t, r); a != b {
		t.Fatalf("after more events:\nlive\n%s\nrestored\n%s", a, b)
	}
	for p := range 100 {
		q := wire.RouteRequest{Model: "m", Tokens: []uint32{uint32(p % 13), uint32(p%13) + 1, uint32(p%13) + 2, uint32(p%13) + 3}}
		var ra, rb wire.RouteResponse
		if err := live.Match(&q, &ra); err != nil {
			t.Fatal(err)
		}
		if err := r.Match(&q, &rb); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ra.Candidates, rb.Candidates) || !slices.Equal(ra.Tiers, rb.Tiers) {
			t.Fatalf("match %v: %v %v, restored %v %v", q.Tokens, ra.Candidates, ra.Tiers, rb.Candidates, rb.Tiers)
		}
	}
}

// TestRestoreOverBudget: restored into a router with room for part of a snapshot, the index by
// block leaves out exactly the blocks the workers' records leave out: every residency the index
// holds is one a worker's state vouches for, so that removals later take it away, and the rest
// is counted as skipped, with an error that says so.
func TestRestoreOverBudget(t *testing.T) {
	live, _ := v1Live(t)
	var chunks [][]byte
	st, err := live.Snapshot(900, func(c []byte) error { chunks = append(chunks, append([]byte(nil), c...)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if typ, _, _ := wire.ParseHeader(chunks[0]); typ != wire.TypeSnapshotHeader {
		t.Fatalf("a new snapshot starts with %v, not its header", typ)
	}
	budget := st.Residencies / 3
	r := New(Config{Shards: 1, ClearOnGap: true, MaxBlocks: budget, Logger: quiet()})
	t.Cleanup(r.Close)
	_, err = r.Restore(len(chunks), func(i int, dst []byte) ([]byte, error) { return append(dst, chunks[i]...), nil })
	if err == nil {
		t.Fatal("a snapshot over the budget restored without a word")
	}
	ss := r.set.Stats()
	if ss.Residencies == 0 || ss.Residencies > budget || ss.SkippedBlocks == 0 {
		t.Fatalf("budget %d: %d residencies, %d skipped", budget, ss.Residencies, ss.SkippedBlocks)
	}
	// Every worker's blocks are in the index, and nothing else: removing each worker's blocks
	// by their engine hashes empties it.
	m := (*r.models.Load())["m"]
	var held int64
	for _, w := range r.Workers() {
		slot, ok := m.ix.Lookup(radix.WorkerKey{ID: w.ID, Rank: w.Rank})
		if !ok {
			continue
		}
		held += m.ix.Blocks(slot)
		if m.ix.Blocks(slot) != int64(w.CachedBlocks) {
			t.Errorf("worker %d rank %d: %d blocks in the index, %d in its state", w.ID, w.Rank, m.ix.Blocks(slot), w.CachedBlocks)
		}
	}
	if held == 0 {
		t.Fatal("nothing restored in the device index")
	}
}
