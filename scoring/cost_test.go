package scoring

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestScoreDynamoCost(t *testing.T) {
	// Block size 16, a 100-token prompt: 6 full blocks and a tail.
	p := &Params{Mode: KV, BlockSize: 16, ISL: 100, Blocks: 6, Weight: 1, TrackPrefill: true}
	c := []Candidate{
		{Worker: 1, Cached: 4, ActiveBlocks: 10, ActivePrefill: 32},
		{Worker: 2, Cached: 0, ActiveBlocks: 0},
		{Worker: 3, Cached: 6, Shared: 6, ActiveBlocks: 20, ActivePrefill: 0},
	}
	Score(c, p)
	f := func(x Candidate, prefill, decode int64, logit float64) {
		t.Helper()
		if x.PrefillTokens != prefill || x.DecodeBlocks != decode || math.Abs(x.Logit-logit) > 1e-12 {
			t.Fatalf("worker %d: prefill %d decode %d logit %v, want %d %d %v",
				x.Worker, x.PrefillTokens, x.DecodeBlocks, x.Logit, prefill, decode, logit)
		}
	}
	// 1: prefill 32 + 100 − 64 = 68 tokens = 4.25 blocks; decode 10 + 6 = 16.
	f(c[0], 68, 16, 4.25+16)
	// 2: 100 tokens = 6.25 blocks; decode 0 + 6 = 6.
	f(c[1], 100, 6, 6.25+6)
	// 3: 4 tokens = 0.25; decode 20 + 0 = 20 (its six full blocks are active already).
	f(c[2], 4, 20, 0.25+20)

	// Without prefill tracking the request's own 36 uncached tokens are not charged (Dynamo's
	// track_prefill_tokens=false): 1 counts only its active 32; 2 and 3 nothing.
	p.Weight, p.TrackPrefill = 2, false
	Score(c, p)
	f(c[0], 32, 16, 2*32.0/16+16)
	f(c[1], 0, 6, 6)
	f(c[2], 0, 20, 20)
}

func TestSelectTemperatureZero(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := []Candidate{{Worker: 1, Logit: 5}, {Worker: 2, Logit: 3}, {Worker: 3, Logit: 7}}
	if got := Select(c, 0, rng); got != 1 {
		t.Fatalf("chose %d, want the lowest logit (1)", got)
	}
	// Equal logits: the smaller tree wins.
	c = []Candidate{{Worker: 1, Logit: 3, Tree: 50}, {Worker: 2, Logit: 3, Tree: 10}, {Worker: 3, Logit: 9, Tree: 0}}
	if got := Select(c, 0, rng); got != 1 {
		t.Fatalf("chose %d, want the smaller tree (1)", got)
	}
	// Equal logits and trees: each of the tied workers, at random, never the others.
	c = []Candidate{{Worker: 1, Logit: 3, Tree: 5}, {Worker: 2, Logit: 3, Tree: 5}, {Worker: 3, Logit: 3, Tree: 6}, {Worker: 4, Logit: 3, Tree: 5}}
	seen := map[int]int{}
	for range 3000 {
		seen[Select(c, 0, rng)]++
	}
	if seen[2] != 0 || len(seen) != 3 {
		t.Fatalf("tie picks %v: want 0, 1 and 3 only", seen)
	}
	for i, n := range seen {
		if n < 800 {
			t.Fatalf("tie picks %v: candidate %d picked %d of 3000 times", seen, i, n)
		}
	}
}

func TestSelectSoftmax(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// Logits 0, 1, 2 normalised by the range 2: p ∝ exp(−l/(2T)). With T = 0.5: 1, e^-1, e^-2.
	c := []Candidate{{Logit: 10}, {Logit: 11}, {Logit: 12}}
	const n = 200000
	var got [3]int
	for range n {
		got[Select(c, 0.5, rng)]++
	}
	z := 1 + math.Exp(-1) + math.Exp(-2)
	for i, w := range []float64{1, math.Exp(-1), math.Exp(-2)} {
		want := w / z
		if f := float64(got[i]) / n; math.Abs(f-want) > 0.01 {
			t.Fatalf("candidate %d drawn %.4f of the time, want %.4f", i, f, want)
		}
	}
	// Equal logits: uniform.
	c = []Candidate{{Logit: 1}, {Logit: 1}}
	got = [3]int{}
	for range 10000 {
		got[Select(c, 1, rng)]++
	}
	if got[0] < 4500 || got[1] < 4500 {
		t.Fatalf("equal logits drawn %v, want about half each", got[:2])
	}
}

