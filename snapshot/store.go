package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/klauspost/compress/zstd"
)

// Config is the store's configuration, a plain value that Open copies; the zero value is usable.
type Config struct {
	// Keep is the number of committed snapshots kept; Write deletes older ones. Default 3.
	Keep int
	// Logger receives skipped snapshots, a directory moved aside, and Pebble's own messages
	// (its informational ones at Debug). Default slog.Default().
	Logger *slog.Logger
	// Level is the zstd level Write compresses with. Default zstd.SpeedDefault, which on
	// index-like records (BenchmarkStoreWrite) compresses better than zstd.SpeedFastest and is
	// no slower: the fastest level's small match table misses repeats a few MB apart.
	Level zstd.EncoderLevel
	// ReadOnly opens the store without writing a byte: Pebble replays its log in memory and
	// neither flushes nor compacts, Open leaves orphan chunks and staging files where they are
	// and never moves the directory aside, and Write and Receive return ErrReadOnly. For a disk
	// with no room, where a writable open fails or, worse, Pebble retries its flush forever.
	ReadOnly bool
	// Fatal is called with Pebble's message when Pebble cannot continue (a failed MANIFEST write,
	// a broken invariant); it must not return. Default: panic.
	Fatal func(msg string)
}

const (
	defaultKeep = 3
	stagingDir  = "snapshot-staging"
	// cacheSize is Pebble's block cache: it holds index blocks and manifests. Chunk blocks are
	// larger than a cache shard, so Pebble never caches them and a restore does not double its
	// memory.
	cacheSize = 4 << 20
)

// Store is a directory of snapshots; all its methods may be called from any goroutine (the
// package doc says what runs concurrently with what).
type Store struct {
	dir    string
	cfg    Config
	log    *slog.Logger
	dec    *zstd.Decoder
	aside  string // set by Open when it moved dir aside
	reason error
	// opening is set while Open runs: a background write error then means no room to open.
	opening atomic.Bool
	// bgErr is the last background write Pebble could not make for want of room (it retries),
	// nil once a flush or compaction succeeds.
	bgErr atomic.Pointer[error]

	// Lock order: writeMu, then mu, then liveMu.

	// mu guards the database's lifetime: held shared by every use of db, exclusively by Close.
	mu     sync.RWMutex
	closed bool
	db     *pebble.DB
	lock   *pebble.Lock
	wopts  sstable.WriterOptions

	// liveMu guards live: the snapshots handed out and not yet closed, which Close releases.
	liveMu sync.Mutex
	live   map[*Snapshot]struct{}

	// writeMu serializes Write and Receive and guards what only they touch.
	writeMu   sync.Mutex
	nextID    uint64
	committed []uint64 // committed snapshot IDs, ascending
	enc       *zstd.Encoder
	encBuf    []byte // compressed chunk, reused across Writes

	// beforeCommit, if set, runs after chunks are ingested and before the manifest commit; an
	// error from it is returned as if the process had died there (nothing is cleaned up).
	// Tests only.
	beforeCommit func() error
}

// Open opens the store in dir, creating the directory if needed, and deletes chunks that a crash
// left without a manifest. If Pebble cannot open dir, or the store's own keys cannot be read,
// Open moves dir aside (see the package doc), logs it, and opens an empty store in dir instead;
// MovedAside then reports it. A directory locked by another process or not accessible to this
// one, or written by a newer layout (ErrFormat), is an error and is left alone.
func Open(dir string, cfg Config) (*Store, error) {
	if cfg.Keep <= 0 {
		cfg.Keep = defaultKeep
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Level == 0 {
		cfg.Level = zstd.SpeedDefault
	}
	if cfg.Fatal == nil {
		cfg.Fatal = func(msg string) { panic("snapshot: " + msg) }
	}
	s := &Store{dir: dir, cfg: cfg, log: cfg.Logger.With("component", "snapshot", "dir", dir), live: map[*Snapshot]struct{}{}}
	var err error
	s.enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(cfg.Level), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(false), zstd.WithZeroFrames(true))
	if err != nil {
		return nil, fmt.Errorf("snapshot: zstd encoder: %w", err)
	}
	s.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxMemory(MaxChunk), zstd.WithDecoderMaxWindow(MaxChunk))
	if err != nil {
		return nil, fmt.Errorf("snapshot: zstd decoder: %w", err)
	}
	s.opening.Store(true)
	defer s.opening.Store(false)
	err = s.open()
	var dmg *damagedError
	if errors.As(err, &dmg) && !cfg.ReadOnly {
		aside, rerr := moveAside(dir)
		if rerr != nil {
			s.dec.Close()
			return nil, fmt.Errorf("%w; moving it aside failed: %w", err, rerr)
		}
		s.log.Error("snapshot store unreadable: moved aside, starting empty", "moved_to", aside, "err", dmg.err)
		s.aside, s.reason = aside, dmg.err
		s.bgErr.Store(nil) // the abandoned database's
		err = s.open()
	}
	if err != nil {
		s.dec.Close()
		return nil, err
	}
	return s, nil
}

