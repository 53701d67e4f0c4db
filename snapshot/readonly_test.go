package snapshot

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
)

// tree lists every file under dir with its size and modification time, but for the LOCK file:
// taking the lock truncates that empty file, which needs no space.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			b.WriteString(rel + "/\n")
			return nil
		}
		if rel != "LOCK" {
			b.WriteString(rel + " " + fi.ModTime().Format(time.RFC3339Nano) + " " + strconv.FormatInt(fi.Size(), 10) + "\n")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestReadOnly opens a store that a torn write left with orphan chunks and a staging file, as a
// full disk leaves it, read-only: the newest snapshot restores, writes are refused with
// ErrReadOnly, and not one file of the directory changes.
func TestReadOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, _ := openT(t, dir, 3)
	writeT(t, s, 1, "old", [][]byte{[]byte("one")})
	chunks := [][]byte{bytes.Repeat([]byte("a"), 5000), []byte("b")}
	good := writeT(t, s, 7, "good", chunks)
	s.beforeCommit = func() error { return errors.New("simulated crash") }
	if _, err := s.Write(8, nil, func(emit func([]byte) error) error { return emit([]byte("torn")) }); err == nil {
		t.Fatal("the torn write succeeded")
	}
	if err := os.WriteFile(filepath.Join(dir, stagingDir, "999.sst"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.Close()
	before := tree(t, dir)

	var lb syncbuf.Buffer
	ro, err := Open(dir, Config{ReadOnly: true, Logger: slog.New(slog.NewTextHandler(&lb, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if !ro.ReadOnly() {
		t.Fatal("ReadOnly() = false")
	}
	sn, _, err := ro.Latest()
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, sn, good, chunks)
	sn.Close()
	if _, err := ro.Write(9, nil, func(emit func([]byte) error) error { return emit([]byte("x")) }); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Write on a read-only store: %v", err)
	}
	if _, err := ro.Receive(strings.NewReader("")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Receive on a read-only store: %v", err)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	if after := tree(t, dir); after != before {
		t.Fatalf("a read-only open changed the directory:\nbefore\n%s\nafter\n%s\nlog:\n%s", before, after, lb.String())
	}

	// A directory that never held a store opens empty and is not created.
	none := filepath.Join(t.TempDir(), "none")
	if ro, err := Open(none, Config{ReadOnly: true, Logger: discardLogger()}); err == nil {
		_, _, err = ro.Latest()
		ro.Close()
		if !errors.Is(err, ErrNone) {
			t.Fatalf("Latest of an empty read-only store: %v", err)
		}
	}
}
