package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/snapshot"
	"github.com/prometheus/client_golang/prometheus"
)

// persist is the daemon's snapshot side: the store in --data-dir/snapshots, the restore at
// start, periodic snapshots and the last one at shutdown. Its methods are for the daemon's
// goroutines one at a time, except what loop runs beside the rest and the readiness checks,
// which any goroutine may call.
type persist struct {
	store *snapshot.Store
	log   *slog.Logger
	// readOnly, if set, is why the store was opened read-only: no snapshot is written.
	readOnly error

	mu sync.Mutex // one Write at a time (the periodic one and the final one)
	// last is what the last write held, guarded by mu: a write that holds the same is logged
	// at debug level, so that an idle daemon does not log one line per interval.
	last snapshotShape
	// failed is the last write's error; nil once one succeeds.
	failed atomic.Pointer[error]
	// newest is when the newest snapshot written or restored was taken (Unix nanoseconds; 0
	// before any), for the status page's snapshot age.
	newest atomic.Int64

	writes, failures, skipped, gapClears prometheus.Counter
	lastSeconds, lastBytes, lastSeq      prometheus.Gauge
	restoreSeconds                       prometheus.Gauge
}

// openPersist opens the snapshot store, read-only if readOnly says why (a full disk), or if a
// writable open finds no room.
func openPersist(c Config, reg *prometheus.Registry, log *slog.Logger, readOnly error) (*persist, error) {
	dir := filepath.Join(c.DataDir, "snapshots")
	cfg := snapshot.Config{Keep: c.SnapshotKeep, Logger: log, ReadOnly: readOnly != nil, Fatal: func(msg string) {
		// Pebble cannot go on (a MANIFEST write failed); the next start finds the store as the
		// last synced write left it.
		fmt.Fprintln(os.Stderr, "kvrouterd: snapshots:", msg)
		os.Exit(1)
	}}
	st, err := snapshot.Open(dir, cfg)
	if err != nil && readOnly == nil && errors.Is(err, syscall.ENOSPC) {
		readOnly = fmt.Errorf("no room to open the snapshot store: %w", err)
		cfg.ReadOnly = true
		st, err = snapshot.Open(dir, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: snapshots: %w", c.DataDir, err)
	}
	if path, cause := st.MovedAside(); path != "" {
		log.Warn("the snapshot store could not be opened; it was moved aside and a new one started", "moved_to", path, "err", cause)
	}
	if readOnly != nil {
		log.Warn("snapshot store opened read-only: the newest snapshot is restored, none is written until a restart with room", "err", readOnly)
	}
	p := &persist{store: st, log: log, readOnly: readOnly}
	var all []named
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvrouterd", Subsystem: "snapshot", Name: name, Help: help})
		all = append(all, named{c, "snapshot_" + name})
		return c
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvrouterd", Subsystem: "snapshot", Name: name, Help: help})
		all = append(all, named{g, "snapshot_" + name})
		return g
	}
	p.writes = counter("writes_total", "Snapshots written.")
	p.failures = counter("failures_total", "Snapshots that failed to write.")
	p.skipped = counter("skipped_total", "Snapshots passed over at restore because they did not verify.")
	p.gapClears = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvrouterd", Subsystem: "stream", Name: "gap_clears_total",
		Help: "Times the index was cleared because event-stream sequences were lost (retention, a recreated stream)."})
	p.lastSeconds = gauge("last_seconds", "How long the last snapshot took to write.")
	p.lastBytes = gauge("last_bytes", "Compressed size of the last snapshot.")
	p.lastSeq = gauge("last_stream_seq", "Event-stream sequence the last snapshot covers.")
	p.restoreSeconds = gauge("restore_seconds", "How long the restore at start took (0: nothing restored).")
	// When the newest snapshot was taken, for its age (time() − this): 0 before any.
	taken := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvrouterd", Subsystem: "snapshot", Name: "last_timestamp_seconds",
		Help: "When the newest snapshot written or restored was taken, in Unix seconds (0: none yet); its age is time() minus this."},
		func() float64 { return float64(p.newest.Load()) / 1e9 })
	reg.MustRegister(p.writes, p.failures, p.skipped, p.gapClears, p.lastSeconds, p.lastBytes, p.lastSeq, p.restoreSeconds, taken)
	reg.MustRegister(formerNames(append(all, named{p.gapClears, "stream_gap_clears_total"})...))
	return p, nil
}

// bootstrap fetches a peer's newest snapshot (GET /v1/snapshot) into the store, where restore
// then finds it as the newest.
func (p *persist) bootstrap(ctx context.Context, peer string) error {
	url := peer + "/v1/snapshot"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	m, err := p.store.Receive(resp.Body)
	if err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	p.log.Info("bootstrapped from a peer's snapshot", "peer", peer, "stream_seq", m.StreamSeq, "bytes", m.StoredBytes)
	return nil
}