// renameDir is os.Rename; tests make it fail as it does on a mount point.
var renameDir = os.Rename

// moveAside renames dir to <dir>.corrupt-<unix seconds> (with a -N suffix if that exists). If
// dir cannot be renamed (it is a mount point, say), it moves dir's entries into the subdirectory
// corrupt-<unix seconds> of dir instead, which Pebble ignores.
func moveAside(dir string) (string, error) {
	stamp := strconv.FormatInt(time.Now().Unix(), 10)
	free := func(base string) string {
		p := base
		for i := 1; ; i++ {
			if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
				return p
			}
			p = base + "-" + strconv.Itoa(i)
		}
	}
	aside := free(dir + ".corrupt-" + stamp)
	rerr := renameDir(dir, aside)
	if rerr == nil {
		return aside, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", rerr
	}
	inside := free(filepath.Join(dir, "corrupt-"+stamp))
	if err := os.Mkdir(inside, 0o755); err != nil {
		return "", fmt.Errorf("%w; and in place: %w", rerr, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "corrupt-") {
			continue // an earlier one
		}
		if err := renameDir(filepath.Join(dir, e.Name()), filepath.Join(inside, e.Name())); err != nil {
			return "", fmt.Errorf("%w; and in place: %w", rerr, err)
		}
	}
	return inside, nil
}

// damagedError marks an Open failure that moving the directory aside can cure.
type damagedError struct{ err error }

func (e *damagedError) Error() string { return e.err.Error() }
func (e *damagedError) Unwrap() error { return e.err }

// open opens Pebble in s.dir and recovers the store's state. Errors the directory's contents
// caused are *damagedError. On error nothing stays open.
func (s *Store) open() (err error) {
	if !s.cfg.ReadOnly {
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	lock, err := pebble.LockDirectory(s.dir, vfs.Default)
	if err != nil {
		return fmt.Errorf("snapshot: lock %s: %w", s.dir, err)
	}
	opts := s.pebbleOptions(lock)
	var db *pebble.DB
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("pebble.Open panicked: %v", r)
			}
		}()
		db, err = pebble.Open(s.dir, opts)
	}()
	if err != nil {
		_ = lock.Close()
		// A full disk or a permission says nothing of the files: moving them aside would lose
		// good snapshots.
		if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EROFS) {
			return fmt.Errorf("snapshot: open %s: %w", s.dir, err)
		}
		return &damagedError{fmt.Errorf("snapshot: open %s: %w", s.dir, err)}
	}
	s.db, s.lock = db, lock
	// Row blocks: the columnar writer allocates a new buffer for every block, that is for every
	// chunk (5x the garbage per Write in BenchmarkStoreWrite); the row writer reuses its buffer.
	s.wopts = opts.MakeWriterOptions(0, min(db.TableFormat(), sstable.TableFormatPebblev4))
	if err := s.recover(); err != nil {
		_ = db.Close()
		_ = lock.Close()
		s.db, s.lock = nil, nil
		if errors.Is(err, ErrFormat) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EROFS) {
			return err
		}
		return &damagedError{err}
	}
	return nil
}

func (s *Store) pebbleOptions(lock *pebble.Lock) *pebble.Options {
	opts := &pebble.Options{
		ReadOnly:           s.cfg.ReadOnly,
		FormatMajorVersion: pebble.FormatNewest,
		CacheSize:          cacheSize,
		Lock:               lock,
		Logger:             pebbleLogger{s.log, s.cfg.Fatal},
		EventListener: &pebble.EventListener{
			BackgroundError: func(err error) {
				if s.opening.Load() && errors.Is(err, syscall.ENOSPC) {
					// Open waits for this flush, which Pebble retries for ever: no room to
					// open the store, and no way to return it.
					s.cfg.Fatal(fmt.Sprintf("no room to open the store in %s: %v", s.dir, err))
				}
				if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EROFS) {
					s.bgErr.Store(&err)
				}
				s.log.Error("pebble background error", "err", err.Error())
			},
			FlushEnd: func(info pebble.FlushInfo) {
				if info.Err == nil {
					s.bgErr.Store(nil)
				}
			},
			CompactionEnd: func(info pebble.CompactionInfo) {
				if info.Err == nil {
					s.bgErr.Store(nil)
				}
			},
			// Pebble's default ends the process; a corrupt table here is a skipped snapshot.
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				s.log.Error("pebble data corruption", "path", info.Path, "err", info.Details)
			},
		},
	}
	// Chunks are zstd already; manifests are small.
	opts.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionNone })
	opts.EnsureDefaults()
	return opts
}

