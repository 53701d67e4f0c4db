package router

import (
	"errors"
	"math"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestSelectAgreesWithRoute: with loads built up by routed requests, Score's scores equal
// Match's, Select chooses what Route would choose (temperature 0), and Book books what Route
// would have: the next request, routed or selected, sees the same load either way.
func TestSelectAgreesWithRoute(t *testing.T) {
	a, b := fleet(t, 8), fleet(t, 8)
	var resp wire.RouteResponse
	var sel Selection
	for i := range 40 {
		toks := familyPrompt(1 + i%5)[:16*(20+i%9)+i%16]
		req := wire.RouteRequest{RequestID: "r" + string(rune('a'+i)), Model: "m", Tokens: toks}

		if err := a.Match(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if err := b.Score(&req, SelectOptions{}, &sel); err != nil {
			t.Fatal(err)
		}
		if sel.HasChosen || len(sel.Scores) != len(resp.Candidates) {
			t.Fatalf("request %d: Score %+v, Match %d candidates", i, sel, len(resp.Candidates))
		}
		for j, c := range resp.Candidates {
			s := sel.Scores[j]
			if s.Worker != (radix.WorkerKey{ID: c.Worker, Rank: c.Rank}) || uint32(s.Cached) != c.CachedBlocks ||
				uint32(s.PrefillTokens) != c.PrefillTokens || uint32(s.DecodeBlocks) != c.ActiveBlocks || s.Logit != c.Logit {
				t.Fatalf("request %d candidate %d: Score %+v, Match %+v", i, j, s, c)
			}
		}

		if err := a.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if err := b.Select(&req, SelectOptions{}, &sel); err != nil {
			t.Fatal(err)
		}
		// Both choose a cheapest worker; workers tied for it are drawn at random by each.
		var routed wire.Candidate
		for _, c := range resp.Candidates {
			if c.Worker == resp.Worker && c.Rank == resp.Rank {
				routed = c
			}
		}
		if !sel.HasChosen || sel.Chosen.Logit != routed.Logit {
			t.Fatalf("request %d: Select chose %+v, Route %+v", i, sel.Chosen, routed)
		}
		for _, s := range sel.Scores {
			if s.Logit < sel.Chosen.Logit {
				t.Fatalf("request %d: Select chose %+v over the cheaper %+v", i, sel.Chosen, s)
			}
		}
		if want := int64(len(toks)) - int64(sel.Chosen.Cached)*16; sel.Prefill != want || sel.ISL != len(toks) || sel.Blocks != len(toks)/16 {
			t.Fatalf("request %d: prefill %d isl %d blocks %d, want %d %d %d", i, sel.Prefill, sel.ISL, sel.Blocks, want, len(toks), len(toks)/16)
		}
		// The same worker as a's, so that both routers carry the same load.
		w := radix.WorkerKey{ID: resp.Worker, Rank: resp.Rank}
		if err := b.Book("m", w, req.RequestID, sel.Seqs, int64(len(toks))-int64(resp.Cached)*16); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			for _, r := range []*Router{a, b} {
				if err := r.PrefillDone(req.RequestID); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	wa, wb := a.Workers(), b.Workers()
	for i := range wa {
		if wa[i].ActiveBlocks != wb[i].ActiveBlocks || wa[i].ActivePrefill != wb[i].ActivePrefill || wa[i].ActiveRequests != wb[i].ActiveRequests {
			t.Fatalf("worker %d: routed load %+v, booked load %+v", wa[i].ID, wa[i], wb[i])
		}
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Routed != sb.Routed || sa.ActiveRequests != sb.ActiveRequests {
		t.Fatalf("stats: routed %+v, booked %+v", sa, sb)
	}
}

// TestSelectRefusesAsMatch: Score and Select refuse the requests Match refuses, with the same
// errors.
func TestSelectRefusesAsMatch(t *testing.T) {
	r := fleet(t, 2)
	nan := math.NaN()
	f := func(req wire.RouteRequest) {
		t.Helper()
		var resp wire.RouteResponse
		var sel Selection
		want := r.Match(&req, &resp)
		if want == nil {
			t.Fatalf("%+v: Match accepts it", req)
		}
		for _, got := range []error{r.Score(&req, SelectOptions{}, &sel), r.Select(&req, SelectOptions{}, &sel)} {
			if got == nil || got.Error() != want.Error() || !errors.Is(got, errors.Unwrap(want)) {
				t.Fatalf("%+v: %v, want %v", req, got, want)
			}
		}
	}
	toks := familyPrompt(1)[:40]
	f(wire.RouteRequest{Model: "other", Tokens: toks})
	f(wire.RouteRequest{Model: "m"})
	f(wire.RouteRequest{Model: "m", Tokens: toks, ISL: 41})
	f(wire.RouteRequest{Model: "m", ByHash: true})
	f(wire.RouteRequest{Model: "m", ByHash: true, Hashes: []uint64{1, 2}, ISL: 31})
	f(wire.RouteRequest{Model: "m", Tokens: toks, HasWeight: true, Weight: -1})
	f(wire.RouteRequest{Model: "m", Tokens: toks, HasTemperature: true, Temperature: nan})
	f(wire.RouteRequest{Model: "m", Tokens: toks, Mode: wire.ModeDirect})
	f(wire.RouteRequest{Model: "m", Tokens: toks, Mode: 99})
	f(wire.RouteRequest{Model: "m", Tokens: toks, HasPinned: true, PinnedWorker: 9})
	f(wire.RouteRequest{Model: "m", Tokens: toks, Allowed: []uint64{9}})
}

// TestSelectHashedPrefix: block hashes may be a longer prompt's prefix (Dynamo's isl_tokens),
// which /v1/route refuses: the tokens past the blocks count as uncached prefill.
func TestSelectHashedPrefix(t *testing.T) {
	r := fleet(t, 2)
	req := wire.RouteRequest{Model: "m", ByHash: true, Hashes: []uint64{1, 2}, ISL: 48}
	var resp wire.RouteResponse
	if err := r.Match(&req, &resp); err == nil {
		t.Fatal("Match accepts an ISL past the blocks' last")
	}
	var sel Selection
	if err := r.Score(&req, SelectOptions{}, &sel); err != nil || sel.ISL != 48 {
		t.Fatalf("Score: ISL %d, %v; want 48", sel.ISL, err)
	}
}

// TestSelectTrackPrefill: the per-request override charges (or not) the request's own uncached
// tokens, whatever the Router's configuration.
func TestSelectTrackPrefill(t *testing.T) {
	r := fleet(t, 2)
	toks := append(familyPrompt(1), seq(9_000_000, 2*16+3)...) // 128 blocks cached on worker 1, 2 more and 3 tokens not
	var on, off, def Selection
	yes, no := true, false
	req := wire.RouteRequest{Model: "m", Tokens: toks}
	for _, c := range []struct {
		o   SelectOptions
		sel *Selection
	}{{SelectOptions{TrackPrefill: &yes}, &on}, {SelectOptions{TrackPrefill: &no}, &off}, {SelectOptions{}, &def}} {
		if err := r.Select(&req, c.o, c.sel); err != nil {
			t.Fatal(err)
		}
	}
	if !on.TrackPrefill || on.Prefill != 2*16+3 || on.Chosen.PrefillTokens != 2*16+3 {
		t.Fatalf("tracked: %+v", on.Chosen)
	}
	if off.TrackPrefill || off.Prefill != 0 || off.Chosen.PrefillTokens != 0 || off.Chosen.Logit >= on.Chosen.Logit {
		t.Fatalf("not tracked: %+v, tracked %+v", off.Chosen, on.Chosen)
	}
	if !def.TrackPrefill || def.Prefill != on.Prefill {
		t.Fatalf("the Router's default (tracked): %+v", def)
	}
}

// TestBook: a booking on a named worker counts in its load and in the next route's costs, is
// shared with the other replicas, refuses a duplicate id and what is not registered, and
// Booked follows it to its completion.
func TestBook(t *testing.T) {
	share := &fakeSharer{}
	r := sharedFleet(t, Config{Share: share})
	w2 := radix.WorkerKey{ID: 2}
	seqs := []uint64{11, 22, 33}
	if r.Booked("b1") {
		t.Fatal("b1 booked before Book")
	}
	if err := r.Book("m", w2, "b1", seqs, 40); err != nil {
		t.Fatal(err)
	}
	if !r.Booked("b1") {
		t.Fatal("b1 not booked after Book")
	}
	for _, w := range r.Workers() {
		want := WorkerInfo{ActiveBlocks: 0}
		if w.ID == 2 {
			want = WorkerInfo{ActiveBlocks: 3, ActivePrefill: 40, ActiveRequests: 1}
		}
		if w.ActiveBlocks != want.ActiveBlocks || w.ActivePrefill != want.ActivePrefill || w.ActiveRequests != want.ActiveRequests {
			t.Fatalf("worker %d: %+v, want the booking's load %+v", w.ID, w, want)
		}
	}
	var resp wire.RouteResponse
	if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: prompt(0)}, &resp); err != nil {
		t.Fatal(err)
	}
	if c := resp.Candidates[1]; c.Worker != 2 || c.ActiveBlocks != 3+8 {
		t.Fatalf("a match after the booking: worker 2 %+v, want 3 active blocks + 8", c)
	}
	calls := share.take()
	if len(calls) != 1 || calls[0].op != "booked" || calls[0].id != "b1" || calls[0].worker != w2 || calls[0].prefill != 40 || len(calls[0].seqs) != 3 {
		t.Fatalf("shared: %+v", calls)
	}
	if r.Stats().Routed != 1 {
		t.Fatalf("a booking counts as routed: %+v", r.Stats())
	}
	f := func(model string, w radix.WorkerKey, id string, prefill int64, want error) {
		t.Helper()
		if err := r.Book(model, w, id, seqs, prefill); !errors.Is(err, want) {
			t.Fatalf("Book(%q, %+v, %q, %d): %v, want %v", model, w, id, prefill, err, want)
		}
	}
	f("m", w2, "b1", 0, ErrConflict)
	f("m", radix.WorkerKey{ID: 2, Rank: 1}, "b2", 0, ErrUnknownWorker)
	f("m", radix.WorkerKey{ID: 9}, "b2", 0, ErrUnknownWorker)
	f("x", w2, "b2", 0, ErrUnknownModel)
	f("m", w2, "", 0, ErrInvalid)
	f("m", w2, "\x00x", 0, ErrInvalid)
	f("m", w2, "b2", -1, ErrInvalid)
	if len(share.take()) != 0 {
		t.Fatal("refused bookings were shared")
	}
	if err := r.Complete("b1"); err != nil {
		t.Fatal(err)
	}
	if r.Booked("b1") || r.Stats().ActiveRequests != 0 {
		t.Fatalf("b1 still booked after Complete: %+v", r.Stats())
	}
}
