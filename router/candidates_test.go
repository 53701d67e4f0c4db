package router

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestLowest checks the heap selection against a full sort, with many equal logits.
func TestLowest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + rng.IntN(60)
		cands := make([]scoring.Candidate, n)
		for i := range cands {
			cands[i].Logit = float64(rng.IntN(8))
		}
		k, skip := rng.IntN(n+2), rng.IntN(n+1)-1
		var want []int32
		for i := range cands {
			if i != skip {
				want = append(want, int32(i))
			}
		}
		slices.SortFunc(want, func(a, b int32) int {
			return cmp.Or(cmp.Compare(cands[a].Logit, cands[b].Logit), cmp.Compare(a, b))
		})
		want = want[:min(k, len(want))]
		var got []int32
		for _, e := range lowest(nil, cands, k, skip) {
			got = append(got, e.pos)
		}
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("n %d k %d skip %d logits %v: got %v, want %v", n, k, skip, logits(cands), got, want)
		}
	}
}

func logits(cs []scoring.Candidate) []float64 {
	var l []float64
	for _, c := range cs {
		l = append(l, c.Logit)
	}
	return l
}

// TestMaxCandidates checks a capped answer: the chosen worker first, then the lowest logits of
// the full answer, for the request's cap and for the server's default.
func TestMaxCandidates(t *testing.T) {
	r := fleet(t, 40)
	req := wire.RouteRequest{Model: "m", Tokens: familyPrompt(5)}
	var full, capped wire.RouteResponse
	if err := r.Match(&req, &full); err != nil {
		t.Fatal(err)
	}
	if len(full.Candidates) != 40 {
		t.Fatalf("%d candidates, want every worker", len(full.Candidates))
	}
	byLogit := slices.Clone(full.Candidates)
	slices.SortStableFunc(byLogit, func(a, b wire.Candidate) int { return cmp.Compare(a.Logit, b.Logit) })

	req.MaxCandidates = 4
	if err := r.Match(&req, &capped); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(capped.Candidates, byLogit[:4]) {
		t.Errorf("match capped at 4:\n%+v\nwant\n%+v", capped.Candidates, byLogit[:4])
	}

	// A route: the chosen worker leads, and the cap counts it.
	req.RequestID = "r1"
	if err := r.Route(&req, &capped); err != nil {
		t.Fatal(err)
	}
	if len(capped.Candidates) != 4 || capped.Candidates[0].Worker != capped.Worker {
		t.Fatalf("route capped at 4 chose %d: %+v", capped.Worker, capped.Candidates)
	}
	for i := 2; i < 4; i++ {
		if capped.Candidates[i].Logit < capped.Candidates[i-1].Logit {
			t.Errorf("candidates 1.. not by ascending logit: %+v", capped.Candidates)
		}
	}
	if err := r.Complete("r1"); err != nil {
		t.Fatal(err)
	}

	// The server's default applies when the request does not say; a cap above the worker count
	// gives them all.
	r.cfg.MaxCandidates = 2
	req.MaxCandidates = 0
	if err := r.Match(&req, &capped); err != nil || len(capped.Candidates) != 2 {
		t.Fatalf("default cap 2: %d candidates, %v", len(capped.Candidates), err)
	}
	req.MaxCandidates = 1000
	if err := r.Match(&req, &capped); err != nil || !slices.Equal(capped.Candidates, full.Candidates) {
		t.Fatalf("cap 1000 of 40 workers: %d candidates, %v", len(capped.Candidates), err)
	}
}
