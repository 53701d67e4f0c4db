package main

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/snapshot"
	"github.com/kvrouterd/kvrouterd/wire"
)

// snapshotDir writes into dir/snapshots one snapshot of workers workers holding perWorker blocks
// each (a residency per block): 60 % of a worker's blocks from a pool of prefixes that many
// workers share, the rest its own, as after a day of serving prompts with common system
// prompts. It returns the residencies.
func snapshotDir(tb testing.TB, dir string, workers, perWorker int) int64 {
	tb.Helper()
	st := openStore(tb, dir)
	defer st.Close()
	r := rand.New(rand.NewPCG(1, 1))
	pool := make([]uint64, 1<<16)
	for i := range pool {
		pool[i] = r.Uint64()
	}
	var n int64
	// Stream sequence 0: the daemon then reads its (empty) stream from the start.
	_, err := st.Write(0, nil, func(emit func([]byte) error) error {
		var buf []byte
		w := wire.SnapshotWorker{Model: "m", BlockSize: 16, Ranks: []wire.SnapshotRank{{Cursor: 1}}}
		rk := &w.Ranks[0]
		for id := range workers {
			w.ID = uint64(id + 1)
			rk.Seqs, rk.Engines = rk.Seqs[:0], rk.Engines[:0]
			shared := perWorker * 6 / 10
			start := r.IntN(len(pool) - shared)
			rk.Seqs = append(rk.Seqs, pool[start:start+shared]...)
			for len(rk.Seqs) < perWorker {
				rk.Seqs = append(rk.Seqs, r.Uint64())
			}
			slices.Sort(rk.Seqs)
			for _, s := range rk.Seqs {
				rk.Engines = append(rk.Engines, s^0x5bd1e995)
			}
			n += int64(perWorker)
			buf = wire.AppendSnapshotWorker(buf, &w)
			if len(buf) >= router.DefaultChunkSize {
				if err := emit(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
		}
		return emit(buf)
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

var (
	sinceStart  = regexp.MustCompile(`since_start=([0-9.]+[µm]?s)`)
	restoreTook = regexp.MustCompile(`msg="restored snapshot".* took=([0-9.]+[µm]?s)`)
)

// BenchmarkRestart measures the built binary from process start to ready (/readyz 200) on a data
// directory holding a snapshot of 10^7 residencies (1,000 workers × 10^4 blocks; -short: 10^6),
// with its embedded NATS server; it reports the daemon's own restore time and time to ready
// from its log, and the restore rate.
func BenchmarkRestart(b *testing.B) {
	workers, per := benchSize()
	bin := buildDaemon(b)
	dir := b.TempDir()
	res := snapshotDir(b, dir, workers, per)
	var ready, restore []time.Duration
	b.ResetTimer()
	for range b.N {
		var logs bytes.Buffer
		var mu sync.Mutex
		addr := freeport.TB(b)
		cmd := exec.Command(bin, "--http-addr", addr, "--nats-listen", "127.0.0.1:0", "--data-dir", dir,
			"--snapshot-interval", "0", "--shards", "2")
		cmd.Stderr = lockedWriter{&mu, &logs}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		for {
			if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Since(start) > time.Minute {
				cmd.Process.Kill()
				b.Fatalf("not ready:\n%s", logs.String())
			}
			time.Sleep(time.Millisecond)
		}
		wall := time.Since(start)
		cmd.Process.Kill() // no shutdown snapshot: every run restores the same one
		cmd.Wait()
		mu.Lock()
		log := logs.String()
		mu.Unlock()
		m, m2 := sinceStart.FindStringSubmatch(log), restoreTook.FindStringSubmatch(log)
		if m == nil || m2 == nil {
			b.Fatalf("no timings in the log:\n%s", log)
		}
		d, _ := time.ParseDuration(m[1])
		rd, _ := time.ParseDuration(m2[1])
		ready, restore = append(ready, d), append(restore, rd)
		b.ReportMetric(float64(wall)/1e6, "wall-ms")
	}
	slices.Sort(ready)
	slices.Sort(restore)
	b.ReportMetric(float64(ready[len(ready)/2])/1e6, "ready-ms")
	b.ReportMetric(float64(restore[len(restore)/2])/1e6, "restore-ms")
	b.ReportMetric(float64(res)/restore[len(restore)/2].Seconds(), "residencies/s")
	b.ReportMetric(float64(res), "residencies")
}

// BenchmarkSnapshotWrite measures writing a snapshot of 10^7 residencies (-short: 10^6) from a
// router holding them: copying each worker's state on its shard, sorting, encoding, compressing
// and committing to the store.
func BenchmarkSnapshotWrite(b *testing.B) {
	workers, per := benchSize()
	src := b.TempDir()
	res := snapshotDir(b, src, workers, per)
	st := openStore(b, src)
	sn, _, err := st.Latest()
	if err != nil {
		b.Fatal(err)
	}
	r := router.New(router.Config{Shards: 2, Logger: quiet()})
	defer r.Close()
	if _, err := r.Restore(sn.Meta.Chunks, sn.Chunk); err != nil {
		b.Fatal(err)
	}
	sn.Close()
	st.Close()
	dst := openStore(b, b.TempDir())
	defer dst.Close()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		// What the daemon's snapshot write does, without its metrics.
		if _, err := dst.Write(uint64(i+1), nil, func(emit func([]byte) error) error {
			_, err := r.Snapshot(0, emit)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	per1 := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(res)/per1.Seconds(), "residencies/s")
	b.ReportMetric(float64(per1)/1e6, "ms/snapshot")
}

// BenchmarkRestore is the restore alone, in process: verify, decompress, decode and import a
// snapshot of 10^7 residencies (-short: 10^6) into a new router with 2 shards.
func BenchmarkRestore(b *testing.B) {
	workers, per := benchSize()
	dir := b.TempDir()
	res := snapshotDir(b, dir, workers, per)
	st := openStore(b, dir)
	defer st.Close()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		sn, _, err := st.Latest()
		if err != nil {
			b.Fatal(err)
		}
		r := router.New(router.Config{Shards: 2, Logger: quiet()})
		if _, err := r.Restore(sn.Meta.Chunks, sn.Chunk); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		sn.Close()
		r.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(res)*float64(b.N)/time.Since(start).Seconds(), "residencies/s")
}

// benchSize is the snapshot the benchmarks use: 1,000 workers × 10^4 blocks (-short: 100 workers).
func benchSize() (workers, perWorker int) {
	if testing.Short() {
		return 100, 10000
	}
	return 1000, 10000
}

func openStore(tb testing.TB, dir string) *snapshot.Store {
	tb.Helper()
	st, err := snapshot.Open(filepath.Join(dir, "snapshots"), snapshot.Config{Logger: quiet()})
	if err != nil {
		tb.Fatal(err)
	}
	return st
}