// recover checks the layout version, deletes orphan chunks and staging files (not when
// read-only), and loads the committed IDs and the next ID. REQUIRES: s.db open, not yet shared.
func (s *Store) recover() error {
	v, closer, err := s.db.Get(formatKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound) && s.cfg.ReadOnly:
		return nil // a new store: nothing to read
	case errors.Is(err, pebble.ErrNotFound):
		if err := s.db.Set(formatKey, []byte(formatValue), pebble.Sync); err != nil {
			return fmt.Errorf("snapshot: write format key: %w", err)
		}
	case err != nil:
		return fmt.Errorf("snapshot: read format key: %w", err)
	default:
		ok := string(v) == formatValue
		got := string(v)
		_ = closer.Close()
		if !ok {
			return errorf(s.dir, ErrFormat, "store layout %q, this build reads %q", got, formatValue)
		}
	}
	manifests, err := s.scanIDs(s.db, kindManifest)
	if err != nil {
		return err
	}
	pending, err := s.scanIDs(s.db, kindPending)
	if err != nil {
		return err
	}
	s.committed = manifests
	s.nextID = 1
	if n := len(manifests); n > 0 {
		s.nextID = manifests[n-1] + 1
	}
	if n := len(pending); n > 0 && pending[n-1] >= s.nextID {
		s.nextID = pending[n-1] + 1
	}
	if s.cfg.ReadOnly {
		return nil
	}
	if len(pending) > 0 {
		b := s.db.NewBatch()
		for _, id := range pending {
			if _, ok := slices.BinarySearch(manifests, id); !ok {
				if err := deleteChunks(b, id); err != nil {
					return err
				}
				s.log.Warn("deleted chunks of an uncommitted snapshot", "id", id)
			}
			if err := b.Delete(idKey(kindPending, id), nil); err != nil {
				return err
			}
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return fmt.Errorf("snapshot: delete orphan chunks: %w", err)
		}
		s.reclaim()
	}
	staging := filepath.Join(s.dir, stagingDir)
	if err := os.RemoveAll(staging); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// pebbleReader is what pebble.DB and pebble.Snapshot share.
type pebbleReader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

// scanIDs returns the IDs of all keys of one kind (manifest or pending), ascending.
func (s *Store) scanIDs(r pebbleReader, kind byte) ([]uint64, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{kind}, UpperBound: []byte{kind + 1}})
	if err != nil {
		return nil, fmt.Errorf("snapshot: scan keys: %w", err)
	}
	var ids []uint64
	for ok := it.First(); ok; ok = it.Next() {
		id, ok := keyID(it.Key())
		if !ok {
			_ = it.Close()
			return nil, errorf("key scan", ErrCorrupt, "key %x", it.Key())
		}
		ids = append(ids, id)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("snapshot: scan keys: %w", err)
	}
	return ids, nil
}

// deleteChunks adds the deletion of every chunk of id to b.
func deleteChunks(b *pebble.Batch, id uint64) error {
	return b.DeleteRange(idKey(kindChunk, id), idKey(kindChunk, id+1), nil)
}

// reclaim flushes the memtable so that fresh range deletions reach disk, where Pebble's
// delete-only compactions drop the tables they cover. Failure costs only disk space.
// REQUIRES: s.db usable (mu held, or not yet shared).
func (s *Store) reclaim() {
	if err := s.db.Flush(); err != nil {
		s.log.Warn("flush after deleting snapshots", "err", err)
	}
}

// Err returns why Pebble cannot write in the background — a flush or compaction that failed
// for want of room (ENOSPC, EROFS), which it retries until one succeeds — or nil. While it is
// set, a Write could wait for the retries.
func (s *Store) Err() error {
	if err := s.bgErr.Load(); err != nil {
		return *err
	}
	return nil
}

// ReadOnly reports whether the store was opened with Config.ReadOnly.
func (s *Store) ReadOnly() bool { return s.cfg.ReadOnly }

