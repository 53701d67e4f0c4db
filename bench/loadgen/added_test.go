package loadgen

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestFiller fills a Router's index to a residency count, then streams churn into it: the index
// holds what newFiller says, every event applies cleanly, the stream keeps the index's size,
// and requests still find their families whole on their holders and nothing of the filler.
func TestFiller(t *testing.T) {
	f := func(workers, residencies int) {
		t.Helper()
		c := Defaults()
		c.Workers, c.Residencies, c.EventRate = workers, residencies, 1e6
		w := newWorkload(&c)
		tg, err := start(&c, w)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.stop()
		fl, r := tg.filler, tg.router
		if fl.residencies() < residencies || fl.chains > 1 && fl.residencies()-residencies >= fl.holders*fl.length {
			t.Fatalf("%d workers: %d residencies planned (%d chains), want the fewest chains reaching %d", workers, fl.residencies(), fl.chains, residencies)
		}
		before := r.Stats().Events
		if before.Residencies != int64(fl.residencies()) {
			t.Fatalf("%d workers: the index holds %d residencies, want %d", workers, before.Residencies, fl.residencies())
		}
		// Stream until a full turn over the (chain, holder) pairs and a bit has been sent.
		stop := make(chan struct{})
		done := make(chan error, 1)
		var st streamStats
		go func() { done <- fl.stream(r, 1e6, stop, &st) }()
		for st.batches.Load() < int64(fl.chains*fl.holders+3) {
			time.Sleep(time.Millisecond)
		}
		close(stop)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := r.Flush(); err != nil {
			t.Fatal(err)
		}
		after := r.Stats().Events
		churned := st.batches.Load() * int64(fl.tail)
		if after.Residencies != before.Residencies || after.StoredBlocks-before.StoredBlocks != churned || after.RemovedBlocks-before.RemovedBlocks != churned {
			t.Fatalf("%d workers: residencies %d → %d, stored +%d, removed +%d; want the size kept and %d of each",
				workers, before.Residencies, after.Residencies, after.StoredBlocks-before.StoredBlocks, after.RemovedBlocks-before.RemovedBlocks, churned)
		}
		if n := after.Events - after.ByStatus[shard.OK]; n != 0 || after.SkippedBlocks != 0 {
			t.Fatalf("%d workers: %d events not applied in full, %d blocks skipped", workers, n, after.SkippedBlocks)
		}
		var resp wire.RouteResponse
		if err := r.Match(&wire.RouteRequest{Model: model, Tokens: w.families[0]}, &resp); err != nil {
			t.Fatal(err)
		}
		a, b := w.holders(0)
		for _, cd := range resp.Candidates {
			want := w.prefix
			if cd.Worker == workerID(a) || cd.Worker == workerID(b) {
				want = w.blocks
			}
			if int(cd.CachedBlocks) != want && !(want == w.prefix && int(cd.CachedBlocks) == w.partial) {
				t.Fatalf("%d workers: worker %d has %d blocks of family 0 cached, want %d", workers, cd.Worker, cd.CachedBlocks, want)
			}
		}
	}
	f(1, 5000)
	f(8, 40000)
	f(50, 40000)
}

// TestFillerTokens: a filler block's tokens are a vocabulary's, the same each time, and differ
// between blocks.
func TestFillerTokens(t *testing.T) {
	c := Defaults()
	fl := newFiller(newWorkload(&c), 0, true)
	var a, b, d kvevent.Event
	fl.stored(&a, 0, 0, 4)
	fl.stored(&b, 0, 0, 4)
	fl.stored(&d, 1, 0, 4)
	if !slices.Equal(a.Tokens, b.Tokens) || len(a.Tokens) != 4*c.BlockSize || slices.Equal(a.Tokens, d.Tokens) ||
		slices.Equal(a.Tokens[:c.BlockSize], a.Tokens[c.BlockSize:2*c.BlockSize]) {
		t.Fatalf("tokens %v / %v / %v", a.Tokens, b.Tokens, d.Tokens)
	}
	for _, tok := range a.Tokens {
		if tok >= 1<<17 {
			t.Fatalf("token %d outside the vocabulary", tok)
		}
	}
	if !a.HasParent || a.Parent != fl.w.engineHash(0, fl.w.prefix-1) {
		t.Fatalf("the chain's first block hangs off %d, not the system prefix", a.Parent)
	}
}