// restore gives a router from newRouter the newest snapshot's state, falling back to older ones
// when a snapshot fails to read (each attempt on a new router, the failed one closed). It
// returns the router and the stream sequence to resume after (0 with nothing restored).
func (p *persist) restore(newRouter func() *router.Router) (*router.Router, uint64, error) {
	start := time.Now()
	before := ^uint64(0)
	for {
		sn, skipped, err := p.store.Before(before)
		for _, s := range skipped {
			p.skipped.Inc()
			p.log.Warn("snapshot skipped: it does not verify; using an older one", "id", s.ID, "err", s.Err)
		}
		if errors.Is(err, snapshot.ErrNone) {
			if before != ^uint64(0) {
				p.log.Warn("no snapshot could be restored; starting empty, the event stream rebuilds the index")
			}
			return newRouter(), 0, nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("snapshots: %w", err)
		}
		r := newRouter()
		st, tm, err := r.RestoreTimed(sn.Meta.Chunks, sn.Chunk)
		m := sn.Meta
		_ = sn.Close()
		if err != nil {
			p.skipped.Inc()
			p.log.Warn("snapshot failed to restore; using an older one", "id", m.ID, "err", err)
			r.Close()
			before = m.ID
			continue
		}
		took := time.Since(start)
		p.restoreSeconds.Set(took.Seconds())
		p.newest.Store(m.Created.UnixNano())
		p.log.Info("restored snapshot", "id", m.ID, "created", m.Created, "stream_seq", m.StreamSeq, "workers", st.Workers,
			"residencies", st.Residencies, "bytes", m.StoredBytes, "read", tm.Read, "decode", tm.Decode, "build", tm.Build, "took", took)
		return r, m.StreamSeq, nil
	}
}

// write takes a snapshot of r covering stream sequence seq (every event up to it handed to r).
func (p *persist) write(r *router.Router, seq uint64) error {
	if p.readOnly != nil {
		return fmt.Errorf("%w: %w", snapshot.ErrReadOnly, p.readOnly)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.store.Err(); err != nil {
		// Pebble is retrying a failed flush (a full disk): a write could wait for it for ever,
		// and a shutdown with it.
		err = fmt.Errorf("snapshot: the store cannot write: %w", err)
		p.failures.Inc()
		p.failed.Store(&err)
		return err
	}
	start := time.Now()
	var st router.SnapshotStats
	m, err := p.store.Write(seq, nil, func(emit func([]byte) error) error {
		var err error
		st, err = r.Snapshot(0, emit)
		return err
	})
	if err != nil {
		p.failures.Inc()
		p.failed.Store(&err)
		return err
	}
	p.failed.Store(nil)
	p.newest.Store(m.Created.UnixNano())
	took := time.Since(start)
	p.writes.Inc()
	p.lastSeconds.Set(took.Seconds())
	p.lastBytes.Set(float64(m.StoredBytes))
	p.lastSeq.Set(float64(seq))
	shape := snapshotShape{seq: seq, workers: st.Workers, residencies: st.Residencies, rawBytes: m.RawBytes}
	level := slog.LevelInfo
	if shape == p.last {
		level = slog.LevelDebug
	}
	p.last = shape
	p.log.Log(context.Background(), level, "snapshot written", "id", m.ID, "stream_seq", seq, "workers", st.Workers, "residencies", st.Residencies,
		"bytes", m.StoredBytes, "raw_bytes", m.RawBytes, "took", took)
	return nil
}

// snapshotShape is what tells two snapshots apart in the log: the stream sequence they cover,
// their workers, residencies and encoded size. Plain data.
type snapshotShape struct {
	seq         uint64
	workers     int
	residencies int64
	rawBytes    int64
}

// loop writes a snapshot every interval until ctx ends; seq reads the stream sequence every
// event up to which has been handed to r.
func (p *persist) loop(ctx context.Context, r *router.Router, interval time.Duration, seq func() uint64) {
	if interval <= 0 || p.readOnly != nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := p.write(r, seq()); err != nil {
				p.log.Warn("snapshot failed", "err", err)
			}
		}
	}
}

func (p *persist) close() error { return p.store.Close() }

// newestTime is when the newest snapshot written or restored was taken; zero before any. Safe
// for concurrent use.
func (p *persist) newestTime() time.Time {
	if n := p.newest.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// snapshotsReady is the readiness check "snapshots": the last snapshot write's error, nil
// once a later one succeeds.
func (p *persist) snapshotsReady() error {
	if err := p.failed.Load(); err != nil {
		return fmt.Errorf("the last snapshot failed: %w", *err)
	}
	if err := p.store.Err(); err != nil {
		return fmt.Errorf("the store cannot write: %w", err)
	}
	return nil
}

// diskReady is the readiness check "disk": why the store is read-only, if it is.
func (p *persist) diskReady() error {
	if p.readOnly != nil {
		return fmt.Errorf("snapshots are read-only until a restart with room: %w", p.readOnly)
	}
	return nil
}
