package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// twoSnapshots writes an older and a newer snapshot of random chunks.
func twoSnapshots(t *testing.T, s *Store, seed uint64) (old, new Meta, oldChunks, newChunks [][]byte) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	oldChunks, newChunks = randChunks(r, 4, 60000), randChunks(r, 5, 60000)
	old = writeT(t, s, 10, "old", oldChunks)
	new = writeT(t, s, 20, "new", newChunks)
	return old, new, oldChunks, newChunks
}

func setRaw(t *testing.T, s *Store, key []byte, mutate func(v []byte) []byte) {
	t.Helper()
	v, c, err := s.db.Get(key)
	if err != nil {
		t.Fatalf("get %x: %v", key, err)
	}
	nv := mutate(bytes.Clone(v))
	c.Close()
	if err := s.db.Set(key, nv, pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptValuesAreSkipped(t *testing.T) {
	f := func(name string, want error, mutate func(s *Store, m Meta)) {
		t.Run(name, func(t *testing.T) {
			s, lb := openT(t, filepath.Join(t.TempDir(), "snap"), 3)
			defer s.Close()
			old, new, oldChunks, _ := twoSnapshots(t, s, 1)
			mutate(s, new)
			sn, skipped, err := s.Latest()
			if err != nil {
				t.Fatalf("Latest: %v (skipped %v)", err, skipped)
			}
			defer sn.Close()
			checkSnapshot(t, sn, old, oldChunks)
			if len(skipped) != 1 || skipped[0].ID != new.ID || !errors.Is(skipped[0].Err, want) {
				t.Fatalf("skipped %v, want snapshot %d with %v", skipped, new.ID, want)
			}
			t.Logf("reason: %v", skipped[0].Err)
			if !bytes.Contains([]byte(lb.String()), []byte("skipped snapshot")) {
				t.Fatalf("skip not logged: %s", lb.String())
			}
			// The store goes on working, and the bad snapshot is pruned in its turn.
			writeT(t, s, 30, "", nil)
			writeT(t, s, 40, "", nil)
			writeT(t, s, 50, "", nil)
			if ids := chunkIDs(t, s); len(ids) != 0 {
				t.Fatalf("chunks of %v remain after pruning", ids)
			}
		})
	}
	chunk := func(s *Store, m Meta, i int) []byte { return chunkKey(nil, m.ID, i) }
	f("chunk byte flipped", ErrCorrupt, func(s *Store, m Meta) {
		setRaw(t, s, chunk(s, m, 2), func(v []byte) []byte { v[len(v)/2] ^= 0x10; return v })
	})
	f("chunk truncated", ErrCorrupt, func(s *Store, m Meta) {
		setRaw(t, s, chunk(s, m, 4), func(v []byte) []byte { return v[:len(v)-1] })
	})
	f("chunk missing", ErrCorrupt, func(s *Store, m Meta) {
		if err := s.db.Delete(chunk(s, m, 0), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	})
	f("manifest byte flipped", ErrCorrupt, func(s *Store, m Meta) {
		setRaw(t, s, idKey(kindManifest, m.ID), func(v []byte) []byte { v[30] ^= 1; return v })
	})
	f("manifest truncated", ErrTruncated, func(s *Store, m Meta) {
		setRaw(t, s, idKey(kindManifest, m.ID), func(v []byte) []byte { return v[:len(v)-9] })
	})
	f("manifest of another snapshot", ErrCorrupt, func(s *Store, m Meta) {
		v, c, _ := s.db.Get(idKey(kindManifest, m.ID-1))
		s.db.Set(idKey(kindManifest, m.ID), v, pebble.Sync)
		c.Close()
	})
}

// A chunk whose checksum matches but whose bytes are not the zstd frame the manifest describes
// passes Latest (which checks checksums only) and fails in Chunk, which then falls back.
func TestUndecodableChunkFailsInChunk(t *testing.T) {
	s, _ := openT(t, filepath.Join(t.TempDir(), "snap"), 3)
	defer s.Close()
	old, new, oldChunks, _ := twoSnapshots(t, s, 2)
	m, chunks, _, err := readManifest(s.db, new.ID)
	if err != nil {
		t.Fatal(err)
	}
	garbage := bytes.Repeat([]byte{0xAB}, int(chunks[1].stored))
	chunks[1].sum = xxh3Sum(garbage)
	if err := s.db.Set(chunkKey(nil, new.ID, 1), garbage, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Set(idKey(kindManifest, new.ID), appendManifest(nil, &m, chunks), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	sn, _, err := s.Latest()
	if err != nil || sn.Meta.ID != new.ID {
		t.Fatalf("Latest = %v, %v", sn, err)
	}
	if _, err := sn.Chunk(0, nil); err != nil {
		t.Fatalf("Chunk(0): %v", err)
	}
	_, err = sn.Chunk(1, nil)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Chunk(1) = %v, want ErrCorrupt", err)
	}
	t.Logf("Chunk(1): %v", err)
	sn.Close()
	sn, _, err = s.Before(new.ID)
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, sn, old, oldChunks)
	sn.Close()
}

func TestNoValidSnapshot(t *testing.T) {
	s, _ := openT(t, filepath.Join(t.TempDir(), "snap"), 3)
	defer s.Close()
	if _, skipped, err := s.Latest(); !errors.Is(err, ErrNone) || len(skipped) != 0 {
		t.Fatalf("empty store: Latest = %v, %v", skipped, err)
	}
	old, new, _, _ := twoSnapshots(t, s, 3)
	for _, m := range []Meta{old, new} {
		setRaw(t, s, chunkKey(nil, m.ID, 0), func(v []byte) []byte { v[0] ^= 0xFF; return v })
	}
	_, skipped, err := s.Latest()
	if !errors.Is(err, ErrNone) || len(skipped) != 2 || skipped[0].ID != new.ID || skipped[1].ID != old.ID {
		t.Fatalf("Latest = %v, %v", skipped, err)
	}
}

// tableOf returns the path of the table holding the chunks of snapshot id.
func tableOf(t *testing.T, s *Store, id uint64) string {
	t.Helper()
	levels, err := s.db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, level := range levels {
		for _, ti := range level {
			if k := ti.Smallest.UserKey; len(k) == 13 && k[0] == kindChunk {
				if kid, _ := keyID(k[:9]); kid == id {
					return filepath.Join(s.dir, fmt.Sprintf("%06d.sst", ti.BackingSSTNum))
				}
			}
		}
	}
	t.Fatalf("no table holds snapshot %d", id)
	return ""
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

// Bytes flipped in the table file on disk: wherever they land, the store either skips the
// snapshot, or cannot open and moves the directory aside; it never returns wrong data.
func TestCorruptTableFile(t *testing.T) {
	pristine := filepath.Join(t.TempDir(), "pristine")
	s, _ := openT(t, pristine, 3)
	old, new, oldChunks, newChunks := twoSnapshots(t, s, 4)
	table, _ := filepath.Rel(pristine, tableOf(t, s, new.ID))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(pristine, table))
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()
	r := rand.New(rand.NewPCG(5, 6))
	offsets := []int64{size / 2, size / 3, 0, 1, size - 1, size - 20, size - 60, size - 200}
	for range 6 {
		offsets = append(offsets, r.Int64N(size))
	}
	for _, off := range offsets {
		t.Run(fmt.Sprintf("offset %d of %d", off, size), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "snap")
			copyDir(t, pristine, dir)
			flipByte(t, filepath.Join(dir, table), off)
			s, _ := openT(t, dir, 3)
			defer s.Close()
			if aside, cause := s.MovedAside(); aside != "" {
				t.Logf("moved aside: %v", cause)
				if _, _, err := s.Latest(); !errors.Is(err, ErrNone) {
					t.Fatalf("Latest after moving aside = %v", err)
				}
				return
			}
			sn, skipped, err := s.Latest()
			if err != nil {
				t.Fatalf("Latest: %v (skipped %v)", err, skipped)
			}
			defer sn.Close()
			switch sn.Meta.ID {
			case old.ID:
				if len(skipped) != 1 || skipped[0].ID != new.ID {
					t.Fatalf("skipped %v", skipped)
				}
				t.Logf("skipped: %v", skipped[0].Err)
				checkSnapshot(t, sn, old, oldChunks)
			case new.ID:
				// The flip hit bytes no read depends on; the data must still be exact.
				t.Logf("flip had no effect on reads")
				checkSnapshot(t, sn, new, newChunks)
			default:
				t.Fatalf("Latest returned snapshot %d", sn.Meta.ID)
			}
			if off == size/2 && sn.Meta.ID != old.ID {
				t.Fatal("a flip in the middle of a data block went unnoticed")
			}
		})
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5A
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

func TestUnopenableDirectoryIsMovedAside(t *testing.T) {
	f := func(name string, damage func(t *testing.T, dir string, s *Store, new Meta)) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "snap")
			s, _ := openT(t, dir, 3)
			_, new, _, _ := twoSnapshots(t, s, 8)
			damage(t, dir, s, new)
			s, lb := openT(t, dir, 3)
			aside, cause := s.MovedAside()
			if aside == "" || cause == nil {
				s.Close()
				t.Fatal("damaged directory was not moved aside")
			}
			t.Logf("moved aside to %s: %v", filepath.Base(aside), cause)
			if !bytes.Contains([]byte(lb.String()), []byte("moved aside")) {
				t.Fatalf("not logged: %s", lb.String())
			}
			if entries, err := os.ReadDir(aside); err != nil || len(entries) == 0 {
				t.Fatalf("moved-aside directory: %v, %d entries", err, len(entries))
			}
			if _, _, err := s.Latest(); !errors.Is(err, ErrNone) {
				t.Fatalf("Latest on the fresh store = %v", err)
			}
			m := writeT(t, s, 99, "", [][]byte{[]byte("fresh")})
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s, _ = openT(t, dir, 3)
			defer s.Close()
			if aside, _ := s.MovedAside(); aside != "" {
				t.Fatal("fresh store moved aside again")
			}
			sn, _, err := s.Latest()
			if err != nil || sn.Meta.ID != m.ID {
				t.Fatalf("Latest = %v, %v", sn, err)
			}
			sn.Close()
		})
	}
	f("table truncated", func(t *testing.T, dir string, s *Store, new Meta) {
		table := tableOf(t, s, new.ID)
		s.Close()
		fi, _ := os.Stat(table)
		if err := os.Truncate(table, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
	})
	f("table truncated, directory a mount point", func(t *testing.T, dir string, s *Store, new Meta) {
		table := tableOf(t, s, new.ID)
		s.Close()
		fi, _ := os.Stat(table)
		if err := os.Truncate(table, fi.Size()-1); err != nil {
			t.Fatal(err)
		}
		renameDir = func(from, to string) error {
			if from == dir {
				return syscall.EBUSY
			}
			return os.Rename(from, to)
		}
		t.Cleanup(func() { renameDir = os.Rename })
	})
	f("table missing", func(t *testing.T, dir string, s *Store, new Meta) {
		table := tableOf(t, s, new.ID)
		s.Close()
		if err := os.Remove(table); err != nil {
			t.Fatal(err)
		}
	})
	f("manifests' table byte flipped", func(t *testing.T, dir string, s *Store, new Meta) {
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		levels, err := s.db.SSTables()
		if err != nil {
			t.Fatal(err)
		}
		var meta []string
		for _, level := range levels {
			for _, ti := range level {
				if ti.Smallest.UserKey[0] < kindChunk {
					meta = append(meta, filepath.Join(dir, fmt.Sprintf("%06d.sst", ti.BackingSSTNum)))
				}
			}
		}
		s.Close()
		if len(meta) == 0 {
			t.Fatal("no table holds manifests")
		}
		for _, m := range meta {
			flipByte(t, m, 30) // in the first data block
		}
	})
	f("MANIFEST garbage", func(t *testing.T, dir string, s *Store, new Meta) {
		s.Close()
		ms, _ := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
		if len(ms) == 0 {
			t.Fatal("no MANIFEST")
		}
		for _, m := range ms {
			fi, _ := os.Stat(m)
			if err := os.WriteFile(m, bytes.Repeat([]byte{0x42}, int(fi.Size())), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})
	f("MANIFEST truncated", func(t *testing.T, dir string, s *Store, new Meta) {
		s.Close()
		ms, _ := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
		for _, m := range ms {
			if err := os.Truncate(m, 10); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestNewerLayoutIsAnError(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, _ := openT(t, dir, 3)
	if err := s.db.Set(formatKey, []byte("kvrouterd.snapshot/2"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err := Open(dir, Config{Logger: discardLogger()})
	if !errors.Is(err, ErrFormat) {
		t.Fatalf("Open = %v, want ErrFormat", err)
	}
	if matches, _ := filepath.Glob(dir + ".corrupt-*"); len(matches) != 0 {
		t.Fatalf("moved aside: %v", matches)
	}
}
