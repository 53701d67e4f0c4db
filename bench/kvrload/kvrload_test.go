package main

import (
	"bytes"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/loadgen"
)

func TestConfig(t *testing.T) {
	var help bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "--rate") {
		t.Fatalf("--help: %v\n%s", err, help.String())
	}
	c, err := parseConfig([]string{"--suite", "--suite-workers", "8,50"}, &help)
	if err != nil || c.Duration != loadgen.SuiteDuration || c.Warmup != loadgen.SuiteWarmup || !slices.Equal(c.SuiteWorkers, []int{8, 50}) {
		t.Fatalf("--suite: %+v %v", c, err)
	}
	if c, err = parseConfig([]string{"--suite", "--duration", "1s"}, &help); err != nil || c.Duration != time.Second || c.Warmup != loadgen.SuiteWarmup {
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
	f([]string{"--suite", "--target", "nginx"}, "--target")
	f([]string{"--block-size", "0"}, "--block-size 0")
	f([]string{"--max-candidates", "70000"}, "--max-candidates 70000")
	f([]string{"--suite", "--latency-log", "x"}, "--latency-log")
	f([]string{"--added", "--suite"}, "--suite and --added")
	f([]string{"--added", "--addr", "h:1"}, "--addr")
	f([]string{"--residencies", "5", "--addr", "h:1"}, "--addr")
	f([]string{"--added", "--added-percents", "10,200"}, "--added-percents 200")
	f([]string{"--added", "--added-runs", "0"}, "--added-runs 0")
	f([]string{"--event-rate", "-1"}, "--event-rate -1")
	// --added fills the index and streams events unless told otherwise; a single run does neither.
	if c, err = parseConfig([]string{"--added", "--event-rate", "5000"}, &help); err != nil || c.Residencies != loadgen.AddedResidencies ||
		c.EventRate != 5000 || c.Duration != loadgen.SuiteDuration || !slices.Equal(c.AddedPercents, []int{10, 50}) {
		t.Fatalf("--added: %+v %v", c, err)
	}
	if c, err = parseConfig(nil, &help); err != nil || c.Residencies != 0 || c.EventRate != 0 {
		t.Fatalf("no flags: %+v %v", c, err)
	}
	if _, err := parseConfig([]string{"--suite", "--target", "noop", "--addr", "h:1"}, &help); err != nil {
		t.Fatalf("--suite uses --addr for kvrouterd only: %v", err)
	}
	// Every field Check can name has a flag.
	for field, name := range flagOf {
		if !strings.Contains(help.String(), "--"+name+" ") {
			t.Errorf("%s: no flag --%s", field, name)
		}
	}
}

// TestOutput checks the run line, the JSON line and the table on made-up results.
func TestOutput(t *testing.T) {
	r := loadgen.Result{Target: "kvrouterd", Workers: 1000, MaxCandidates: 8, Blocks: 128, BlockSize: 16, Conns: 32,
		Rate: 12000.4, Requests: 1000, OK: 999, Errors: 1, RPS: 11990, P50: 101.25, P90: 150, P99: 300, P999: 900, Max: 1200,
		CPUPerReq: 40.5, Others: 3, FirstErr: "boom"}
	var out bytes.Buffer
	printResult(&out, &r, true)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := "target=kvrouterd workers=1000 candidates=8    blocks=128 conns=32 rate=12000  req/s=11990    p50=101.2µs p90=150.0µs p99=300.0µs p99.9=900.0µs max=1200.0µs errors=1 cpu/req=40.5µs others=3%"
	if len(lines) != 3 || lines[0] != want || lines[1] != "  first error: boom" ||
		!strings.HasPrefix(lines[2], `{"target":"kvrouterd","workers":1000,"max_candidates":8,"blocks":128,`) {
		t.Fatalf("got\n%s\nwant first\n%s", out.String(), want)
	}

	out.Reset()
	printResult(&out, &loadgen.Result{Target: "noop", Workers: 1000, NoopCandidates: 1000, Rate: 0}, false)
	if !strings.HasPrefix(out.String(), "target=noop      workers=1000 candidates=1000 ") {
		t.Fatalf("no-op line names its answer's size: %s", out.String())
	}

	noop := loadgen.Result{Target: "noop", RPS: 40000, Others: -1}
	row := func(workers, cands int) loadgen.SuiteRow {
		route := loadgen.Result{Target: "kvrouterd", RPS: 30000, P50: 400, P99: 1600, Errors: 2, Others: 5}
		same := loadgen.Result{Target: "noop", RPS: 37500, Others: -1}
		return loadgen.SuiteRow{Workers: workers, MaxCandidates: cands, NoopSat: noop, RouteSat: route, NoopSame: same, RouteHalf: route, NoopHalf: noop, HalfRate: 15000}
	}
	out.Reset()
	printResult(&out, &loadgen.Result{Target: "kvrouterd", Workers: 8, EventRate: 1e6, EventsApplied: 987654.3, Residencies: 1000064, EventsSkipped: 2}, false)
	if lines := strings.Split(out.String(), "\n"); len(lines) != 3 || lines[1] != "  events=987654 blocks/s (asked 1000000) residencies=1000064 skipped batches=2" {
		t.Fatalf("a run with events names them: %q", out.String())
	}

	out.Reset()
	writeTable(&out, []loadgen.SuiteRow{row(8, 0), row(1000, 8)})
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || lines[2] != "| 8 | all | 40000 | 30000 | 0.75 | 37500 | 0.80 | 400 / 1600 | 15000 | 400 / 1600 | 0 / 0 | 0 / 0 | 0 / 0 | 4 | 5 |" ||
		!strings.HasPrefix(lines[3], "| 1000 | 8 |") {
		t.Fatalf("table:\n%s", out.String())
	}
}

// TestAddedOutput checks the added-latency table on made-up runs: medians with ranges, the
// paired differences, the conditions of the row.
func TestAddedOutput(t *testing.T) {
	run := func(target string, p50, p99, applied float64) loadgen.Result {
		r := loadgen.Result{Target: target, P50: p50, P99: p99, Others: 4}
		if target == "kvrouterd" {
			r.EventsApplied, r.Residencies = applied, 1000064
		}
		return r
	}
	row := loadgen.AddedRow{Workers: 1000, Candidates: 8, Percent: 10, NoopSat: 31655.2, Rate: 3165.52,
		Route: []loadgen.Result{run("kvrouterd", 25, 60, 0.99e6), run("kvrouterd", 27, 90, 1e6), run("kvrouterd", 24, 50, 0.98e6)},
		Noop:  []loadgen.Result{run("noop", 20, 40, 0), run("noop", 21, 45, 0), run("noop", 22, 44, 0)}}
	c := loadgen.Defaults()
	c.EventRate = 1e6
	var out bytes.Buffer
	writeAdded(&out, []loadgen.AddedRow{row}, &c)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := "| 1000 | 8 | 10 % of 31655 | 3166 | 1000064 | 0.99 (0.98–1.00) (1.00) | 25.0 (24.0–27.0) | 21.0 (20.0–22.0) | 5.0 (2.0–6.0) | 60 (50–90) | 44 (40–45) | 20 (6–45) | 3 | 0 | 4 |"
	if len(lines) != 5 || lines[4] != want || !strings.Contains(lines[0], "32 connections") {
		t.Fatalf("got\n%s\nwant last\n%s", out.String(), want)
	}
}