// TestRunAdded runs the added-latency matrix in-process for a moment and checks behaviour only:
// the rows are the matrix's, the runs paired and in the announced order, the rates the
// percentages of the no-op's saturation, the stream applied during kvrouterd's runs and only
// there, and nothing failed. Timing is never asserted.
func TestRunAdded(t *testing.T) {
	if testing.Short() {
		t.Skip("twenty-seven short load runs take about 7 s")
	}
	c := Defaults()
	c.AddedWorkers, c.AddedRuns = []int{8, 50}, 2
	c.Duration, c.Warmup, c.Conns = 200*time.Millisecond, 50*time.Millisecond, 4
	c.Residencies, c.EventRate = 30000, 2e5
	var runs []Result
	var log bytes.Buffer
	rows, err := RunAdded(t.Context(), c, func(r Result) { runs = append(runs, r) }, &log)
	if err != nil {
		t.Fatalf("RunAdded: %v\n%s", err, log.String())
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 2 worker counts × 2 rates", len(rows))
	}
	for i, r := range rows {
		if r.Workers != c.AddedWorkers[i/2] || r.Percent != c.AddedPercents[i%2] || r.Candidates != 8 ||
			r.Rate != r.NoopSat*float64(r.Percent)/100 || len(r.Route) != 2 || len(r.Noop) != 2 {
			t.Fatalf("row %d: %+v", i, r)
		}
		for k := range 2 {
			rt, np := r.Route[k], r.Noop[k]
			if rt.Target != "kvrouterd" || np.Target != "noop" || rt.Rate != r.Rate || np.Rate != r.Rate ||
				rt.MaxCandidates != 8 || np.NoopCandidates != 8 {
				t.Fatalf("row %d run %d: %+v / %+v", i, k, rt, np)
			}
			if rt.EventRate != c.EventRate || rt.EventsApplied <= 0 || rt.Residencies < int64(c.Residencies) ||
				np.EventRate != 0 || np.EventsApplied != 0 || np.Residencies != 0 {
				t.Fatalf("row %d run %d: stream %v/%v at %d residencies; no-op %v/%v at %d", i, k,
					rt.EventsApplied, rt.EventRate, rt.Residencies, np.EventsApplied, np.EventRate, np.Residencies)
			}
		}
		if r.Errors() != 0 {
			t.Fatalf("row %d: %d errors", i, r.Errors())
		}
		r50, n50, a50 := r.P50()
		if a50.N != 2 || r50.N != 2 || n50.N != 2 || a50.Min > a50.Max {
			t.Fatalf("row %d: p50 spreads %+v %+v %+v", i, r50, n50, a50)
		}
	}
	// Per worker count: three saturated no-op runs, then the pairs, no-op first in the first
	// round and kvrouterd first in the second.
	per := []string{"noop", "noop", "noop", "noop", "kvrouterd", "noop", "kvrouterd", "kvrouterd", "noop", "kvrouterd", "noop"}
	var got []string
	for _, r := range runs {
		got = append(got, r.Target)
	}
	if want := slices.Concat(per, per); !slices.Equal(got, want) || runs[0].Rate != 0 || runs[3].Rate == 0 {
		t.Fatalf("progress saw %v, want %v", got, want)
	}
	// Without a stream the runs still report the index's size, and apply nothing.
	c.AddedWorkers, c.AddedPercents, c.AddedRuns, c.EventRate = []int{8}, []int{10}, 1, 0
	rows, err = RunAdded(t.Context(), c, nil, nil)
	if err != nil || len(rows) != 1 || rows[0].Route[0].Residencies < int64(c.Residencies) || rows[0].Route[0].EventsApplied != 0 || rows[0].Route[0].EventRate != 0 {
		t.Fatalf("without a stream: %+v, %v", rows, err)
	}
	if !strings.Contains(log.String(), "residencies") {
		t.Fatalf("log: %s", log.String())
	}
}

// TestSpread: median and range, odd and even counts.
func TestSpread(t *testing.T) {
	f := func(xs []float64, want Spread) {
		t.Helper()
		if got := spreadOf(xs); got != want {
			t.Fatalf("%v: %+v, want %+v", xs, got, want)
		}
	}
	f(nil, Spread{})
	f([]float64{3}, Spread{3, 3, 3, 1})
	f([]float64{5, 1, 3}, Spread{3, 1, 5, 3})
	f([]float64{4, 1, 3, 10}, Spread{3.5, 1, 10, 4})
	r := AddedRow{Route: []Result{{P50: 10}, {P50: 30}, {P50: 20}}, Noop: []Result{{P50: 8}, {P50: 5}, {P50: 19}}}
	if _, _, a := r.P50(); a != (Spread{2, 1, 25, 3}) {
		t.Fatalf("added p50 %+v: want the paired differences' median 2, range 1–25", a)
	}
}

// TestCheckAdded: RunAdded refuses a bad matrix up front, naming the field, and Run refuses an
// index or a stream it could not reach.
func TestCheckAdded(t *testing.T) {
	f := func(edit func(*Config), want string) {
		t.Helper()
		c := Defaults()
		edit(&c)
		_, err := RunAdded(t.Context(), c, nil, nil)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want ErrConfig naming %q", err, want)
		}
	}
	f(func(c *Config) { c.AddedRuns = 0 }, "AddedRuns 0")
	f(func(c *Config) { c.AddedPercents = []int{10, 150} }, "AddedPercents 150")
	f(func(c *Config) { c.AddedWorkers = nil }, "AddedWorkers")
	f(func(c *Config) { c.AddedCandidates = -1 }, "AddedCandidates -1")
	f(func(c *Config) { c.EventRate, c.Addr = 1e6, "h:1" }, "Addr")
	f(func(c *Config) { c.Residencies = -1 }, "Residencies -1")
	for _, edit := range []func(*Config){
		func(c *Config) { c.Residencies, c.Addr = 10, "h:1" },
		func(c *Config) { c.EventRate = -1 },
	} {
		c := Defaults()
		edit(&c)
		if _, err := Run(t.Context(), c, nil); !errors.Is(err, ErrConfig) {
			t.Fatalf("%+v: error %v, want ErrConfig", c, err)
		}
	}
	// The no-op runs need neither: a noop target with them set is accepted, as the suite
	// passes them on.
	c := Defaults()
	c.Target, c.Residencies, c.EventRate = "noop", 10, 1
	if err := c.Check(nil); err != nil {
		t.Fatal(err)
	}
}
