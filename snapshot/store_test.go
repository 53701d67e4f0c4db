package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/zeebo/xxh3"

	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
)

func openT(t *testing.T, dir string, keep int) (*Store, *syncbuf.Buffer) {
	t.Helper()
	lb := &syncbuf.Buffer{}
	s, err := Open(dir, Config{Keep: keep, Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return s, lb
}

func writeT(t *testing.T, s *Store, seq uint64, info string, chunks [][]byte) Meta {
	t.Helper()
	m, err := s.Write(seq, []byte(info), func(emit func([]byte) error) error {
		for _, c := range chunks {
			if err := emit(c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Write(seq %d): %v", seq, err)
	}
	return m
}

// randChunks makes n chunks of random sizes up to max, half of each chunk repeating bytes so
// that zstd has something to do.
func randChunks(r *rand.Rand, n, max int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		c := make([]byte, r.IntN(max+1))
		for j := range c {
			if j%64 < 32 {
				c[j] = byte(r.Uint32())
			} else {
				c[j] = byte(j / 64)
			}
		}
		out[i] = c
	}
	return out
}

// checkSnapshot asserts that sn holds exactly want, reading it the way a restore does.
func checkSnapshot(t *testing.T, sn *Snapshot, want Meta, chunks [][]byte) {
	t.Helper()
	m := sn.Meta
	if m.ID != want.ID || m.StreamSeq != want.StreamSeq || !m.Created.Equal(want.Created) || m.Chunks != len(chunks) ||
		m.RawBytes != want.RawBytes || m.StoredBytes != want.StoredBytes || !bytes.Equal(m.Info, want.Info) {
		t.Fatalf("meta %+v, want %+v", m, want)
	}
	var buf []byte
	for i, c := range chunks {
		if sn.ChunkLen(i) != len(c) {
			t.Fatalf("ChunkLen(%d) = %d, want %d", i, sn.ChunkLen(i), len(c))
		}
		var err error
		if buf, err = sn.Chunk(i, buf); err != nil {
			t.Fatalf("Chunk(%d): %v", i, err)
		}
		if !bytes.Equal(buf, c) {
			t.Fatalf("snapshot %d chunk %d: %d bytes differ from the %d written", m.ID, i, len(buf), len(c))
		}
	}
}

func rawSum(chunks [][]byte) (n int64) {
	for _, c := range chunks {
		n += int64(len(c))
	}
	return n
}

// chunkKeys returns the IDs that have at least one chunk key in the database.
func chunkIDs(t *testing.T, s *Store) []uint64 {
	t.Helper()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindChunk}, UpperBound: []byte{kindChunk + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	var ids []uint64
	for ok := it.First(); ok; ok = it.Next() {
		id, _ := keyID(it.Key()[:9])
		if len(ids) == 0 || ids[len(ids)-1] != id {
			ids = append(ids, id)
		}
	}
	return ids
}

func keyCount(t *testing.T, s *Store, kind byte) int {
	t.Helper()
	ids, err := s.scanIDs(s.db, kind)
	if err != nil {
		t.Fatal(err)
	}
	return len(ids)
}

func TestRoundTripKeepAndIDs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, _ := openT(t, dir, 3)
	r := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 20<<20)
	for i := range big {
		big[i] = byte(i / 7)
	}
	for i := 0; i < len(big); i += 4096 {
		big[i] = byte(r.Uint32())
	}
	sets := [][][]byte{
		nil,                      // an empty snapshot
		{{}},                     // one 0-byte chunk
		{[]byte("a"), {}, big},   // a 20 MB chunk among small ones
		randChunks(r, 7, 100000), // random sizes
		randChunks(r, 3, 5000),
	}
	var metas []Meta
	for i, cs := range sets {
		m := writeT(t, s, uint64(100+i), fmt.Sprintf("info %d", i), cs)
		if m.Chunks != len(cs) || m.RawBytes != rawSum(cs) || m.StreamSeq != uint64(100+i) {
			t.Fatalf("Write %d returned %+v", i, m)
		}
		if i > 0 && m.ID <= metas[i-1].ID {
			t.Fatalf("ID %d after %d", m.ID, metas[i-1].ID)
		}
		metas = append(metas, m)
		// Every snapshot reads back right after its Write.
		sn, skipped, err := s.Latest()
		if err != nil || len(skipped) != 0 {
			t.Fatalf("Latest after write %d: %v, skipped %v", i, err, skipped)
		}
		checkSnapshot(t, sn, m, cs)
		sn.Close()
	}
	// Keep 3: the first two are gone, manifest and chunks.
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if got := idsOf(list); !slices.Equal(got, []uint64{metas[4].ID, metas[3].ID, metas[2].ID}) {
		t.Fatalf("List IDs %v", got)
	}
	if got := chunkIDs(t, s); !slices.Equal(got, []uint64{metas[2].ID, metas[3].ID, metas[4].ID}) {
		t.Fatalf("chunk keys of IDs %v remain", got)
	}
	// Before walks back through the kept ones.
	sn, _, err := s.Before(metas[4].ID)
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, sn, metas[3], sets[3])
	sn.Close()
	if _, _, err := s.Before(metas[2].ID); !errors.Is(err, ErrNone) {
		t.Fatalf("Before(oldest) = %v, want ErrNone", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// IDs go on increasing after a restart, and the contents survive it.
	s, _ = openT(t, dir, 3)
	defer s.Close()
	sn, _, err = s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, sn, metas[4], sets[4])
	sn.Close()
	m := writeT(t, s, 200, "", sets[1])
	if m.ID <= metas[4].ID {
		t.Fatalf("ID %d after restart, last was %d", m.ID, metas[4].ID)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func xxh3Sum(b []byte) uint64 { return xxh3.Hash(b) }

func idsOf(ms []Meta) []uint64 {
	out := make([]uint64, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func TestTornWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, _ := openT(t, dir, 3)
	good := writeT(t, s, 1, "good", [][]byte{[]byte("one"), []byte("two")})
	crash := errors.New("simulated crash")
	s.beforeCommit = func() error { return crash }
	_, err := s.Write(2, nil, func(emit func([]byte) error) error {
		for range 3 {
			if err := emit(bytes.Repeat([]byte("x"), 1000)); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, crash) {
		t.Fatalf("Write with crash hook: %v", err)
	}
	torn := good.ID + 1
	if got := chunkIDs(t, s); !slices.Equal(got, []uint64{good.ID, torn}) {
		t.Fatalf("after the torn write chunk IDs %v, want [%d %d]", got, good.ID, torn)
	}
	// Uncommitted, it does not exist even before the restart.
	sn, _, err := s.Latest()
	if err != nil || sn.Meta.ID != good.ID {
		t.Fatalf("Latest after torn write: %v %v", sn, err)
	}
	sn.Close()
	// A staging table a crash left mid-write.
	stale := filepath.Join(dir, stagingDir, "999.sst")
	if err := os.WriteFile(stale, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, lb := openT(t, dir, 3)
	defer s.Close()
	if got := chunkIDs(t, s); !slices.Equal(got, []uint64{good.ID}) {
		t.Fatalf("after reopen chunk IDs %v, want [%d]", got, good.ID)
	}
	if n := keyCount(t, s, kindPending); n != 0 {
		t.Fatalf("%d pending keys after reopen", n)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale staging table: %v", err)
	}
	if !strings.Contains(lb.String(), "uncommitted snapshot") {
		t.Fatalf("orphan deletion not logged: %s", lb.String())
	}
	list, _ := s.List()
	if got := idsOf(list); !slices.Equal(got, []uint64{good.ID}) {
		t.Fatalf("List %v", got)
	}
	if m := writeT(t, s, 3, "", nil); m.ID <= torn {
		t.Fatalf("ID %d reuses the torn write's %d", m.ID, torn)
	}
}

func TestWriteAbandoned(t *testing.T) {
	s, _ := openT(t, filepath.Join(t.TempDir(), "snap"), 3)
	defer s.Close()
	good := writeT(t, s, 1, "", [][]byte{[]byte("a")})
	boom := errors.New("index iteration failed")
	_, err := s.Write(2, nil, func(emit func([]byte) error) error {
		if err := emit([]byte("partial")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Write = %v, want the fill error", err)
	}
	if _, err := s.Write(2, make([]byte, MaxInfo+1), func(func([]byte) error) error { return nil }); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Write with big info = %v", err)
	}
	if got := chunkIDs(t, s); !slices.Equal(got, []uint64{good.ID}) {
		t.Fatalf("chunk IDs %v", got)
	}
	entries, _ := os.ReadDir(filepath.Join(s.dir, stagingDir))
	if len(entries) != 0 {
		t.Fatalf("staging files left: %v", entries)
	}
}

func TestConcurrentReadersAndClose(t *testing.T) {
	s, _ := openT(t, filepath.Join(t.TempDir(), "snap"), 2)
	r := rand.New(rand.NewPCG(3, 4))
	sets := [][][]byte{randChunks(r, 8, 20000), randChunks(r, 8, 20000), randChunks(r, 8, 20000)}
	m0 := writeT(t, s, 1, "", sets[0])
	sn, _, err := s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	// Writes that prune sn's snapshot run while readers read it: the pinned view holds.
	wg.Go(func() {
		writeT(t, s, 2, "", sets[1])
		writeT(t, s, 3, "", sets[2])
	})
	for g := range 4 {
		wg.Go(func() {
			var buf []byte
			for round := range 3 {
				for i := range sets[0] {
					j := (i + g + round) % len(sets[0])
					var err error
					if buf, err = sn.Chunk(j, buf); err != nil {
						t.Errorf("Chunk(%d): %v", j, err)
						return
					}
					if !bytes.Equal(buf, sets[0][j]) {
						t.Errorf("chunk %d differs", j)
						return
					}
				}
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			if l, _, err := s.Latest(); err == nil {
				l.Close()
			}
		}
	})
	wg.Wait()
	if _, err := s.List(); err != nil {
		t.Fatal(err)
	}
	if ids := chunkIDs(t, s); slices.Contains(ids, m0.ID) {
		t.Fatalf("pruned snapshot %d still has chunks: %v", m0.ID, ids)
	}
	checkSnapshot(t, sn, m0, sets[0]) // still readable through its pinned view
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Chunk(0, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Chunk after Store.Close = %v", err)
	}
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Latest(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Latest after Close = %v", err)
	}
	if _, err := s.Write(9, nil, func(func([]byte) error) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close = %v", err)
	}
}

func TestLockedDirectoryIsNotMovedAside(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, _ := openT(t, dir, 3)
	defer s.Close()
	if s2, err := Open(dir, Config{Logger: slog.New(slog.DiscardHandler)}); err == nil {
		s2.Close()
		t.Fatal("second Open of a locked directory succeeded")
	}
	if matches, _ := filepath.Glob(dir + ".corrupt-*"); len(matches) != 0 {
		t.Fatalf("locked directory moved aside: %v", matches)
	}
	if p, _ := s.MovedAside(); p != "" {
		t.Fatalf("MovedAside = %q", p)
	}
}

// Pruned snapshots give their disk space back, and no compaction rewrites live chunk bytes: the
// key layout (doc.go) keeps chunk tables out of every compaction but their own deletion.
func TestPrunedSpaceIsReclaimed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, _ := openT(t, dir, 2)
	defer s.Close()
	r := rand.New(rand.NewPCG(12, 12))
	const perSnapshot = 4 * 256 << 10
	for i := range 6 {
		cs := make([][]byte, 4)
		for j := range cs {
			cs[j] = make([]byte, perSnapshot/4)
			for k := range cs[j] {
				cs[j][k] = byte(r.Uint32()) // incompressible: stored ≈ raw
			}
		}
		writeT(t, s, uint64(i), "", cs)
	}
	tableBytes := func() (n int64) {
		ms, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
		for _, m := range ms {
			if fi, err := os.Stat(m); err == nil {
				n += fi.Size()
			}
		}
		return n
	}
	// Deletion is Pebble's background work; wait for it (bounded) rather than for a duration.
	deadline := time.Now().Add(20 * time.Second)
	for tableBytes() > 5*perSnapshot/2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of tables for 2 kept snapshots of %d bytes", tableBytes(), perSnapshot)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var compacted uint64
	m := s.db.Metrics()
	for _, l := range m.Levels {
		compacted += l.TableBytesCompacted
	}
	if compacted > perSnapshot/8 {
		t.Fatalf("compactions wrote %d bytes: live chunks were rewritten", compacted)
	}
}

// A restore reuses its buffers: Chunk allocates nothing of its own per chunk (what remains is
// Pebble's Get, one small object).
func TestChunkAllocs(t *testing.T) {
	s, _ := openT(t, filepath.Join(t.TempDir(), "snap"), 3)
	defer s.Close()
	writeT(t, s, 1, "", randChunks(rand.New(rand.NewPCG(13, 13)), 4, 1<<20))
	sn, _, err := s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	buf := make([]byte, 0, 1<<20)
	i := 0
	n := testing.AllocsPerRun(40, func() {
		if buf, err = sn.Chunk(i%4, buf); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if n > 2 {
		t.Fatalf("%v allocations per Chunk", n)
	}
}