func TestChooseModes(t *testing.T) {
	var ch Chooser
	rng := rand.New(rand.NewPCG(5, 6))
	p := &Params{BlockSize: 4, ISL: 8, Blocks: 2, Weight: 1}
	mk := func() []Candidate {
		return []Candidate{
			{Worker: 1, Cached: 2, ActiveBlocks: 9, ActiveRequests: 3},
			{Worker: 2, ActiveBlocks: 1, ActivePrefill: 8, ActiveRequests: 1},
			{Worker: 3, ActiveBlocks: 2, ActiveRequests: 2},
		}
	}
	f := func(m Mode, want int) {
		t.Helper()
		p.Mode = m
		got, err := ch.Choose(mk(), p, rng)
		if err != nil || got != want {
			t.Fatalf("%v: chose %d (%v), want %d", m, got, err, want)
		}
	}
	// kv, the request's tokens not tracked: logits 1: 0+11 = 11; 2: its active 8/4 + 3 = 5;
	// 3: 0+4 = 4.
	f(KV, 2)
	p.TrackPrefill = true // 1: 0+11; 2: (8+8)/4 + 3 = 7; 3: 8/4 + 4 = 6

	f(KV, 2)
	f(LeastLoaded, 1) // 3, 1 and 2 requests
	f(Direct, 0)
	for i := range 6 {
		f(RoundRobin, i%3)
	}
	p.Mode = Random
	seen := map[int]bool{}
	for range 100 {
		i, _ := ch.Choose(mk(), p, rng)
		seen[i] = true
	}
	if len(seen) != 3 {
		t.Fatalf("random mode chose %v in 100 draws", seen)
	}
	p.Mode = KV
	if _, err := ch.Choose(nil, p, rng); err != ErrNoWorkers {
		t.Fatalf("no candidates: %v", err)
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1), -1} {
		p.Temperature = bad
		if _, err := ch.Choose(mk(), p, rng); err != ErrTemperature {
			t.Fatalf("temperature %v: %v", bad, err)
		}
		p.Temperature, p.Weight = 0, bad
		if _, err := ch.Choose(mk(), p, rng); err != ErrWeight {
			t.Fatalf("weight %v: %v", bad, err)
		}
		p.Weight = 1
	}
}

func TestParseMode(t *testing.T) {
	for m := KV; m < numModes; m++ {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Fatalf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseMode("fastest"); err == nil {
		t.Fatal("ParseMode accepted an unknown mode")
	}
}

func TestScoreSelectAllocs(t *testing.T) {
	c := make([]Candidate, 1000)
	for i := range c {
		c[i] = Candidate{Worker: uint64(i), Cached: int32(i % 7), ActiveBlocks: int64(i % 13)}
	}
	var ch Chooser
	p := &Params{Mode: KV, BlockSize: 16, ISL: 2048, Blocks: 128, Weight: 1, Temperature: 0.3, TrackPrefill: true}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := ch.Choose(c, p, nil); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Choose allocates %v times", n)
	}
}

// TestTieBreakDrawsOnlyOnTies: the rule draws from the random source only when candidates tie in
// logit and tree, so that two paths applying it to the same workers stay in step on one source.
func TestTieBreakDrawsOnlyOnTies(t *testing.T) {
	src, twin := rand.NewPCG(5, 6), rand.NewPCG(5, 6)
	rng := rand.New(src)
	unique := []Candidate{{Logit: 3, Tree: 7}, {Logit: 3, Tree: 2}, {Logit: 1, Tree: 9}, {Logit: 1, Tree: 4}}
	if got := Select(unique, 0, rng); got != 3 {
		t.Fatalf("chose %d, want 3 (lowest logit, then smallest tree)", got)
	}
	if src.Uint64() != twin.Uint64() {
		t.Fatal("a choice without a tie drew from the random source")
	}
	var tb TieBreak
	for i, tree := range []int64{4, 2, 2, 9} {
		tb.Add(i, tree)
	}
	if _, only := tb.Draw(rng); only {
		t.Fatal("two candidates with the smallest tree: want a draw")
	}
	taken := -1
	for i, tree := range []int64{4, 2, 2, 9} {
		if tb.Take(tree) {
			if taken >= 0 {
				t.Fatalf("Take true for %d and %d", taken, i)
			}
			taken = i
		}
	}
	if taken != 1 && taken != 2 {
		t.Fatalf("took %d, want 1 or 2", taken)
	}
}
