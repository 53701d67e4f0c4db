package main

import (
	"bytes"
	"errors"
	"flag"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSuiteSmoke runs the whole suite in-process for a moment and checks behaviour only: requests
// were made, none failed, every answer chose a registered worker, and the table has its rows.
// Timing is never asserted: this machine's speed is not the code's.
func TestSuiteSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("eleven short load runs take about 4 s")
	}
	c := defaults()
	c.Suite, c.SuiteWorkers = true, []int{8, 50}
	c.Duration, c.Warmup, c.Conns = 200*time.Millisecond, 50*time.Millisecond, 4
	var out, log bytes.Buffer
	rows, err := runSuite(t.Context(), c, &out, &log)
	if err != nil {
		t.Fatalf("suite: %v\n%s%s", err, log.String(), out.String())
	}
	// The cap of 8 candidates is skipped for 8 workers: it is all of them.
	if len(rows) != 3 || rows[0].Workers != 8 || rows[0].MaxCands != 0 || rows[1].Workers != 50 || rows[1].MaxCands != 0 ||
		rows[2].Workers != 50 || rows[2].MaxCands != 8 || rows[2].NoopSat != rows[1].NoopSat {
		t.Fatalf("rows %+v, want 8 workers with every candidate, 50 with every candidate and capped at 8", rows)
	}
	for _, r := range rows {
		for _, res := range []result{r.NoopSat, r.RouteSat, r.RouteHalf, r.NoopHalf} {
			if res.OK == 0 || res.Requests == 0 || res.Errors != 0 || res.BadAnswer != 0 || res.Unsent != 0 {
				t.Errorf("%s, %d workers, rate %.0f: %+v; want requests and no errors", res.Target, res.Workers, res.Rate, res)
			}
			if res.P50 <= 0 || res.P50 > res.P99 || res.P99 > res.Max {
				t.Errorf("%s, %d workers: percentiles out of order: %+v", res.Target, res.Workers, res)
			}
		}
		if r.RouteHalf.Rate != r.RouteSat.RPS/2 || r.NoopHalf.Rate != r.RouteHalf.Rate {
			t.Errorf("%d workers: half rates %v and %v, want %v", r.Workers, r.RouteHalf.Rate, r.NoopHalf.Rate, r.RouteSat.RPS/2)
		}
	}
	var table bytes.Buffer
	writeTable(&table, rows)
	lines := strings.Split(strings.TrimSpace(table.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[2], "| 8 | all |") || !strings.HasPrefix(lines[3], "| 50 | all |") ||
		!strings.HasPrefix(lines[4], "| 50 | 8 |") {
		t.Fatalf("table:\n%s", table.String())
	}
	if got := strings.Count(out.String(), "target="); got != 11 {
		t.Fatalf("%d result lines, want 11:\n%s", got, out.String())
	}
}

// TestWorkload checks the index content and the prompts against the brief: two whole holders per
// family, every worker holding data, chained events, and cached depths between 3/4 and all.
func TestWorkload(t *testing.T) {
	f := func(workers int) {
		t.Helper()
		c := defaults()
		c.Workers = workers
		w := newWorkload(&c)
		whole := make([]int, workers)
		for i := range workers {
			full, partial := w.holdings(i)
			if len(full) == 0 && partial < 0 {
				t.Fatalf("%d workers: worker %d holds nothing", workers, i)
			}
			for _, p := range full {
				whole[i]++
				if a, b := w.holders(p); a != i && b != i {
					t.Fatalf("%d workers: worker %d holds family %d, whose holders are %d and %d", workers, i, p, a, b)
				}
			}
			seen := map[uint64]bool{}
			for j, ev := range w.events(i) {
				if len(ev.Tokens) != len(ev.Hashes)*c.BlockSize || ev.HasParent != (j > 0) {
					t.Fatalf("%d workers: worker %d event %d: %d tokens for %d hashes, parent %v", workers, i, j, len(ev.Tokens), len(ev.Hashes), ev.HasParent)
				}
				if ev.HasParent && ev.Parent != w.engineHash(0, w.prefix-1) {
					t.Fatalf("%d workers: worker %d event %d chains onto %d, not the prefix", workers, i, j, ev.Parent)
				}
				for _, h := range ev.Hashes {
					if seen[h] {
						t.Fatalf("%d workers: worker %d stores engine hash %d twice", workers, i, h)
					}
					seen[h] = true
				}
			}
		}
		total := 0
		for _, n := range whole {
			total += n
		}
		if want := 2 * c.Prompts; workers > 1 && total != want {
			t.Fatalf("%d workers: %d whole families held, want %d", workers, total, want)
		}
	}
	f(1)
	f(8)
	f(1000)

	c := defaults()
	w := newWorkload(&c)
	rng := rand.New(rand.NewPCG(1, 2))
	var dst []uint32
	depths := map[int]bool{}
	for range 2000 {
		var depth int
		dst, depth = w.prompt(rng, dst)
		depths[depth] = true
		if depth < 96 || depth > 128 || len(dst) != 2048 {
			t.Fatalf("depth %d, %d tokens", depth, len(dst))
		}
		fam := slices.IndexFunc(w.families, func(f []uint32) bool { return slices.Equal(f[:depth*16], dst[:depth*16]) })
		if fam < 0 {
			t.Fatal("the prompt's first blocks are no family's")
		}
		if depth < 128 && dst[depth*16] == w.families[fam][depth*16] {
			t.Fatal("the tail was not changed")
		}
	}
	if len(depths) != 33 {
		t.Fatalf("%d distinct depths, want all 33 from 96 to 128", len(depths))
	}
}

func TestConfig(t *testing.T) {
	var help bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "--rate") {
		t.Fatalf("--help: %v\n%s", err, help.String())
	}
	c, err := parseConfig([]string{"--suite", "--suite-workers", "8,50"}, &help)
	if err != nil || c.Duration != suiteDuration || c.Warmup != suiteWarmup || !slices.Equal(c.SuiteWorkers, []int{8, 50}) {
		t.Fatalf("--suite: %+v %v", c, err)
	}
	if c, err = parseConfig([]string{"--suite", "--duration", "1s"}, &help); err != nil || c.Duration != time.Second || c.Warmup != suiteWarmup {
		t.Fatalf("--suite --duration 1s: %+v %v", c, err)
	}
	f := func(args []string, want string) {
		t.Helper()
		if _, err := parseConfig(args, &help); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v: error %v, want it to name %q", args, err, want)
		}
	}
	f([]string{"--target", "nginx"}, "--target")
	f([]string{"--rate", "-1"}, "--rate")
	f([]string{"--suite-workers", "8,x"}, "suite-workers")
	f([]string{"--target", "noop", "--addr", "h:1"}, "--addr")
}
