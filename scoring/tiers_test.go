package scoring

import "testing"

// TestTierCredit: the lower tiers' credit in both formulas, against numbers worked by hand from
// Dynamo's formulas (main: lib/kv-router's DefaultScorer, credit = overlap_score_credit × decay
// × device + host_cache_hit_weight × host + disk_cache_hit_weight × disk, prefill blocks =
// max(raw − credit, 0); v1: overlap_weight × prefill_blocks + decode_blocks, the credited
// blocks counted as overlap).
func TestTierCredit(t *testing.T) {
	// A prompt of 160 tokens in blocks of 16 (10 blocks). The worker holds 2 leading blocks on
	// the device; the host extends them by 3, disk by 2 more, external by 1 more. It has 32
	// prefill tokens and 5 blocks active, and shares none of the request's.
	ext := TierExt{Host: 3, Disk: 2, External: 1}
	const cached, activeBlocks, activePrefill = 2, 5, 32
	base := Params{BlockSize: 16, ISL: 160, Blocks: 10, Weight: 1, TrackPrefill: true, Tiers: DefaultTierCredit()}
	f := func(name string, p Params, wantLogit float64) {
		t.Helper()
		if err := p.Check(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		prefill, decode, logit := p.CostExt(cached, ext, 0, activeBlocks, activePrefill, 0)
		// The booking is the device's: 32 active + (160 − 2×16) uncached = 160 prefill tokens,
		// 5 active + 10 request blocks = 15 decode blocks, whatever the tiers hold.
		if prefill != 160 || decode != 15 || logit != wantLogit {
			t.Errorf("%s: prefill %d decode %d logit %v, want 160, 15, %v", name, prefill, decode, logit, wantLogit)
		}
		c := []Candidate{{Cached: cached, Ext: ext, ActiveBlocks: activeBlocks, ActivePrefill: activePrefill}}
		Score(c, &p)
		if c[0].Logit != wantLogit {
			t.Errorf("%s: Score's logit %v, want %v", name, c[0].Logit, wantLogit)
		}
	}

	// v1, default weights: overlap = 2 + 0.75×3 + 0.25×(2+1) = 2 + 2.25 + 0.75 = 5 blocks;
	// prefill = 32 + max(160 − 5×16, 0) = 112 tokens = 7 blocks; logit = 1×7 + 15 = 22.
	f("v1", base, 22)
	// v1, weight 2: 2×7 + 15 = 29.
	p := base
	p.Weight = 2
	f("v1 weight 2", p, 29)
	// v1, tiers indexed but not credited ({0, 0}): overlap = 2; prefill = 32 + 128 = 160
	// tokens = 10 blocks; logit = 10 + 15 = 25, the device-only cost.
	p = base
	p.Tiers = TierCredit{}
	f("v1 uncredited", p, 25)
	if _, _, l := p.Cost(cached, 0, activeBlocks, activePrefill, 0); l != 25 {
		t.Errorf("device-only cost %v, want 25", l)
	}

	// main, Dynamo's defaults (credit 1, load scale 1, no decay, no request weight):
	// raw = (32 + max(160, 2×16)) / 16 = 12 blocks; credit = 1×1×2 + 0.75×3 + 0.25×(2+1) = 5;
	// adjusted = max(12 − 5, 0) = 7; logit = 1×7 + 15 + 0 = 22.
	p = base
	p.Formula, p.Terms = CostMain, DefaultTerms()
	f("main", p, 22)
	// main, overlap_score_credit 0.5 and host weight 1, disk 0.5: credit = 0.5×2 + 1×3 +
	// 0.5×3 = 1 + 3 + 1.5 = 5.5; adjusted = 12 − 5.5 = 6.5; logit = 6.5 + 15 = 21.5.
	p.Credit, p.Tiers = 0.5, TierCredit{Host: 1, Disk: 0.5}
	f("main custom", p, 21.5)
	// main, load scale 2 and a request weight of 1 with 4 active requests: 2×6.5 + 15 + 4 =
	// 32.
	p.LoadScale, p.RequestWeight = 2, 1
	if _, _, l := p.CostExt(cached, ext, 0, activeBlocks, activePrefill, 4); l != 32 {
		t.Errorf("main scaled: logit %v, want 32", l)
	}
	// main, a credit beyond the raw blocks clamps at 0: host 20 blocks at weight 1 → credit
	// 0.5×2 + 20 = 21 > 12; logit = 2×0 + 15 + 4 = 19.
	if _, _, l := p.CostExt(cached, TierExt{Host: 20}, 0, activeBlocks, activePrefill, 4); l != 19 {
		t.Errorf("main clamped: logit %v, want 19", l)
	}
	// Without extensions CostExt is Cost, to the bit, in both formulas.
	for _, q := range []Params{base, p} {
		a1, b1, c1 := q.Cost(cached, 1, activeBlocks, activePrefill, 3)
		a2, b2, c2 := q.CostExt(cached, TierExt{}, 1, activeBlocks, activePrefill, 3)
		if a1 != a2 || b1 != b2 || c1 != c2 {
			t.Errorf("%v: CostExt without extensions (%d %d %v) differs from Cost (%d %d %v)", q.Formula, a2, b2, c2, a1, b1, c1)
		}
	}
	// Weights out of range are refused with Dynamo's names.
	for _, bad := range []TierCredit{{Host: -1}, {Disk: -0.5}} {
		q := base
		q.Tiers = bad
		if err := q.Check(); err == nil {
			t.Errorf("weights %+v accepted", bad)
		}
	}
}
