package scoring

import (
	"math"
	"testing"
)

// The numbers below are worked by hand from Dynamo main's code, so that CostMain is pinned to it
// term by term:
//
//   - lib/kv-router/src/scheduling/selector/mod.rs, WorkerSelectionInput::row:
//     raw_prefill_tokens = (active_prefill + effective_prefill_tokens(isl, cached)) + cached,
//     where effective_prefill_tokens(isl, c) = isl − min(c, isl) (prefill_load.rs), so
//     raw = active_prefill + max(isl, cached); 0 when track_prefill_tokens is off;
//     raw_prefill_blocks = raw / block_size; decode_cost_blocks = potential_decode_blocks()
//     (active blocks + the request's blocks not active on the worker, prompt_registry.rs).
//   - WorkerSelectionInput::new: min_active_prefill_tokens is the least active prefill among the
//     eligible workers, only when tracking prefill with a decay > 0; request_blocks(bs) =
//     ⌈isl / bs⌉ (types.rs).
//   - lib/kv-router/src/scheduling/selector/default.rs, DefaultWorkerScorer::worker_logit:
//     decay = 1 / (1 + credit_decay × ((active − min) / bs) / request_blocks);
//     overlap_credit_blocks = credit × decay × device_overlap_blocks;
//     adjusted = max(raw_prefill_blocks − overlap_credit_blocks, 0);
//     logit = prefill_load_scale × adjusted + decode_cost_blocks plus
//     decode_active_request_weight × active_requests.
//   - lib/kv-router/src/scheduling/config.rs, KvRouterConfig::default: credit 1.0, decay 0.0,
//     prefill_load_scale 1.0, decode_active_request_weight 0.0.
func TestCostMainTerms(t *testing.T) {
	f := func(name string, p Params, c Candidate, want float64) {
		t.Helper()
		p.Formula, p.BlockSize = CostMain, 16
		if p.ISL == 0 {
			p.ISL, p.Blocks = 64, 4
		}
		if err := p.Check(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, _, got := p.Cost(c.Cached, c.Shared, c.ActiveBlocks, c.ActivePrefill, c.ActiveRequests)
		if math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: logit %v, want %v", name, got, want)
		}
	}
	def := DefaultTerms()
	tracked := func(t Terms) Params { return Params{TrackPrefill: true, Terms: t} }
	with := func(mod func(*Terms)) Terms { t := def; mod(&t); return t }

	// isl 64 tokens (4 blocks of 16), 2 cached, nothing active: raw = (0 + max(64, 32)) / 16 = 4.
	// Credit 1 (the default): adjusted = 4 − 1 × 2 = 2; decode = 0 + 4 − 0 = 4; logit 1 × 2 + 4 = 6.
	f("credit default", tracked(def), Candidate{Cached: 2}, 6)
	// Credit 0.5: adjusted = 4 − 0.5 × 2 = 3; logit 3 + 4 = 7.
	f("credit 0.5", tracked(with(func(t *Terms) { t.Credit = 0.5 })), Candidate{Cached: 2}, 7)
	// Credit 0, the cache ignored: adjusted = 4; logit 4 + 4 = 8.
	f("credit 0", tracked(with(func(t *Terms) { t.Credit = 0 })), Candidate{Cached: 2}, 8)
	// With load: active prefill 32, active blocks 10, 1 block shared: raw = (32 + 64) / 16 = 6;
	// adjusted = 6 − 2 = 4; decode = 10 + 4 − 1 = 13; logit 4 + 13 = 17 (v1 at weight 1: the same,
	// 1 × (32 + 64 − 32) / 16 + 13 = 17).
	f("load", tracked(def), Candidate{Cached: 2, Shared: 1, ActiveBlocks: 10, ActivePrefill: 32}, 17)

	// prefill_load_scale 2: adjusted 2 (as "credit default") scaled: 2 × 2 + 4 = 8.
	f("scale 2", tracked(with(func(t *Terms) { t.LoadScale = 2 })), Candidate{Cached: 2}, 8)
	// prefill_load_scale 0: decode alone, 4.
	f("scale 0", tracked(with(func(t *Terms) { t.LoadScale = 0 })), Candidate{Cached: 2}, 4)

	// decode_active_request_weight 0.5 with 6 active requests: 6 + 0.5 × 6 = 9.
	f("active requests", tracked(with(func(t *Terms) { t.RequestWeight = 0.5 })), Candidate{Cached: 2, ActiveRequests: 6}, 9)
	// The default weight 0 ignores them: 6.
	f("active requests, weight 0", tracked(def), Candidate{Cached: 2, ActiveRequests: 6}, 6)

	// Decay 2, the least active prefill among the candidates 0, this worker's 128: excess =
	// (128 − 0) / 16 = 8 blocks; request blocks ⌈64 / 16⌉ = 4; decay = 1 / (1 + 2 × 8 / 4) = 0.2;
	// credit blocks = 1 × 0.2 × 4 cached = 0.8; raw = (128 + 64) / 16 = 12; adjusted = 11.2;
	// decode = 10 + 4 − 0 = 14; logit 11.2 + 14 = 25.2.
	decay2 := tracked(with(func(t *Terms) { t.CreditDecay = 2 }))
	f("decay", decay2, Candidate{Cached: 4, ActiveBlocks: 10, ActivePrefill: 128}, 25.2)
	// The same worker when the least loaded candidate has 64 active: excess = 64 / 16 = 4;
	// decay = 1 / (1 + 2 × 4 / 4) = 1/3; credit blocks 4/3; adjusted = 12 − 4/3 = 32/3;
	// logit 32/3 + 14 = 74/3.
	decay2.MinActivePrefill = 64
	f("decay from the least loaded", decay2, Candidate{Cached: 4, ActiveBlocks: 10, ActivePrefill: 128}, 74.0/3)
	// A prompt that ends mid-block: isl 72, 4 full blocks, ⌈72 / 16⌉ = 5 request blocks; decay 1,
	// active 160, least 0: excess 10 blocks, decay = 1 / (1 + 1 × 10 / 5) = 1/3; raw =
	// (160 + 72) / 16 = 14.5; credit blocks = 3 × 1/3 = 1; adjusted 13.5; decode = 0 + 4 = 4;
	// logit 17.5.
	p := tracked(with(func(t *Terms) { t.CreditDecay = 1 }))
	p.ISL, p.Blocks = 72, 4
	f("decay, partial block", p, Candidate{Cached: 3, ActivePrefill: 160}, 17.5)
	// The least loaded worker keeps its whole credit: as "credit default", 6.
	f("decay at the floor", tracked(with(func(t *Terms) { t.CreditDecay = 2 })), Candidate{Cached: 2}, 6)

	// track_prefill_tokens off: raw = 0, so the prefill term is max(0 − credit × cached, 0) = 0
	// and the worker's own active prefill does not count either (v1 charges it); decay needs
	// tracking. Active prefill 500, 3 active blocks, 2 cached: logit = 3 + 4 = 7.
	f("untracked", Params{Terms: with(func(t *Terms) { t.CreditDecay = 5 })}, Candidate{Cached: 2, ActiveBlocks: 3, ActivePrefill: 500}, 7)
}

