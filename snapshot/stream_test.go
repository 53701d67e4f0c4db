package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// streamOf writes a snapshot of chunks into a fresh store and returns its stream.
func streamOf(t testing.TB, dir string, info string, chunks [][]byte) (Meta, []byte) {
	t.Helper()
	s, err := Open(dir, Config{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := s.Write(77, []byte(info), func(emit func([]byte) error) error {
		for _, c := range chunks {
			if err := emit(c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sn, _, err := s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	var buf bytes.Buffer
	n, err := sn.WriteTo(&buf)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("WriteTo = %d, %v; wrote %d", n, err, buf.Len())
	}
	if want := int64(manifestSize(len(chunks), len(info))) + m.StoredBytes; n != want {
		t.Fatalf("stream of %d bytes, want %d", n, want)
	}
	return m, buf.Bytes()
}

func TestStreamRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	chunks := append(randChunks(r, 6, 50000), nil, []byte("last"))
	sent, stream := streamOf(t, filepath.Join(t.TempDir(), "a"), "counts", chunks)

	s, _ := openT(t, filepath.Join(t.TempDir(), "b"), 3)
	defer s.Close()
	local := writeT(t, s, 5, "", [][]byte{[]byte("local")})
	got, err := s.Receive(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	want := sent
	want.ID = local.ID + 1 // a new local ID; everything else is the sender's
	if got.ID != want.ID || !got.Created.Equal(want.Created) || got.StreamSeq != want.StreamSeq ||
		got.Chunks != want.Chunks || got.RawBytes != want.RawBytes || got.StoredBytes != want.StoredBytes || !bytes.Equal(got.Info, want.Info) {
		t.Fatalf("Receive = %+v, want %+v", got, want)
	}
	sn, _, err := s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	checkSnapshot(t, sn, want, chunks)
	// Sent on again, the stream is the same but for the ID and the manifest checksum.
	var again bytes.Buffer
	if _, err := sn.WriteTo(&again); err != nil {
		t.Fatal(err)
	}
	size := manifestSize(len(chunks), len("counts"))
	if !bytes.Equal(again.Bytes()[16:size-8], stream[16:size-8]) || !bytes.Equal(again.Bytes()[size:], stream[size:]) {
		t.Fatal("re-sent stream differs")
	}
	if binary.LittleEndian.Uint64(again.Bytes()[8:]) != want.ID {
		t.Fatal("re-sent stream does not carry the local ID")
	}
}

// storeState is what a rejected stream must leave unchanged.
func storeState(t *testing.T, s *Store) string {
	t.Helper()
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(s.dir, stagingDir))
	return fmt.Sprintf("list %v, chunks of %v, %d pending, %d staging", idsOf(list), chunkIDs(t, s), keyCount(t, s, kindPending), len(entries))
}

func TestStreamRejected(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	chunks := randChunks(r, 3, 30000)
	_, stream := streamOf(t, filepath.Join(t.TempDir(), "a"), "xy", chunks)
	size := manifestSize(len(chunks), 2)

	s, _ := openT(t, filepath.Join(t.TempDir(), "b"), 3)
	defer s.Close()
	writeT(t, s, 5, "", [][]byte{[]byte("local")})
	before := storeState(t, s)

	f := func(name string, in []byte, want error, where string) {
		t.Helper()
		_, err := s.Receive(bytes.NewReader(in))
		if !errors.Is(err, want) {
			t.Fatalf("%s: Receive = %v, want %v", name, err, want)
		}
		if !strings.Contains(err.Error(), where) {
			t.Fatalf("%s: error %q does not say %q", name, err, where)
		}
		if after := storeState(t, s); after != before {
			t.Fatalf("%s: store changed: %q, was %q", name, after, before)
		}
	}
	flip := func(off int) []byte {
		b := bytes.Clone(stream)
		b[off] ^= 0x01
		return b
	}
	f("empty", nil, ErrTruncated, "manifest head")
	f("head cut", stream[:40], ErrTruncated, "stream ends at offset 40")
	f("manifest cut", stream[:size-1], ErrTruncated, "manifest of 3 chunks")
	f("no chunks", stream[:size], ErrTruncated, "chunk 0 at offset")
	f("last chunk cut", stream[:len(stream)-1], ErrTruncated, "chunk 2")
	f("magic", flip(0), ErrFormat, `"magic" at offset 0`)
	f("version", flip(4), ErrFormat, `"version"`)
	f("flags", flip(7), ErrFormat, `"flags"`)
	f("id", flip(8), ErrCorrupt, `"checksum"`)
	f("stream_seq", flip(25), ErrCorrupt, `"checksum"`)
	f("chunk table", flip(size-20), ErrCorrupt, `"checksum"`)
	f("manifest checksum", flip(size-1), ErrCorrupt, `"checksum"`)
	f("first chunk", flip(size+3), ErrCorrupt, "stream chunk 0 at offset")
	f("last chunk", flip(len(stream)-2), ErrCorrupt, "stream chunk 2")
	f("trailing byte", append(bytes.Clone(stream), 0), ErrFormat, "trailing bytes")
	huge := bytes.Clone(stream)
	binary.LittleEndian.PutUint32(huge[48:], MaxChunks+1)
	f("chunk count", huge, ErrFormat, `"chunk_count" at offset 48`)
	// A checksum-consistent stream whose chunk is not zstd is caught by decompression.
	bad := bytes.Clone(stream)
	for i := size; i < size+10; i++ {
		bad[i] = 0
	}
	fixChecksums(bad)
	f("not zstd", bad, ErrCorrupt, "zstd")
	// A reader that fails mid-stream.
	ioErr := errors.New("connection reset")
	_, err := s.Receive(io.MultiReader(bytes.NewReader(stream[:size+100]), errReader{ioErr}))
	if !errors.Is(err, ioErr) {
		t.Fatalf("failing reader: %v", err)
	}
	if after := storeState(t, s); after != before {
		t.Fatal("failing reader changed the store")
	}
	// The intact stream still goes in after all that.
	if _, err := s.Receive(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.List(); len(list) != 2 {
		t.Fatalf("List has %d snapshots", len(list))
	}
	if ids := idsOf(mustList(t, s)); !slices.IsSortedFunc(ids, func(a, b uint64) int { return int(b) - int(a) }) {
		t.Fatalf("List not newest first: %v", ids)
	}
}

func mustList(t *testing.T, s *Store) []Meta {
	t.Helper()
	l, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// fixChecksums rewrites, where the stream is long enough to hold them, the chunk checksums and
// the manifest checksum of a stream so that they match its bytes. The fuzz target uses it to get
// past the checksums to the decoder and the store.
func fixChecksums(b []byte) {
	n, l, err := parseHead(b)
	if err != nil {
		return
	}
	size := manifestSize(n, l)
	if len(b) < size {
		return
	}
	off := size
	for i := range n {
		e := b[manifestHead+l+chunkEntrySize*i:]
		stored := int(binary.LittleEndian.Uint32(e[4:]))
		if off+stored > len(b) {
			break
		}
		binary.LittleEndian.PutUint64(e[8:], xxh3Sum(b[off:off+stored]))
		off += stored
	}
	binary.LittleEndian.PutUint64(b[size-8:], xxh3Sum(b[:size-8]))
}

func FuzzReceive(f *testing.F) {
	dir := f.TempDir()
	r := rand.New(rand.NewPCG(11, 11))
	_, full := streamOf(f, filepath.Join(dir, "a"), "info", append(randChunks(r, 2, 3000), nil))
	_, empty := streamOf(f, filepath.Join(dir, "b"), "", nil)
	records := make([]byte, 0, 4096)
	for i := range 256 {
		records = binary.LittleEndian.AppendUint64(records, uint64(i%17)*0x9E3779B97F4A7C15)
		records = binary.LittleEndian.AppendUint64(records, uint64(i))
	}
	_, recs := streamOf(f, filepath.Join(dir, "c"), "", [][]byte{records, records[:160]})
	for _, seed := range [][]byte{full, empty, recs, full[:len(full)/2], empty[:20], []byte("KVSN")} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	s, err := Open(filepath.Join(dir, "store"), Config{Keep: 2, Logger: discardLogger()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		if fix {
			in = bytes.Clone(in)
			fixChecksums(in)
		}
		m, err := s.Receive(bytes.NewReader(in))
		if err != nil {
			var e *Error
			if !errors.As(err, &e) && !errors.Is(err, ErrClosed) {
				t.Fatalf("error without location: %v", err)
			}
			return
		}
		// Accepted: it is now the newest snapshot and sends back what came in.
		sn, _, err := s.Latest()
		if err != nil {
			t.Fatalf("accepted stream not readable: %v", err)
		}
		defer sn.Close()
		if sn.Meta.ID != m.ID {
			t.Fatalf("Latest is %d, received %d", sn.Meta.ID, m.ID)
		}
		var out bytes.Buffer
		if _, err := sn.WriteTo(&out); err != nil {
			t.Fatal(err)
		}
		size := manifestSize(m.Chunks, len(m.Info))
		if out.Len() != len(in) || !bytes.Equal(out.Bytes()[16:size-8], in[16:size-8]) || !bytes.Equal(out.Bytes()[size:], in[size:]) {
			t.Fatal("accepted stream does not round-trip")
		}
		var buf []byte
		for i := range m.Chunks {
			if buf, err = sn.Chunk(i, buf); err != nil {
				t.Fatalf("accepted stream's chunk %d: %v", i, err)
			}
		}
	})
}
