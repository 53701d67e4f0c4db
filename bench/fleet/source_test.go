package fleet

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// TestRunSourceMatchesRun: streamed, a workload replays exactly as Run replays it whole (the
// same totals, per worker, to the token) for every kind of run, with summaries within the
// histogram's 0.8 % of Run's exact figures, while holding a small part of the workload at once.
func TestRunSourceMatchesRun(t *testing.T) {
	wc := trace.DefaultSynthetic()
	wc.Duration = 3 * time.Minute
	reqs := trace.Synthetic(wc)
	cases := map[string]Config{
		"open":        {Workers: 4, Mode: scoring.KV, Worker: smallWorker(), Seed: 3, Sample: time.Second},
		"closed":      {Workers: 4, Mode: scoring.KV, Worker: smallWorker(), Seed: 3, ClosedLoop: true},
		"closed peer": {Workers: 4, Peer: SGLang, Worker: smallWorker(), Seed: 3, ClosedLoop: true},
		"queue":       {Workers: 2, Mode: scoring.KV, Worker: smallWorker(), Seed: 3, ClosedLoop: true, Queue: &router.QueueConfig{Threshold: 0.05, MaxRequests: 1 << 20, MaxWait: 50 * time.Millisecond}},
		"disagg":      {Workers: 8, Mode: scoring.KV, Worker: smallWorker(), Seed: 3, PrefillWorkers: 4, EventDelay: 10 * time.Millisecond},
	}
	for name, cfg := range cases {
		whole, err := Run(cfg, reqs)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		streamed, err := RunSource(cfg, trace.SliceSource(reqs))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if streamed.TTFT != nil || streamed.E2E != nil || streamed.Arrival != nil || streamed.QueueWait != nil {
			t.Errorf("%s: RunSource kept per-request slices", name)
		}
		w, s := *whole, *streamed
		w.TTFT, w.E2E, w.Arrival, w.QueueWait = nil, nil, nil, nil
		if w.Requests != len(reqs) || w.TTFTHist != s.TTFTHist || w.E2EHist != s.E2EHist || w.ITLHist != s.ITLHist ||
			w.PromptTokens != s.PromptTokens || w.CachedTokens != s.CachedTokens || w.Makespan != s.Makespan ||
			!slices.Equal(w.PerWorker, s.PerWorker) || !slices.Equal(w.Blocks, s.Blocks) || w.LaterTurns != s.LaterTurns ||
			w.Queued != s.Queued || w.QueueTimedOut != s.QueueTimedOut || w.Split != s.Split || w.Booked != s.Booked {
			t.Errorf("%s: streamed %+v\nwhole %+v", name, summary(&s), summary(&w))
		}
		for _, c := range []struct {
			what  string
			exact []time.Duration
			h     *Hist
		}{{"ttft", whole.TTFT, &whole.TTFTHist}, {"e2e", whole.E2E, &whole.E2EHist}, {"itl", whole.ITL(reqs), &whole.ITLHist}} {
			checkHist(t, name+" "+c.what, c.exact, c.h)
		}
		if name == "queue" && (whole.Queued == 0 || whole.QueueTimedOut == 0) {
			t.Errorf("queue: %d queued, %d timed out: the case tests no queue", whole.Queued, whole.QueueTimedOut)
		}
		if s.MaxInFlight == 0 || s.MaxInFlight > len(reqs)/4 {
			t.Errorf("%s: %d requests held at once of %d", name, s.MaxInFlight, len(reqs))
		}
	}
}

// checkHist compares h's mean, median and p99 with those of exact's positive values.
func checkHist(t *testing.T, what string, exact []time.Duration, h *Hist) {
	t.Helper()
	var v []time.Duration
	var sum float64
	for _, d := range exact {
		if d > 0 {
			v = append(v, d)
			sum += float64(d)
		}
	}
	slices.Sort(v)
	if int64(len(v)) != h.N() || len(v) == 0 {
		t.Fatalf("%s: %d values counted, %d positive", what, h.N(), len(v))
	}
	if m := sum / float64(len(v)); math.Abs(float64(h.Mean())-m) > 1e-9*m+1 {
		t.Errorf("%s: mean %v, exact %v", what, h.Mean(), time.Duration(m))
	}
	for _, q := range []float64{0, 0.5, 0.99, 1} {
		want := v[min(len(v)-1, int(q*float64(len(v))))]
		if got := h.Quantile(q); math.Abs(float64(got-want)) > float64(want)/128+1 {
			t.Errorf("%s: quantile %v is %v, exact %v", what, q, got, want)
		}
	}
}

// TestHist: quantiles within 1/128 of the exact ones over values of every magnitude, exact
// below 64 ns; non-positive values are not counted.
func TestHist(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h Hist
	var v []time.Duration
	for range 100000 {
		d := time.Duration(math.Exp(rng.Float64() * 40)) // 1 ns to 65 hours
		h.Add(d)
		v = append(v, d)
	}
	h.Add(0)
	h.Add(-time.Second)
	checkHist(t, "random", v, &h)
	var small Hist
	for d := range time.Duration(64) {
		small.Add(d)
	}
	if small.N() != 63 || small.Quantile(0) != 1 || small.Quantile(0.5) != 32 || small.Quantile(1) != 63 {
		t.Errorf("below 64 ns: n %d, quantiles %v %v %v", small.N(), small.Quantile(0), small.Quantile(0.5), small.Quantile(1))
	}
	var empty Hist
	if empty.Mean() != 0 || empty.Quantile(0.5) != 0 {
		t.Error("an empty histogram has values")
	}
}

// TestRunSourceRefusesDisorder: a source out of arrival order, and a source's error, end the run
// with an error.
func TestRunSourceRefusesDisorder(t *testing.T) {
	reqs := smallWorkload()[:20]
	reqs[10], reqs[11] = reqs[11], reqs[10]
	if reqs[10].At == reqs[11].At {
		t.Fatal("two equal arrivals: the test shows nothing")
	}
	cfg := Config{Workers: 2, Worker: smallWorker()}
	if _, err := RunSource(cfg, trace.SliceSource(reqs)); err == nil || !strings.Contains(err.Error(), "not sorted by arrival") {
		t.Errorf("out of order: %v", err)
	}
	bad := trace.MooncakeSource(strings.NewReader(`{"timestamp": 0, "output_length": 1, "token_ids": [1, 2]}
{"timestamp": 1}
`), trace.MooncakeOptions{})
	if _, err := RunSource(cfg, bad); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a bad row: %v", err)
	}
}