// MovedAside reports whether Open found the directory unreadable and moved it aside: the path it
// was moved to and the error that made Open do it; "" and nil otherwise.
func (s *Store) MovedAside() (path string, cause error) { return s.aside, s.reason }

// Close waits for in-flight reads and commits, releases every Snapshot still open (their
// methods then return ErrClosed), and closes the database. A Write still filling fails with
// ErrClosed when it reaches its commit. Close is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.liveMu.Lock()
	for sn := range s.live {
		sn.closed = true
		_ = sn.ps.Close()
		delete(s.live, sn)
	}
	s.liveMu.Unlock()
	err := s.db.Close()
	if lerr := s.lock.Close(); err == nil {
		err = lerr
	}
	s.dec.Close()
	if err != nil {
		return fmt.Errorf("snapshot: close: %w", err)
	}
	return nil
}

// List returns the snapshots whose manifests verify, newest first. It reads manifests only; a
// snapshot whose manifest fails is left out (Latest reports it).
func (s *Store) List() ([]Meta, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	ps := s.db.NewSnapshot()
	defer ps.Close()
	ids, err := s.scanIDs(ps, kindManifest)
	if err != nil {
		return nil, err
	}
	out := make([]Meta, 0, len(ids))
	for _, id := range slices.Backward(ids) {
		m, _, _, err := readManifest(ps, id)
		if err == nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// Skipped is a snapshot Latest or Before passed over, and why. Err wraps ErrCorrupt (or
// ErrFormat, or Pebble's error) and names the chunk or field at fault.
type Skipped struct {
	ID  uint64
	Err error
}

// Latest returns the newest snapshot that verifies (manifest and every chunk's checksum; see the
// package doc), and the newer ones it skipped, newest first. It returns ErrNone if no snapshot
// verifies. The caller must Close the Snapshot.
func (s *Store) Latest() (*Snapshot, []Skipped, error) { return s.Before(^uint64(0)) }

// Before is Latest among the snapshots with ID < id: a restore that fails on a snapshot from
// Latest calls Before(sn.Meta.ID) to fall back to the next older one.
func (s *Store) Before(id uint64) (*Snapshot, []Skipped, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	ps := s.db.NewSnapshot()
	ids, err := s.scanIDs(ps, kindManifest)
	if err != nil {
		_ = ps.Close()
		return nil, nil, err
	}
	var skipped []Skipped
	for _, mid := range slices.Backward(ids) {
		if mid >= id {
			continue
		}
		sn, err := s.load(ps, mid)
		if err == nil {
			s.liveMu.Lock()
			s.live[sn] = struct{}{}
			s.liveMu.Unlock()
			return sn, skipped, nil
		}
		s.log.Warn("skipped snapshot that does not verify", "id", mid, "err", err)
		skipped = append(skipped, Skipped{ID: mid, Err: err})
	}
	_ = ps.Close()
	return nil, skipped, ErrNone
}

// readManifest reads and checks the manifest of id. The returned Meta's Info is a copy.
func readManifest(r pebbleReader, id uint64) (Meta, []chunkEntry, []byte, error) {
	v, closer, err := r.Get(idKey(kindManifest, id))
	if err != nil {
		if errors.Is(err, pebble.ErrNotFound) {
			err = errorf("manifest", ErrCorrupt, "missing")
		}
		return Meta{}, nil, nil, within("snapshot "+strconv.FormatUint(id, 10), err)
	}
	b := bytes.Clone(v)
	_ = closer.Close()
	m, chunks, err := decodeManifest(b)
	if err != nil {
		return Meta{}, nil, nil, within("snapshot "+strconv.FormatUint(id, 10), err)
	}
	if m.ID != id {
		return Meta{}, nil, nil, errorf(fmt.Sprintf(`snapshot %d manifest field "id" at offset 8`, id), ErrCorrupt, "%d, the key says %d", m.ID, id)
	}
	return m, chunks, b, nil
}

// pebbleLogger routes Pebble's log to slog. Fatalf must not return; Pebble calls it on broken
// invariants and failed MANIFEST writes, where the process cannot continue.
type pebbleLogger struct {
	l     *slog.Logger
	fatal func(msg string)
}

func (p pebbleLogger) Infof(format string, args ...any) {
	if p.l.Enabled(context.Background(), slog.LevelDebug) {
		p.l.Debug("pebble: " + fmt.Sprintf(format, args...))
	}
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("pebble: " + fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	p.fatal(msg)
	panic("snapshot: " + msg) // fatal returned
}
