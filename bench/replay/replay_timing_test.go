package replay

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// BenchmarkRunConversation replays the Mooncake conversation trace's events (recorded once on 8
// simulated workers with Dynamo's mocker defaults) at 8, 1,000 and 10,000 workers, with the
// defaults, or the quick settings under -short; writer=fleet churns at the fleet's own event
// rate (the default), writer=max as fast as it can. One Run per op: use -benchtime=1x. -v
// prints the progress.
//
//	go test -run='^$' -bench=RunConversation -benchtime=1x -v ./bench/replay/
func BenchmarkRunConversation(b *testing.B) {
	reqs := loadConversation(b, 0)
	t0 := time.Now()
	s, err := Record(reqs, fleet.Config{Workers: 8, Mode: scoring.KV, Worker: sim.DefaultWorkerConfig(), Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	reqs = nil
	b.Logf("recorded in %v: %+v", time.Since(t0).Round(time.Millisecond), s.Stats())
	var progress io.Writer
	if testing.Verbose() {
		progress = os.Stderr
	}
	cfg := Config{Progress: progress, Seed: 1}
	if testing.Short() {
		cfg = Quick(cfg)
	}
	for _, w := range []int{8, 1000, 10000} {
		for _, writer := range []string{"fleet", "max"} {
			b.Run(fmt.Sprintf("workers=%d/writer=%s", w, writer), func(b *testing.B) {
				c := cfg
				c.Workers = w
				if writer == "max" {
					c.WriteRate = -1
				}
				var res *Result
				for range b.N {
					if res, err = Run(s, c); err != nil {
						b.Fatal(err)
					}
				}
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				b.ReportMetric(res.ApplyRate, "blocks/s")
				b.ReportMetric(float64(res.P50.Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(res.P99.Nanoseconds())/1e3, "p99-µs")
				b.ReportMetric(float64(res.P999.Nanoseconds())/1e3, "p99.9-µs")
				b.ReportMetric(res.WriteRate, "writer-blocks/s")
				b.ReportMetric(res.BytesPerResidency, "B/residency")
				b.ReportMetric(float64(res.Residencies), "residencies")
				b.ReportMetric(float64(ms.HeapSys)/(1<<20), "heap-sys-MiB")
			})
		}
	}
}
