// Command report measures kvrouterd and writes the performance and routing-quality report:
// bench/out/report.md (tables and what each number means), report.json (one flat object per
// measurement: name, value, unit, conditions) and PNG plots beside them. It prints its progress
// on stderr as it goes.
//
// Sections, each skippable with --skip:
//
//	quality  routing quality: the Mooncake conversation and synthetic traces and the built-in
//	         generator on 8 simulated workers (package bench/fleet), per routing mode and per
//	         simulated peer policy (llmd, sglang, gie: docs/peers.md); then the
//	         router queue on the conversation trace where kv saturates the workers: off and each
//	         policy, priority classes, and a sweep of the threshold; then disaggregated prefill
//	         and decode pools and a host-memory tier on the conversation trace, and
//	         predict-on-route on a generated burst workload with delayed KV events
//	e2e      the same simulation against a whole daemon over HTTP and NATS (package bench/e2e)
//	index    the index replaying the conversation trace's own KV events at 8, 1,000 and 10,000
//	         workers (package bench/replay)
//	http     HTTP route throughput and latency against a no-op fasthttp handler (bench/loadgen)
//	restart  the daemon from process start to ready on a snapshot of 10^7 residencies (--quick:
//	         10^6), by running cmd/kvrouterd's BenchmarkRestart (run from the repository root)
//
// `make bench` runs it in full (under 10 minutes on 2 cores), `make bench-quick` with --quick
// (under 2 minutes: shorter trace windows and runs).
//
//	go run ./bench/report [--quick] [--out bench/out] [--traces ../shared/traces] [--skip http]
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/trace"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// config is the whole configuration of one run.
type config struct {
	Quick  bool
	Out    string
	Traces string // directory holding mooncake/*.jsonl; sections that need a missing file say so
	Skip   []string
	Seed   uint64
	// Extra are the traces of --trace NAME=PATH, replayed in every section that replays a trace
	// beside the Mooncake ones (rows quality.NAME.…, e2e.NAME.… and index.NAME.wN.…), read with
	// TraceOptions (--block-size, --time-unit).
	Extra        []namedTrace
	TraceOptions trace.MooncakeOptions
	// Generated, if > 0, is the built-in workload's length (the quick report's 4 minutes, the
	// full one's default otherwise); the tests shorten it under the race detector.
	Generated time.Duration
}

// namedTrace is one --trace NAME=PATH.
type namedTrace struct{ Name, Path string }

// traceList is the repeatable --trace flag.
type traceList struct{ list *[]namedTrace }

func (l traceList) String() string {
	if l.list == nil {
		return ""
	}
	var s []string
	for _, t := range *l.list {
		s = append(s, t.Name+"="+t.Path)
	}
	return strings.Join(s, ",")
}

// Set takes NAME=PATH; NAME becomes a segment of the rows' names, so it is lower-case letters,
// digits, '-' and '_', and not a name the report gives a workload of its own.
func (l traceList) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("%q: want NAME=PATH", v)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%q: a name of lower-case letters, digits, '-' and '_' (it names the rows quality.NAME.…)", name)
		}
	}
	for _, t := range append(slices.Clone(*l.list), namedTrace{"conversation", ""}, namedTrace{"mooncake-synthetic", ""}, namedTrace{"generated", ""}) {
		if t.Name == name {
			return fmt.Errorf("%q: the name of another workload of the report", name)
		}
	}
	*l.list = append(*l.list, namedTrace{name, path})
	return nil
}

// sections lists every section in the order they run.
var sections = []string{"quality", "e2e", "index", "http", "restart"}

