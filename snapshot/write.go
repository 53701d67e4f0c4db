package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/zeebo/xxh3"
)

// Write stores a snapshot of state that includes the event stream up to streamSeq, with info as
// its opaque header. fill calls emit once per chunk, in order, cutting chunks at record
// boundaries; emit compresses the chunk and appends it to a staging table, and keeps nothing of
// chunk after it returns. When fill returns nil, Write ingests the chunks and commits the
// manifest, together with the deletion of the snapshots beyond Config.Keep, in one synced batch.
// An error from fill or emit abandons the snapshot; fill should return emit's error.
//
// Write runs on the caller's goroutine and uses one core for compression. Writes and Receives run
// one at a time; Latest, List and Snapshot reads proceed meanwhile.
func (s *Store) Write(streamSeq uint64, info []byte, fill func(emit func(chunk []byte) error) error) (Meta, error) {
	if len(info) > MaxInfo {
		return Meta{}, errorf("write info", ErrTooLarge, "%d bytes, limit %d", len(info), MaxInfo)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.checkOpen(); err != nil {
		return Meta{}, err
	}
	created := time.Now()
	t := s.begin()
	defer t.abort()
	var emitErr error
	emit := func(chunk []byte) error {
		if emitErr != nil {
			return emitErr
		}
		if len(chunk) > MaxChunk {
			emitErr = errorf("write chunk "+strconv.Itoa(len(t.chunks)), ErrTooLarge, "%d bytes, limit %d", len(chunk), MaxChunk)
			return emitErr
		}
		s.encBuf = s.enc.EncodeAll(chunk, s.encBuf[:0])
		emitErr = t.add(s.encBuf, len(chunk), xxh3.Hash(s.encBuf))
		return emitErr
	}
	err := fill(emit)
	if emitErr != nil {
		return Meta{}, emitErr
	}
	if err != nil {
		return Meta{}, fmt.Errorf("snapshot: write: fill: %w", err)
	}
	return t.commit(created, streamSeq, info)
}

// Receive reads a portable stream (see the package doc), verifies all of it, and stores it as
// the newest snapshot under a new local ID. A stream that fails any check is rejected with an
// error naming the field or chunk and the stream offset, and the store is left as it was.
//
// Receive holds the store's write slot while it reads r, so a periodic Write waits for it: give r
// a deadline. It buffers one chunk, compressed and decompressed, at a time.
func (s *Store) Receive(r io.Reader) (Meta, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.checkOpen(); err != nil {
		return Meta{}, err
	}
	sr := streamReader{r: r}
	man, err := sr.read(nil, manifestHead)
	if err != nil {
		return Meta{}, within("stream manifest head", err)
	}
	n, l, err := parseHead(man)
	if err != nil {
		return Meta{}, within("stream", err)
	}
	if man, err = sr.read(man, manifestSize(n, l)-manifestHead); err != nil {
		return Meta{}, within(fmt.Sprintf("stream manifest of %d chunks", n), err)
	}
	m, chunks, err := decodeManifest(man)
	if err != nil {
		return Meta{}, within("stream", err)
	}
	t := s.begin()
	defer t.abort()
	var buf, raw []byte
	for i, c := range chunks {
		where := fmt.Sprintf("stream chunk %d at offset %d", i, sr.off)
		if buf, err = sr.read(buf[:0], int(c.stored)); err != nil {
			return Meta{}, within(where, err)
		}
		if sum := xxh3.Hash(buf); sum != c.sum {
			return Meta{}, errorf(where, ErrCorrupt, "checksum %#016x, manifest says %#016x", sum, c.sum)
		}
		if raw, err = s.decompress(raw, buf, c.raw); err != nil {
			return Meta{}, within(where, err)
		}
		if err := t.add(buf, int(c.raw), c.sum); err != nil {
			return Meta{}, err
		}
	}
	var one [1]byte
	if k, _ := io.ReadFull(r, one[:]); k > 0 {
		return Meta{}, errorf(fmt.Sprintf("stream end at offset %d", sr.off), ErrFormat, "trailing bytes")
	}
	return t.commit(m.Created, m.StreamSeq, m.Info)
}

// streamReader reads a stream and counts its offset.
type streamReader struct {
	r   io.Reader
	off int64
}

// read appends n bytes to dst. It grows dst in steps as bytes arrive, so that a stream that
// announces more than it sends costs memory only for what it sent.
func (sr *streamReader) read(dst []byte, n int) ([]byte, error) {
	const step = 1 << 20
	want := len(dst) + n
	for len(dst) < want {
		k := min(want-len(dst), step)
		dst = slices.Grow(dst, k)
		got, err := io.ReadFull(sr.r, dst[len(dst):len(dst)+k])
		dst = dst[:len(dst)+got]
		sr.off += int64(got)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return dst, errorf("", ErrTruncated, "stream ends at offset %d, %d bytes short", sr.off, want-len(dst))
		}
		if err != nil {
			return dst, fmt.Errorf("read at offset %d: %w", sr.off, err)
		}
	}
	return dst, nil
}

// decompress decodes src into dst's storage (reallocated if it cannot hold raw bytes) and checks
// that it is exactly raw bytes long.
func (s *Store) decompress(dst, src []byte, raw uint32) ([]byte, error) {
	if cap(dst) < int(raw) {
		dst = make([]byte, 0, raw)
	}
	out, err := s.dec.DecodeAll(src, dst[:0])
	if err != nil {
		return dst[:0], errorf("", ErrCorrupt, "zstd: %v", err)
	}
	if len(out) != int(raw) {
		return dst[:0], errorf("", ErrCorrupt, "decompressed to %d bytes, manifest says %d", len(out), raw)
	}
	return out, nil
}

