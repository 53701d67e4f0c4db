package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// TestQuickReportGenerated runs the quality section on the built-in workload alone (no trace
// directory) and checks what it wrote: unique, complete measurements, the plots it links, and
// the mooncake traces reported as not measured rather than silently left out.
func TestQuickReportGenerated(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a few thousand requests several times")
	}
	out := t.TempDir()
	// The other sections' engines have their own tests in their packages.
	skip := slices.DeleteFunc(slices.Clone(sections), func(s string) bool { return s == "quality" })
	cfg := config{Quick: true, Out: out, Traces: filepath.Join(out, "none"), Skip: skip, Seed: 1}
	if raceEnabled {
		// The race detector slows the simulations fifteenfold: a minute of the workload
		// exercises the same code.
		cfg.Generated = time.Minute
	}
	err := run(cfg, io.Discard)
	// Without traces the report is written but says it is not whole, in its error (the
	// command's exit status 3) and its first lines.
	if !errors.Is(err, errMissing) {
		t.Fatalf("run without traces: %v, want errMissing", err)
	}
	b, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ms []map[string]any
	if err := json.Unmarshal(b, &ms); err != nil {
		t.Fatal(err)
	}
	if len(ms) < 40 {
		t.Fatalf("%d measurements, want the generated workload's ≥ 40", len(ms))
	}
	seen := map[string]bool{}
	for _, m := range ms {
		if _, text := m["text"]; len(m) != 4 && !(len(m) == 5 && text) {
			t.Errorf("%v: want exactly name, value, unit, conditions (and text, for a verdict)", m)
		}
		name, _ := m["name"].(string)
		unit, _ := m["unit"].(string)
		cond, _ := m["conditions"].(string)
		if _, ok := m["value"].(float64); !ok || name == "" || unit == "" || cond == "" {
			t.Errorf("incomplete measurement %v", m)
		}
		if seen[name] {
			t.Errorf("measurement %q twice", name)
		}
		seen[name] = true
	}
	for _, name := range []string{"quality.generated.loaded.kv.ttft_mean", "quality.generated.bound_infinite",
		"quality.generated.loaded.kv_over_round_robin_ttft_mean", "quality.generated.predict.off.hit_rate",
		"quality.generated.predict.on.hit_rate", "quality.generated.predict.on.ttft_mean",
		"quality.generated.loaded.llmd.ttft_mean", "quality.generated.loaded.sglang.ttft_p99", "quality.generated.loaded.gie.hit_rate",
		"quality.generated.knee.kv", "quality.generated.knee.round_robin", "quality.generated.knee.llmd",
		"quality.generated.knee.sglang", "quality.generated.knee.gie", "quality.generated.verdict",
		"quality.generated.loaded.kv.hit_of_bound", "quality.generated.loaded.kv.goodput", "quality.generated.loaded.kv.prediction_error",
		"quality.generated.loaded.dynamo_v1.ttft_mean", "quality.generated.loaded.dynamo_main.ttft_p99",
		"quality.generated.loaded.dynamo_agentic.e2e_mean", "quality.generated.loaded.dynamo_load_aware.goodput",
		"quality.generated.knee.dynamo_v1", "quality.generated.knee_own.kv", "quality.generated.knee_own.gie"} {
		if !seen[name] {
			t.Errorf("no %s", name)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Mooncake conversation trace not measured", "| loaded ×", "](ttft-cdf-generated.png)",
		"| quality | ran in part | Mooncake conversation trace not measured", "| e2e | skipped | --skip |", "**Not the whole report:**", "make traces"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	for _, f := range []string{"ttft-cdf-generated.png", "hit-rate-generated.png", "load-generated-kv.png", "predict-hit-burst.png",
		"sweep-ttft-generated.png", "sweep-hit-generated.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("plot %s: %v", f, err)
		}
	}
}

func TestSummarize(t *testing.T) {
	ds := make([]time.Duration, 0, 101)
	for i := range 100 {
		ds = append(ds, time.Duration(100-i)*time.Millisecond)
	}
	ds = append(ds, 0) // a refused request: ignored
	d := summarize(ds)
	if d.mean != 50500*time.Microsecond || d.p50 != 51*time.Millisecond || d.p99 != 100*time.Millisecond {
		t.Errorf("got %+v", d)
	}
	if summarize(nil) != (dist{}) {
		t.Error("empty input")
	}
}