func main() {
	c := config{Out: "bench/out", Traces: defaultTraces(), Seed: 1}
	var skip string
	flag.BoolVar(&c.Quick, "quick", false, "the quick report: shorter trace windows and runs (under 2 minutes)")
	flag.StringVar(&c.Out, "out", c.Out, "directory for report.md, report.json and the plots")
	flag.StringVar(&c.Traces, "traces", c.Traces, "directory with mooncake/conversation_trace.jsonl and mooncake/synthetic_trace.jsonl (env KVROUTERD_TRACES)")
	flag.StringVar(&skip, "skip", "", "sections to leave out, comma-separated: "+strings.Join(sections, ","))
	flag.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the routers' tie-breaks and the load generators")
	flag.Var(traceList{&c.Extra}, "trace", "NAME=PATH: replay this JSON-lines trace too (Mooncake's form or a relative; see bench/trace), its rows named quality.NAME.…, e2e.NAME.… and index.NAME.…; repeatable")
	flag.IntVar(&c.TraceOptions.BlockSize, "block-size", 0, "tokens per hash id of the --trace files (0: each trace's block_size, else Mooncake's 512)")
	timeUnit := flag.String("time-unit", "", "unit of the --trace files' numeric timestamps: ms or s (empty: each trace's time_unit, else ms)")
	flag.Parse()
	var err error
	if c.TraceOptions.TimeUnit, err = trace.ParseTimeUnit(*timeUnit); err != nil {
		fmt.Fprintln(os.Stderr, "report: --time-unit:", err)
		os.Exit(2)
	}
	for s := range strings.SplitSeq(skip, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(sections, s) {
			fmt.Fprintf(os.Stderr, "report: --skip %q: not one of %s\n", s, strings.Join(sections, ","))
			os.Exit(2)
		}
		c.Skip = append(c.Skip, s)
	}
	if err := run(c, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		if errors.Is(err, errMissing) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

// errMissing is wrapped by run's error when a section, or part of one, was not measured for
// want of a trace: the report is written, but it is not the whole report.
var errMissing = errors.New("parts of the report were not measured for want of traces: get them with `make traces` (into ./traces, where the report looks), or point --traces (KVROUTERD_TRACES) at a copy; --skip SECTION leaves a section out on purpose")

// missing records that what (part of section) was not measured, and why.
func (r *report) missing(section, what string, why error) {
	r.gaps = append(r.gaps, gap{section, what, why.Error()})
}

// gap is one part of the report not measured.
type gap struct{ section, what, why string }

// defaultTraces is $KVROUTERD_TRACES, else the shared directory beside the repository when it
// is there, else ./traces, where `make traces` puts them.
func defaultTraces() string {
	if d := os.Getenv("KVROUTERD_TRACES"); d != "" {
		return d
	}
	if st, err := os.Stat("../shared/traces"); err == nil && st.IsDir() {
		return "../shared/traces"
	}
	return "traces"
}

func run(c config, progress io.Writer) error {
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return err
	}
	r := &report{cfg: c, start: time.Now(), progress: progress}
	r.logf("report into %s (quick: %v)", c.Out, c.Quick)
	var errs []error
	for _, s := range sections {
		if slices.Contains(c.Skip, s) {
			r.logf("%s: skipped", s)
			r.status = append(r.status, sectionStatus{s, "skipped", "--skip"})
			continue
		}
		gaps := len(r.gaps)
		t0 := time.Now()
		var err error
		switch s {
		case "quality":
			err = r.quality()
		case "e2e":
			err = r.e2e()
		case "index":
			err = r.index()
		case "http":
			err = r.http()
		case "restart":
			err = r.restart()
		}
		st := sectionStatus{s, "ran", ""}
		for _, g := range r.gaps[gaps:] {
			st.state = "ran in part"
			st.why += fmt.Sprintf("%s not measured: %s. ", g.what, g.why)
		}
		if err != nil {
			// A failed section is reported and the others still run.
			err = fmt.Errorf("%s: %w", s, err)
			r.logf("%v", err)
			fmt.Fprintf(&r.md, "\n**The %s section failed:** %v\n", s, err)
			errs = append(errs, err)
			st.state, st.why = "failed", err.Error()
		}
		r.status = append(r.status, st)
		r.logf("%s: done in %v", s, time.Since(t0).Round(100*time.Millisecond))
	}
	if err := r.write(); err != nil {
		errs = append(errs, err)
	}
	r.logf("wrote %s and %s, %d measurements, in %v", filepath.Join(c.Out, "report.md"),
		filepath.Join(c.Out, "report.json"), len(r.ms), time.Since(r.start).Round(time.Second))
	for _, st := range r.status {
		r.logf("section %-8s %s %s", st.name, st.state, st.why)
	}
	if len(r.gaps) > 0 {
		errs = append(errs, errMissing)
	}
	return errors.Join(errs...)
}

// sectionStatus is what became of one section: ran, ran in part (why: what was not
// measured), skipped (--skip) or failed (why).
type sectionStatus struct{ name, state, why string }

// measurement is one number of report.json.
type measurement struct {
	Name       string  `json:"name"`
	Value      float64 `json:"value"`
	Unit       string  `json:"unit"`
	Conditions string  `json:"conditions"`
	// Text, for a row that says something in words (a verdict), is what it says.
	Text string `json:"text,omitempty"`
}

// report accumulates the markdown and the measurements; used by one goroutine.
type report struct {
	cfg      config
	start    time.Time
	progress io.Writer
	md       strings.Builder
	ms       []measurement
	plots    []string
	summary  []summaryRow
	status   []sectionStatus
	gaps     []gap
	sims     map[simKey]qualityRun // simulate's runs, by their settings
}

// summaryRow is one line of the report's opening table (and of the README's).
type summaryRow struct{ what, value, target, command string }

// headline adds a line to the summary; command is what reruns just that measurement.
func (r *report) headline(what, value, target, command string) {
	r.summary = append(r.summary, summaryRow{what, value, target, command})
}

func (r *report) logf(format string, args ...any) {
	fmt.Fprintf(r.progress, "[%6.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// add records a measurement; name is dotted and unique within the report.
func (r *report) add(name string, value float64, unit, conditions string) {
	r.ms = append(r.ms, measurement{Name: name, Value: value, Unit: unit, Conditions: conditions})
}

// addText adds a row that says text, its value a count of what it names.
func (r *report) addText(name string, value float64, unit, conditions, text string) {
	r.ms = append(r.ms, measurement{Name: name, Value: value, Unit: unit, Conditions: conditions, Text: text})
}

// mdf appends to the markdown; numbers get thousands separators (12,031 requests).
func (r *report) mdf(format string, args ...any) { mdPrinter.Fprintf(&r.md, format, args...) }

var mdPrinter = message.NewPrinter(language.English)

func (r *report) write() error {
	var head strings.Builder
	fmt.Fprintf(&head, "# kvrouterd performance and routing-quality report\n\n")
	mode := "full"
	if r.cfg.Quick {
		mode = "quick"
	}
	fmt.Fprintf(&head, "Written by `go run ./bench/report%s` (%s run, %s) in %v on %s.\n",
		map[bool]string{true: " --quick"}[r.cfg.Quick], mode, time.Now().UTC().Format(time.DateOnly),
		time.Since(r.start).Round(time.Second), machine())
	fmt.Fprintf(&head, "\n| section | state | why |\n|---|---|---|\n")
	for _, st := range r.status {
		fmt.Fprintf(&head, "| %s | %s | %s |\n", st.name, st.state, strings.TrimSpace(st.why))
	}
	if len(r.gaps) > 0 {
		fmt.Fprintf(&head, "\n**Not the whole report:** %v.\n", errMissing)
	}
	if len(r.summary) > 0 {
		fmt.Fprintf(&head, "\n## Summary\n\n| what | measured | target | command |\n|---|---|---|---|\n")
		for _, s := range r.summary {
			fmt.Fprintf(&head, "| %s | %s | %s | %s |\n", s.what, s.value, s.target, s.command) // pre-formatted
		}
	}
	if err := os.WriteFile(filepath.Join(r.cfg.Out, "report.md"), []byte(head.String()+r.md.String()), 0o644); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r.ms, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.cfg.Out, "report.json"), append(b, '\n'), 0o644)
}

// machine describes the host: CPU model and logical CPUs.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d logical CPUs, %s", model, runtime.NumCPU(), runtime.Version())
}

// command is the command line that reruns one section as this run ran it.
func (r *report) command(section string) string {
	var skip []string
	for _, s := range sections {
		if s != section {
			skip = append(skip, s)
		}
	}
	q := ""
	if r.cfg.Quick {
		q = "--quick "
	}
	return fmt.Sprintf("`go run ./bench/report %s--skip %s`", q, strings.Join(skip, ","))
}

// splitLines splits s into its non-empty lines, without the line ends.
func splitLines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if l = strings.TrimRight(l, "\r\n"); l != "" {
			out = append(out, l)
		}
	}
	return out
}