func (s *Store) checkOpen() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	if s.cfg.ReadOnly {
		return ErrReadOnly
	}
	return nil
}

// txn is one Write or Receive in progress: a staging table of chunks, then the commit.
type txn struct {
	s      *Store
	id     uint64
	path   string
	w      *sstable.Writer
	chunks []chunkEntry
	raw    int64
	stored int64
	key    []byte
	// ingested: chunks of id may be in the database, so abort must delete them.
	ingested bool
	// done: committed, or left behind as a simulated crash; abort does nothing.
	done bool
}

// begin starts a txn under a fresh ID. REQUIRES: s.writeMu held.
func (s *Store) begin() *txn {
	id := s.nextID
	s.nextID++
	return &txn{s: s, id: id, path: filepath.Join(s.dir, stagingDir, strconv.FormatUint(id, 10)+".sst")}
}

// add appends one compressed chunk to the staging table.
func (t *txn) add(stored []byte, raw int, sum uint64) error {
	if len(t.chunks) == MaxChunks {
		return errorf("write", ErrTooLarge, "more than %d chunks", MaxChunks)
	}
	if t.w == nil {
		f, err := vfs.Default.Create(t.path, vfs.WriteCategoryUnspecified)
		if err != nil {
			return fmt.Errorf("snapshot: write: %w", err)
		}
		t.w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), t.s.wopts)
	}
	t.key = chunkKey(t.key[:0], t.id, len(t.chunks))
	if err := t.w.Set(t.key, stored); err != nil {
		return fmt.Errorf("snapshot: write: chunk %d: %w", len(t.chunks), err)
	}
	t.chunks = append(t.chunks, chunkEntry{raw: uint32(raw), stored: uint32(len(stored)), sum: sum})
	t.raw += int64(raw)
	t.stored += int64(len(stored))
	return nil
}

// commit finishes the staging table, ingests it, and commits the manifest and the pruning of old
// snapshots in one synced batch. REQUIRES: s.writeMu held.
func (t *txn) commit(created time.Time, streamSeq uint64, info []byte) (Meta, error) {
	s := t.s
	if t.w != nil {
		err := t.w.Close() // flushes and syncs the file
		t.w = nil
		if err != nil {
			return Meta{}, fmt.Errorf("snapshot: write: finish table: %w", err)
		}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return Meta{}, ErrClosed
	}
	if len(t.chunks) > 0 {
		// pending must be durable before any chunk is, so that Open finds chunks a crash orphans.
		if err := s.db.Set(idKey(kindPending, t.id), nil, pebble.Sync); err != nil {
			return Meta{}, fmt.Errorf("snapshot: write: %w", err)
		}
		t.ingested = true
		if err := s.db.Ingest(context.Background(), []string{t.path}); err != nil {
			return Meta{}, fmt.Errorf("snapshot: write: ingest: %w", err)
		}
	}
	if h := s.beforeCommit; h != nil {
		if err := h(); err != nil {
			t.done = true
			return Meta{}, err
		}
	}
	m := Meta{
		ID:          t.id,
		Created:     created,
		StreamSeq:   streamSeq,
		Chunks:      len(t.chunks),
		RawBytes:    t.raw,
		StoredBytes: t.stored,
		Info:        bytes.Clone(info),
	}
	b := s.db.NewBatch()
	defer b.Close()
	err := b.Set(idKey(kindManifest, t.id), appendManifest(nil, &m, t.chunks), nil)
	if err == nil && t.ingested {
		err = b.Delete(idKey(kindPending, t.id), nil)
	}
	var pruned []uint64
	if n := len(s.committed); n >= s.cfg.Keep {
		pruned = s.committed[:n-s.cfg.Keep+1]
	}
	for _, old := range pruned {
		if err == nil {
			err = b.Delete(idKey(kindManifest, old), nil)
		}
		if err == nil {
			err = deleteChunks(b, old)
		}
	}
	if err == nil {
		err = b.Commit(pebble.Sync)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("snapshot: write: commit: %w", err)
	}
	t.done = true
	s.committed = append(slices.Clone(s.committed[len(pruned):]), t.id)
	if len(pruned) > 0 {
		s.reclaim()
	}
	return m, nil
}

// abort removes what an uncommitted txn left: the staging file and, if they were ingested, its
// chunks. What it cannot remove (the store closed meanwhile) Open removes. REQUIRES: s.writeMu.
func (t *txn) abort() {
	if t.done {
		return
	}
	t.done = true
	if t.w != nil {
		_ = t.w.Close()
	}
	if err := os.Remove(t.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.s.log.Warn("remove staging table", "path", t.path, "err", err)
	}
	if !t.ingested {
		return
	}
	s := t.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return
	}
	b := s.db.NewBatch()
	defer b.Close()
	err := deleteChunks(b, t.id)
	if err == nil {
		err = b.Delete(idKey(kindPending, t.id), nil)
	}
	if err == nil {
		err = b.Commit(pebble.NoSync)
	}
	if err != nil {
		s.log.Warn("delete chunks of an abandoned snapshot", "id", t.id, "err", err)
		return
	}
	s.reclaim()
}
