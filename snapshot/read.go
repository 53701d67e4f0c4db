package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/zeebo/xxh3"
)

// Snapshot is one snapshot that verified when Latest or Before returned it, read from a pinned,
// consistent view of the store. All its methods may be called from any goroutine, Chunk
// concurrently for any indexes; Close must not be called before the other calls have returned.
type Snapshot struct {
	Meta Meta

	s        *Store
	id       uint64
	ps       *pebble.Snapshot
	chunks   []chunkEntry
	keys     []byte // chunk i's key is keys[i*13 : i*13+13]
	manifest []byte
	// closed is written under s.mu held exclusively, or under s.mu shared and mu; read under
	// s.mu shared and mu shared.
	mu     sync.RWMutex
	closed bool
}

// load reads snapshot id from ps and verifies its manifest and every chunk's checksum.
// REQUIRES: s.mu held shared.
func (s *Store) load(ps *pebble.Snapshot, id uint64) (*Snapshot, error) {
	m, chunks, man, err := readManifest(ps, id)
	if err != nil {
		return nil, err
	}
	m.Info = bytes.Clone(m.Info) // the manifest bytes stay private for WriteTo
	sn := &Snapshot{Meta: m, s: s, id: id, ps: ps, chunks: chunks, manifest: man}
	sn.keys = make([]byte, 0, chunkKeySize*len(chunks))
	for i := range chunks {
		sn.keys = chunkKey(sn.keys, id, i)
	}
	if err := sn.verifyAll(); err != nil {
		return nil, err
	}
	return sn, nil
}

// verifyAll checks every chunk's presence, length and checksum, on up to GOMAXPROCS goroutines.
// It returns the error of the lowest failing chunk it saw.
func (sn *Snapshot) verifyAll() error {
	n := len(sn.chunks)
	workers := min(runtime.GOMAXPROCS(0), n)
	var (
		next   atomic.Int64
		failed atomic.Bool
		mu     sync.Mutex
		first  = n
		ferr   error
		wg     sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				_, c, err := sn.get(i)
				if err == nil {
					_ = c.Close()
					continue
				}
				failed.Store(true)
				mu.Lock()
				if i < first {
					first, ferr = i, err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ferr
}

// get returns chunk i's stored bytes after checking them against the manifest; the caller closes
// the closer. REQUIRES: s.mu held shared, sn open.
func (sn *Snapshot) get(i int) ([]byte, io.Closer, error) {
	v, c, err := sn.ps.Get(sn.keys[i*chunkKeySize : (i+1)*chunkKeySize])
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil, errorf(sn.where(i), ErrCorrupt, "missing")
	}
	if err != nil {
		return nil, nil, within(sn.where(i), err)
	}
	e := sn.chunks[i]
	if len(v) != int(e.stored) {
		_ = c.Close()
		return nil, nil, errorf(sn.where(i), ErrCorrupt, "%d stored bytes, manifest says %d", len(v), e.stored)
	}
	if sum := xxh3.Hash(v); sum != e.sum {
		_ = c.Close()
		return nil, nil, errorf(sn.where(i), ErrCorrupt, "checksum %#016x, manifest says %#016x", sum, e.sum)
	}
	return v, c, nil
}

func (sn *Snapshot) where(i int) string { return fmt.Sprintf("snapshot %d chunk %d", sn.id, i) }

// ChunkLen returns the decompressed length of chunk i, so that a caller can size its buffers.
func (sn *Snapshot) ChunkLen(i int) int { return int(sn.chunks[i].raw) }

// Chunk decompresses chunk i into dst's storage and returns it; dst is reallocated only if its
// capacity is below ChunkLen(i), so a caller that reuses its buffer allocates nothing per chunk.
// It verifies the checksum again and the decompressed length; on error (wrapping ErrCorrupt for
// bad data) the caller abandons this snapshot and falls back with Store.Before(Meta.ID).
func (sn *Snapshot) Chunk(i int, dst []byte) ([]byte, error) {
	if i < 0 || i >= len(sn.chunks) {
		return dst[:0], fmt.Errorf("snapshot %d: chunk index %d out of range [0, %d)", sn.id, i, len(sn.chunks))
	}
	out := dst[:0]
	err := sn.stored(i, func(v []byte) error {
		var err error
		if out, err = sn.s.decompress(dst, v, sn.chunks[i].raw); err != nil {
			return within(sn.where(i), err)
		}
		return nil
	})
	return out, err
}

// WriteTo writes the snapshot as a portable stream (see the package doc). Every chunk is checked
// against its checksum before it is sent; on a mismatch WriteTo stops, so the receiver sees a
// truncated stream and rejects it. No lock is held while w blocks.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) {
	k, err := w.Write(sn.manifest)
	n := int64(k)
	if err != nil {
		return n, err
	}
	var buf []byte
	for i := range sn.chunks {
		if buf, err = sn.copyChunk(i, buf[:0]); err != nil {
			return n, err
		}
		k, err = w.Write(buf)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// copyChunk appends chunk i's verified stored bytes to dst.
func (sn *Snapshot) copyChunk(i int, dst []byte) ([]byte, error) {
	err := sn.stored(i, func(v []byte) error { dst = append(dst, v...); return nil })
	return dst, err
}

// stored calls f with chunk i's verified stored (compressed) bytes, valid only during the call,
// holding the locks that keep the view open meanwhile.
func (sn *Snapshot) stored(i int, f func(v []byte) error) error {
	s := sn.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	sn.mu.RLock()
	defer sn.mu.RUnlock()
	if sn.closed {
		return ErrClosed
	}
	v, c, err := sn.get(i)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(v)
}

// Close releases the pinned view, letting the store reclaim the disk space of data deleted
// since. It is idempotent, and a no-op after Store.Close.
func (sn *Snapshot) Close() error {
	s := sn.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.closed {
		return nil
	}
	sn.closed = true
	s.liveMu.Lock()
	delete(s.live, sn)
	s.liveMu.Unlock()
	return sn.ps.Close()
}
