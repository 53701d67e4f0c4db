package snapshot

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// fleetChunks stands in for an index snapshot: residencies records of 16 bytes (a worker's
// engine block hash and the router's sequence hash), worker after worker, 10,000 residencies a
// worker, cut into chunks of about 4 MiB at record boundaries. 60% of each worker's blocks are
// whole 64-block prefixes drawn from a pool of 2,000 popular ones, as workers serving the same
// system prompts and documents hold the same blocks; the rest are the worker's own. Hashes are
// random, so all that compresses is the repetition.
func fleetChunks(residencies int) [][]byte {
	const (
		perWorker = 10000
		prefixLen = 64
		pool      = 2000
		chunkSize = 4 << 20
	)
	r := rand.New(rand.NewPCG(2026, 1))
	hot := make([][2]uint64, pool*prefixLen)
	for i := range hot {
		hot[i] = [2]uint64{r.Uint64(), r.Uint64()}
	}
	var chunks [][]byte
	cur := make([]byte, 0, chunkSize+perWorker*16)
	for done := 0; done < residencies; done += perWorker {
		n := min(perWorker, residencies-done)
		for held := 0; held < n; {
			if r.IntN(10) < 6 && n-held >= prefixLen {
				p := r.IntN(pool) * prefixLen
				for _, rec := range hot[p : p+prefixLen] {
					cur = binary.LittleEndian.AppendUint64(cur, rec[0])
					cur = binary.LittleEndian.AppendUint64(cur, rec[1])
				}
				held += prefixLen
				continue
			}
			cur = binary.LittleEndian.AppendUint64(cur, r.Uint64())
			cur = binary.LittleEndian.AppendUint64(cur, r.Uint64())
			held++
		}
		if len(cur) >= chunkSize {
			chunks = append(chunks, cur)
			cur = make([]byte, 0, chunkSize+perWorker*16)
		}
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks
}

var fleetCache sync.Map // residencies → [][]byte

func fleet(residencies int) [][]byte {
	if c, ok := fleetCache.Load(residencies); ok {
		return c.([][]byte)
	}
	c := fleetChunks(residencies)
	fleetCache.Store(residencies, c)
	return c
}

// benchSizes: 10^7 residencies is ≈ 160 MB of records; -short (the suite's smoke run) uses 10^6.
func benchSizes() []int {
	if testing.Short() {
		return []int{1_000_000}
	}
	return []int{1_000_000, 10_000_000}
}

func sizeName(residencies int) string {
	return fmt.Sprintf("%dMB", residencies*16/1_000_000)
}

func emitAll(chunks [][]byte) func(func([]byte) error) error {
	return func(emit func([]byte) error) error {
		for _, c := range chunks {
			if err := emit(c); err != nil {
				return err
			}
		}
		return nil
	}
}

// BenchmarkStoreWrite writes whole snapshots (compress, build the table, ingest, synced commit,
// prune beyond Keep 2), reporting raw MB/s and raw/stored.
func BenchmarkStoreWrite(b *testing.B) {
	levels := []struct {
		name  string
		level zstd.EncoderLevel
	}{{"fastest", zstd.SpeedFastest}, {"default", zstd.SpeedDefault}}
	for _, lv := range levels {
		for _, n := range benchSizes() {
			b.Run(lv.name+"/"+sizeName(n), func(b *testing.B) {
				chunks := fleet(n)
				s, err := Open(filepath.Join(b.TempDir(), "snap"), Config{Keep: 2, Level: lv.level, Logger: discardLogger()})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				var m Meta
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if m, err = s.Write(uint64(i), nil, emitAll(chunks)); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(m.RawBytes)
				b.ReportMetric(float64(m.RawBytes)/float64(m.StoredBytes), "ratio")
			})
		}
	}
}

// BenchmarkStoreRestore is a restore's read side: Latest (manifest and every chunk's checksum),
// then every chunk decompressed on GOMAXPROCS goroutines into per-goroutine buffers, as the
// owner's restore would decode records from them. The data is in the page cache (warm restart).
func BenchmarkStoreRestore(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(sizeName(n), func(b *testing.B) {
			chunks := fleet(n)
			s, err := Open(filepath.Join(b.TempDir(), "snap"), Config{Logger: discardLogger()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			m, err := s.Write(1, nil, emitAll(chunks))
			if err != nil {
				b.Fatal(err)
			}
			workers := runtime.GOMAXPROCS(0)
			bufs := make([][]byte, workers)
			var latest time.Duration
			b.ReportAllocs()
			b.SetBytes(m.RawBytes)
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				sn, _, err := s.Latest()
				if err != nil {
					b.Fatal(err)
				}
				latest += time.Since(start)
				var next atomic.Int64
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						for i := int(next.Add(1) - 1); i < m.Chunks; i = int(next.Add(1) - 1) {
							var cerr error
							if bufs[w], cerr = sn.Chunk(i, bufs[w]); cerr != nil {
								b.Error(cerr)
								return
							}
						}
					})
				}
				wg.Wait()
				sn.Close()
			}
			b.ReportMetric(latest.Seconds()*1000/float64(b.N), "latest-ms/op")
		})
	}
}