// TestScoreSetsMinPrefill: Score finds the least active prefill of its candidates for the decay.
func TestScoreSetsMinPrefill(t *testing.T) {
	p := Params{Formula: CostMain, BlockSize: 16, ISL: 64, Blocks: 4, TrackPrefill: true, Terms: DefaultTerms()}
	p.CreditDecay = 2
	c := []Candidate{{Cached: 4, ActiveBlocks: 10, ActivePrefill: 128}, {ActivePrefill: 64}}
	Score(c, &p)
	if p.MinActivePrefill != 64 {
		t.Fatalf("MinActivePrefill %d, want 64", p.MinActivePrefill)
	}
	if math.Abs(c[0].Logit-74.0/3) > 1e-12 {
		t.Fatalf("logit %v, want 74/3 (see TestCostMainTerms)", c[0].Logit)
	}
}

func TestTermsCheck(t *testing.T) {
	f := func(mod func(*Terms), want error) {
		t.Helper()
		tm := DefaultTerms()
		mod(&tm)
		if err := tm.Check(); err != want {
			t.Errorf("%+v: %v, want %v", tm, err, want)
		}
	}
	f(func(*Terms) {}, nil)
	f(func(t *Terms) { t.Credit = -0.5 }, ErrCredit)
	f(func(t *Terms) { t.Credit = math.NaN() }, ErrCredit)
	f(func(t *Terms) { t.CreditDecay = -1 }, ErrCreditDecay)
	f(func(t *Terms) { t.LoadScale = math.Inf(1) }, ErrLoadScale)
	f(func(t *Terms) { t.RequestWeight = -0.1 }, ErrRequestWeight)
	for _, s := range []string{"v1", "main"} {
		if c, err := ParseCost(s); err != nil || c.String() != s {
			t.Errorf("ParseCost(%q) = %v, %v", s, c, err)
		}
	}
	if _, err := ParseCost("v2"); err == nil {
		t.Error("ParseCost(v2) took it")
	}
}
