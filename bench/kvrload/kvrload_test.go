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
	writeTable(&out, []loadgen.SuiteRow{row(8, 0), row(1000, 8)})
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || lines[2] != "| 8 | all | 40000 | 30000 | 0.75 | 37500 | 0.80 | 400 / 1600 | 15000 | 400 / 1600 | 0 / 0 | 0 / 0 | 0 / 0 | 4 | 5 |" ||
		!strings.HasPrefix(lines[3], "| 1000 | 8 |") {
		t.Fatalf("table:\n%s", out.String())
	}
}