func TestCDF(t *testing.T) {
	xy := cdf([]time.Duration{3 * time.Millisecond, 0, time.Millisecond, 2 * time.Millisecond})
	if len(xy) != 3 || xy[0].X != 1 || xy[2].X != 3 || xy[2].Y != 1 || xy[0].Y != 1.0/3 {
		t.Errorf("got %v", xy)
	}
	long := make([]time.Duration, 10007)
	for i := range long {
		long[i] = time.Duration(i+1) * time.Microsecond
	}
	xy = cdf(long)
	if len(xy) > 600 || xy[len(xy)-1].Y != 1 || xy[len(xy)-1].X != 10.007 {
		t.Errorf("thinned to %d points ending at %v", len(xy), xy[len(xy)-1])
	}
}

// TestQueueRows runs the router-queue section on a short generated workload standing in for
// the conversation trace and checks that every row the issue names exists, with its plot.
func TestQueueRows(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a workload a few dozen times")
	}
	out := t.TempDir()
	g := trace.DefaultSynthetic()
	g.Duration = time.Minute
	r := &report{cfg: config{Quick: true, Out: out, Seed: 1}, start: time.Now(), progress: io.Discard}
	if err := r.queue(workload{name: "conversation", about: "generated stand-in", reqs: trace.Synthetic(g)}); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range r.ms {
		if _, dup := got[m.Name]; dup {
			t.Errorf("measurement %q twice", m.Name)
		}
		got[m.Name] = m.Value
	}
	want := []string{"quality.conversation.priority.high.ttft_mean", "quality.conversation.priority.low.ttft_mean"}
	for _, p := range queuePolicies {
		want = append(want, "quality.conversation.queue."+p+".ttft_mean", "quality.conversation.queue."+p+".ttft_p99")
	}
	for _, th := range queueThresholds {
		want = append(want, fmt.Sprintf("quality.conversation.queue.fcfs.threshold%g.ttft_mean", th))
	}
	for _, name := range want {
		if v, ok := got[name]; !ok || !(v > 0) {
			t.Errorf("%s: %v, %v", name, v, ok)
		}
	}
	if st, err := os.Stat(filepath.Join(out, "queue-ttft-cdf-conversation.png")); err != nil || st.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
	t.Logf("off %.0f, fcfs %.0f, wspt %.0f, lcfs %.0f ms; high %.0f, low %.0f ms", got[want[2]], got[want[4]], got[want[6]],
		got[want[8]], got[want[0]], got[want[1]])
}

// TestFeatureRows runs the disaggregation, host-tier and predict-on-route sections, on a short
// generated workload standing in for the conversation trace, and checks that every row the
// issue names exists, with its plot.
func TestFeatureRows(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates workloads a few dozen times")
	}
	out := t.TempDir()
	g := trace.DefaultSynthetic()
	g.Duration = time.Minute
	r := &report{cfg: config{Quick: true, Out: out, Seed: 1}, start: time.Now(), progress: io.Discard}
	w := workload{name: "conversation", about: "generated stand-in", reqs: trace.Synthetic(g)}
	kv, err := r.simulate(w, scoring.KV, 0.2, kvBlocks, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.features(&loadedSet{w: w, runs: []qualityRun{kv}}); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range r.ms {
		if _, dup := got[m.Name]; dup {
			t.Errorf("measurement %q twice", m.Name)
		}
		got[m.Name] = m.Value
	}
	var want []string
	for _, f := range []string{"aggregated", "disaggregated", "conditional"} {
		for _, v := range []string{"ttft_mean", "ttft_p99", "itl_mean"} {
			want = append(want, "quality.conversation.disagg."+f+"."+v)
		}
	}
	for _, f := range []string{"none", "host", "host_credit"} {
		want = append(want, "quality.conversation.tiers."+f+".hit_of_bound", "quality.conversation.tiers."+f+".ttft_mean")
	}
	for _, f := range []string{"off", "on"} {
		want = append(want, "quality.generated.predict."+f+".hit_rate", "quality.generated.predict."+f+".ttft_mean")
	}
	for _, name := range want {
		if v, ok := got[name]; !ok || !(v > 0) {
			t.Errorf("%s: %v, %v", name, v, ok)
		}
	}
	for _, f := range []string{"disagg-ttft-cdf-conversation.png", "tiers-hit-conversation.png", "predict-hit-burst.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("plot %s: %v", f, err)
		}
	}
	t.Logf("disagg ttft agg %.0f / disagg %.0f / cond %.0f ms; tiers of bound %.0f / %.0f / %.0f %%; predict hit %.1f → %.1f %%",
		got[want[0]], got[want[3]], got[want[6]], got[want[9]], got[want[11]], got[want[13]], got[want[15]], got[want[17]])
}

