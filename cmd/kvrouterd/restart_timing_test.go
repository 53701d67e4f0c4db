package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/snapshot"
	"github.com/kvrouterd/kvrouterd/wire"
)

// snapshotDir writes into dir/snapshots one snapshot of workers workers holding perWorker blocks
// each (a residency per block), in the current format, by Router.Snapshot: the state of
// snapshotDirV1's, restored into a router. It returns the residencies.
func snapshotDir(tb testing.TB, dir string, workers, perWorker int) int64 {
	tb.Helper()
	src := tb.TempDir()
	n := snapshotDirV1(tb, src, workers, perWorker)
	from := openStore(tb, src)
	sn, _, err := from.Latest()
	if err != nil {
		tb.Fatal(err)
	}
	r := router.New(router.Config{Shards: 2, Logger: quiet()})
	defer r.Close()
	if _, err := r.Restore(sn.Meta.Chunks, sn.Chunk); err != nil {
		tb.Fatal(err)
	}
	sn.Close()
	from.Close()
	st := openStore(tb, dir)
	defer st.Close()
	// Stream sequence 0: the daemon then reads its (empty) stream from the start.
	if _, err := st.Write(0, nil, func(emit func([]byte) error) error {
		_, err := r.Snapshot(0, emit)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return n
}

// snapshotDirV1 writes into dir/snapshots one snapshot in the first format (worker messages
// only, no index section): workers workers holding perWorker blocks each (a residency per
// block), 60 % of a worker's blocks from a pool of prefixes that many workers share, the rest
// its own, as after a day of serving prompts with common system prompts. It returns the
// residencies.
func snapshotDirV1(tb testing.TB, dir string, workers, perWorker int) int64 {
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
	readyAt     = regexp.MustCompile(`msg="kvrouterd ready".* since_start=([0-9.]+[µm]?s)`)
	caughtUp    = regexp.MustCompile(`msg="caught up with the event stream".* since_start=([0-9.]+[µm]?s)`)
	restoreTook = regexp.MustCompile(`msg="restored snapshot".* read=([0-9.]+[µm]?s) decode=([0-9.]+[µm]?s) build=([0-9.]+[µm]?s) took=([0-9.]+[µm]?s)`)
)

// BenchmarkRestart measures the built binary from process start to ready (/readyz 200) on a data
// directory holding a snapshot of 10^7 residencies (1,000 workers × 10^4 blocks; -short: 10^6),
// with its embedded NATS server; it reports from the daemon's log its time to ready, its restore
// (and the restore's read, decode and build times, each summed over the goroutines that restore
// in parallel), the catch-up with the event stream after it, and the restore rate; from /proc,
// the daemon's minor page faults and peak RSS once ready.
func BenchmarkRestart(b *testing.B) {
	workers, per := benchSize()
	bin := buildDaemon(b)
	dir := b.TempDir()
	res := snapshotDir(b, dir, workers, per)
	var ready, restore, catchup []time.Duration
	var faults, peak []float64 // the daemon's minor page faults and peak RSS (MiB) when ready
	var parts [3][]time.Duration
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
		faults = append(faults, minorFaults(b, cmd.Process.Pid))
		peak = append(peak, float64(peakRSS(b, cmd.Process.Pid))/(1<<20))
		cmd.Process.Kill() // no shutdown snapshot: every run restores the same one
		cmd.Wait()
		mu.Lock()
		log := logs.String()
		mu.Unlock()
		m, m2, m3 := readyAt.FindStringSubmatch(log), restoreTook.FindStringSubmatch(log), caughtUp.FindStringSubmatch(log)
		if m == nil || m2 == nil || m3 == nil {
			b.Fatalf("no timings in the log:\n%s", log)
		}
		d, _ := time.ParseDuration(m[1])
		rd, _ := time.ParseDuration(m2[4])
		cu, _ := time.ParseDuration(m3[1])
		ready, restore, catchup = append(ready, d), append(restore, rd), append(catchup, cu)
		for k := range parts {
			p, _ := time.ParseDuration(m2[1+k])
			parts[k] = append(parts[k], p)
		}
		b.ReportMetric(float64(wall)/1e6, "wall-ms")
	}
	med := func(d []time.Duration) float64 { slices.Sort(d); return float64(d[len(d)/2]) / 1e6 }
	b.ReportMetric(med(ready), "ready-ms")
	b.ReportMetric(med(restore), "restore-ms")
	b.ReportMetric(med(parts[0]), "read-ms")
	b.ReportMetric(med(parts[1]), "decode-ms")
	b.ReportMetric(med(parts[2]), "build-ms")
	b.ReportMetric(med(catchup), "catchup-ms")
	medf := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(medf(faults), "minor-faults")
	b.ReportMetric(medf(peak), "peak-rss-MiB")
	b.ReportMetric(float64(res)/restore[len(restore)/2].Seconds(), "residencies/s")
	b.ReportMetric(float64(res), "residencies")
}

// minorFaults returns process pid's minor page faults so far, from /proc: what a fresh process
// pays to restore (its first touch of each page) shows there.
func minorFaults(b *testing.B, pid int) float64 {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command's closing parenthesis: state is the 3rd field, minflt the 10th.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	n, err := strconv.ParseFloat(f[7], 64)
	if err != nil {
		b.Fatal(err)
	}
	return n
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
// snapshot of 10^7 residencies (-short: 10^6) into a new router with 2 shards, in the current
// format (the index loaded by block) and in the first (every residency added on its own).
func BenchmarkRestore(b *testing.B) {
	for _, c := range []struct {
		name  string
		write func(testing.TB, string, int, int) int64
	}{{"format=2", snapshotDir}, {"format=1", snapshotDirV1}} {
		b.Run(c.name, func(b *testing.B) {
			workers, per := benchSize()
			dir := b.TempDir()
			res := c.write(b, dir, workers, per)
			st := openStore(b, dir)
			defer st.Close()
			var total router.RestoreTiming
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				sn, _, err := st.Latest()
				if err != nil {
					b.Fatal(err)
				}
				r := router.New(router.Config{Shards: 2, Logger: quiet()})
				_, s, err := r.RestoreTimed(sn.Meta.Chunks, sn.Chunk)
				if err != nil {
					b.Fatal(err)
				}
				total.Read, total.Decode, total.Build = total.Read+s.Read, total.Decode+s.Decode, total.Build+s.Build
				b.StopTimer()
				sn.Close()
				r.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(res)*float64(b.N)/time.Since(start).Seconds(), "residencies/s")
			n := float64(b.N) * 1e6
			b.ReportMetric(float64(total.Read)/n, "read-ms")
			b.ReportMetric(float64(total.Decode)/n, "decode-ms")
			b.ReportMetric(float64(total.Build)/n, "build-ms")
		})
	}
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