// TestExtraTrace: a trace given as --trace NAME=PATH, here in the token-id form with ISO-8601
// times and sessions, is replayed in the quality section under its name; one that does not
// load ends the report with an error that names it.
func TestExtraTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a minute of requests at a few loads")
	}
	dir := t.TempDir()
	g := trace.DefaultSynthetic()
	g.Duration = time.Minute
	reqs := trace.Synthetic(g)
	start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	path := writeTrace(t, dir, reqs, func(q trace.Request) map[string]any {
		return map[string]any{"timestamp": start.Add(q.At).Format(time.RFC3339Nano), "token_ids": q.Tokens,
			"output_length": q.Output, "session_id": fmt.Sprint("s", q.Session)}
	})
	r := &report{cfg: config{Quick: true, Out: dir, Traces: filepath.Join(dir, "none"), Seed: 1, Extra: []namedTrace{{"mine", path}}},
		start: time.Now(), progress: io.Discard}
	ws, err := r.workloads()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ws, func(w workload) bool { return w.name == "mine" })
	if i < 0 || len(ws[i].reqs) != len(reqs) || !slices.Equal(ws[i].reqs[len(reqs)-1].Tokens, reqs[len(reqs)-1].Tokens) {
		t.Fatalf("the trace is not a workload as written: %d workloads", len(ws))
	}
	if _, err := r.qualityWorkload(ws[i], kvBlocks); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range r.ms {
		got[m.Name] = true
		if strings.HasPrefix(m.Name, "quality.mine.loaded.") && !strings.Contains(m.Conditions, "closed-loop") {
			t.Errorf("%s: conditions %q do not say the sessions were replayed closed-loop", m.Name, m.Conditions)
		}
	}
	for _, name := range []string{"quality.mine.loaded.kv.ttft_mean", "quality.mine.loaded.round_robin.ttft_mean", "quality.mine.bound_infinite"} {
		if !got[name] {
			t.Errorf("no %s", name)
		}
	}
	r.cfg.Extra = []namedTrace{{"broken", filepath.Join(dir, "none.jsonl")}}
	if _, err := r.workloads(); err == nil || !strings.Contains(err.Error(), "--trace broken=") {
		t.Errorf("a missing --trace: %v, want an error naming it", err)
	}
}

// TestExtraTraceSections: a --trace goes through the end-to-end and index sections too, its
// rows named e2e.NAME.… and index.NAME.wN.…, while the missing Mooncake trace is reported as a
// gap, not an error.
func TestExtraTraceSections(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon in process")
	}
	dir := t.TempDir()
	g := trace.DefaultSynthetic()
	g.Duration = 20 * time.Second
	path := writeTrace(t, dir, trace.Synthetic(g), func(q trace.Request) map[string]any {
		return map[string]any{"timestamp": q.At.Seconds() * 1000, "token_ids": q.Tokens, "output_length": q.Output, "session_id": q.Session}
	})
	r := &report{cfg: config{Quick: true, Out: dir, Traces: filepath.Join(dir, "none"), Seed: 1, Extra: []namedTrace{{"mine", path}}},
		start: time.Now(), progress: io.Discard}
	if err := r.e2e(); err != nil {
		t.Fatal(err)
	}
	if err := r.index(); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range r.ms {
		got[m.Name] = m.Value
	}
	for _, name := range []string{"e2e.mine.route_p50", "e2e.mine.hit_rate", "e2e.mine.in_process_hit_rate", "index.mine.w8.apply_rate", "index.mine.w1000.residencies"} {
		if _, ok := got[name]; !ok {
			t.Errorf("no %s", name)
		}
	}
	if got["e2e.mine.in_process_hit_rate"] <= 0 || got["index.mine.w8.residencies"] <= 0 {
		t.Errorf("in-process hit rate %v %%, %v residencies: the trace was not replayed", got["e2e.mine.in_process_hit_rate"], got["index.mine.w8.residencies"])
	}
	if _, ok := got["e2e.route_p50"]; ok || len(r.gaps) != 2 {
		t.Errorf("the missing conversation trace: rows %v, gaps %v", ok, r.gaps)
	}
}

// writeTrace writes reqs as JSON lines, each row(q), into dir/mine.jsonl and returns its path.
func writeTrace(t *testing.T, dir string, reqs []trace.Request, row func(trace.Request) map[string]any) string {
	t.Helper()
	var b strings.Builder
	for _, q := range reqs {
		line, err := json.Marshal(row(q))
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	path := filepath.Join(dir, "mine.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTraceFlag(t *testing.T) {
	var l []namedTrace
	f := traceList{&l}
	for _, bad := range []string{"x", "=p", "n=", "Big=p", "conversation=p", "a b=p"} {
		if err := f.Set(bad); err == nil {
			t.Errorf("--trace %q accepted", bad)
		}
	}
	if err := f.Set("qwen-a=/t/a.jsonl"); err != nil {
		t.Fatal(err)
	}
	if err := f.Set("qwen-a=/t/b.jsonl"); err == nil {
		t.Error("a name given twice accepted")
	}
	if f.String() != "qwen-a=/t/a.jsonl" {
		t.Errorf("String: %q", f.String())
	}
}

// TestKnee: the knee is interpolated in log–log between the points around the threshold, and
// says when it lies outside the loads tried.
func TestKnee(t *testing.T) {
	pt := func(load float64, p99ms float64) sweepPoint {
		return sweepPoint{load: load, q: qualityRun{ttft: dist{p99: time.Duration(p99ms * float64(time.Millisecond))}}}
	}
	// 100 ms at 1 req/s, 400 ms at 4 req/s: 200 ms (log-halfway) at 2 req/s.
	if l, below, above := knee(200, []sweepPoint{pt(0.5, 90), pt(1, 100), pt(4, 400), pt(8, 2000)}); below || above || math.Abs(l-2) > 1e-9 {
		t.Errorf("knee %v (below %v, above %v), want 2 req/s", l, below, above)
	}
	if l, below, _ := knee(200, []sweepPoint{pt(3, 250), pt(6, 900)}); !below || l != 3 {
		t.Errorf("past at the lightest: %v %v", l, below)
	}
	if l, _, above := knee(200, []sweepPoint{pt(3, 110), pt(6, 150)}); !above || l != 6 {
		t.Errorf("not reached: %v %v", l, above)
	}
	w := workload{reqs: []trace.Request{{At: 0}, {At: 5 * time.Second}, {At: 10 * time.Second}}}
	if got := offered(w, 0.5); got != 0.6 {
		t.Errorf("offered: %v req/s, want 3 requests over 5 s", got)
	}
}

// TestSensitivityDecodeRows: the memory-sensitivity table reports the larger caches twice,
// with decode timed as the mocker does and as the one GPU the model was fitted on; the
// latter separates the hits from the decode speed-up a larger cache gets in the model.
func TestSensitivityDecodeRows(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a workload a dozen times")
	}
	g := trace.DefaultSynthetic()
	g.Duration = time.Minute
	r := &report{cfg: config{Out: t.TempDir(), Seed: 1}, start: time.Now(), progress: io.Discard}
	w := workload{name: "conversation", about: "generated stand-in", reqs: trace.Synthetic(g)}
	var runs []qualityRun
	for _, m := range []scoring.Mode{scoring.KV, scoring.RoundRobin} {
		q, err := r.simulate(w, m, 0.2, kvBlocks, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, q)
	}
	if err := r.sensitivity(&loadedSet{w: w, runs: runs}); err != nil {
		t.Fatal(err)
	}
	var mocker, gpu []string
	for _, m := range r.ms {
		switch {
		case strings.Contains(m.Name, ".decode16384.ttft_mean"):
			gpu = append(gpu, m.Name)
			if !strings.Contains(m.Conditions, "decode timed as a 16384-block GPU") {
				t.Errorf("%s: conditions %q do not say how decode was timed", m.Name, m.Conditions)
			}
		case strings.Contains(m.Name, ".blocks1048576.") && strings.HasSuffix(m.Name, ".kv.w1.ttft_mean"):
			mocker = append(mocker, m.Name)
		}
	}
	if len(gpu) != 2 || len(mocker) != 1 {
		t.Fatalf("decode-as-one-GPU rows %v, the whole-cache kv row %v: want 2 and 1", gpu, mocker)
	}
}
