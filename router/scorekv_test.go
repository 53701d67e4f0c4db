package router

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestScoreKVMatchesGeneral routes and matches random requests on random fleets, with requests in
// flight, once on the kv path (scoreKV) and once on the general path, and checks that the answers are
// identical: the same chosen worker (with the same random source), the same candidates in the
// same order, the same numbers to the bit. The fleets are built for ties: few prompt families,
// cached prefixes of a few lengths, weight 0 in some rounds (every idle worker costs the same).
// Some rounds have few workers and many requests in flight (each worker's active blocks then go
// to its map), some a second model whose busy workers share the tracker, some prompts deeper than
// the kv path's cost table.
func TestScoreKVMatchesGeneral(t *testing.T) {
	const bs = 4
	for round := range 48 {
		rng := rand.New(rand.NewPCG(uint64(round), 3))
		pcg := rand.NewPCG(0, 0)
		cfg := Config{Shards: 2, NoTrackPrefill: rng.IntN(2) == 0, Logger: quiet(), Rand: rand.New(pcg)}
		switch rng.IntN(4) {
		case 0:
			cfg.NoOverlapWeight = true
		case 1:
			cfg.OverlapWeight = 0.37
		case 2:
			cfg.OverlapWeight = 4
		}
		// The clock steps with the test, so that both answers to a request see one time.
		var clock atomic.Int64
		clock.Store(1)
		cfg.Now = clock.Load
		switch rng.IntN(3) {
		case 0: // Dynamo main's cost, its terms at random
			pick := func(v ...float64) float64 { return v[rng.IntN(len(v))] }
			cfg.Cost = scoring.CostMain
			cfg.Terms = &scoring.Terms{Credit: pick(1, 0.5, 0), CreditDecay: pick(0, 0.5, 3),
				LoadScale: pick(1, 2, 0.3), RequestWeight: pick(0, 0.5, 3)}
		case 1: // the predicted time to first token, small steps so that prefill queues
			cfg.Cost = scoring.CostTTFT
			st := scoring.DefaultStepModel()
			st.MaxBatched, st.Capacity = int64(4+rng.IntN(40)), int64(rng.IntN(200))
			cfg.Step, cfg.CacheWeight = &st, []float64{0, -1, 0.5}[rng.IntN(3)]
		}
		cfg.NoAssumeReuse = rng.IntN(4) == 0
		cfg.TrackOutputBlocks = rng.IntN(2) == 0
		r := New(cfg)
		families := 1 + rng.IntN(4)
		prompt := func(fam, blocks int) []uint32 {
			toks := seq(0, min(blocks, 2)*bs) // a prefix every family shares
			return append(toks, seq(1000*(fam+1), max(blocks-2, 0)*bs)...)
		}
		n, steps, keep := 2+rng.IntN(60), 60, 2
		if round%3 == 1 {
			n, steps, keep = 2+rng.IntN(3), 160, 12 // requests pile up on few workers
		}
		long := round%8 == 5 // two workers hold, and requests ask for, more than maxCostTable blocks
		other := round%2 == 0
		event := uint64(0)
		for id := uint64(1); id <= uint64(n); id++ {
			if other && rng.IntN(3) == 0 { // another model's workers, between this one's slots
				if err := r.Register(Registration{ID: 1000 + id, Model: "o", BlockSize: bs}); err != nil {
					t.Fatal(err)
				}
			}
			ranks := []uint32{0}
			if rng.IntN(5) == 0 {
				ranks = []uint32{0, 1}
			}
			if err := r.Register(Registration{ID: id, Model: "m", BlockSize: bs, Ranks: ranks}); err != nil {
				t.Fatal(err)
			}
			for _, rank := range ranks {
				held := []int{0, 2, 2, 5, 8, 12}[rng.IntN(6)]
				if long && id <= 2 {
					held = maxCostTable + 100 // two idle workers tie beyond the cost table
				}
				if held == 0 {
					continue
				}
				hashes := make([]uint64, held)
				for i := range hashes {
					hashes[i] = uint64(i + 1)
				}
				fam := rng.IntN(families)
				if long && id <= 2 {
					fam = 0
				}
				event++
				b := &wire.EventBatch{Worker: id, Model: "m", Events: []kvevent.Event{{
					Kind: kvevent.Stored, ID: event, Rank: rank, Hashes: hashes, Tokens: prompt(fam, held),
				}}}
				if oc, err := r.ApplyEvents(b, nil); err != nil || oc[0].Status != shard.OK {
					t.Fatalf("events: %v %v", oc, err)
				}
			}
		}
		if other { // and one whose slot is above every worker of m
			if err := r.Register(Registration{ID: 2000, Model: "o", BlockSize: bs}); err != nil {
				t.Fatal(err)
			}
		}
		workers := len(r.ModelWorkers("m"))
		var inFlight []string
		// Reused across steps, as the server reuses them: a stale answer must not leak in.
		var msg []byte
		var scratchResp wire.RouteResponse
		for step := range steps {
			clock.Add(int64(rng.IntN(3)) * 1e6)
			if other && len(r.ModelWorkers("o")) > 0 && rng.IntN(4) == 0 { // busy workers of model o
				id := fmt.Sprintf("o%d", step)
				if err := r.Route(&wire.RouteRequest{RequestID: id, Model: "o", Tokens: prompt(0, 3)}, &wire.RouteResponse{}); err != nil {
					t.Fatal(err)
				}
			}
			req := wire.RouteRequest{Model: "m", MaxCandidates: uint16(rng.IntN(workers + 2))} // 0 and ≥ workers: all
			blocks := 1 + rng.IntN(14)
			fam := rng.IntN(families)
			if long && rng.IntN(2) == 0 {
				// Every worker answered, so that the records' loop for depths beyond the table runs.
				blocks, fam, req.MaxCandidates = maxCostTable+50+rng.IntN(100), 0, 0
			}
			req.Tokens = prompt(fam, blocks)
			req.Tokens = append(req.Tokens, seq(5000*step, rng.IntN(bs))...) // a partial block
			if rng.IntN(3) == 0 {
				req.Tokens[len(req.Tokens)-1] ^= 1 << 20 // a tail of its own
			}
			if rng.IntN(4) == 0 {
				req.HasWeight, req.Weight = true, []float64{0, 0.5, 2}[rng.IntN(3)]
			}
			// Dynamo's router_config_override members, now and then.
			req.TrackPrefill = wire.Opt(rng.IntN(3))
			req.AssumeReuse = wire.Opt(rng.IntN(3))
			req.ExpectedOSL = uint32([]int{0, 20}[rng.IntN(2)])
			if rng.IntN(4) == 0 {
				req.HasCredit, req.OverlapCredit = true, []float64{0, 0.25, 1}[rng.IntN(3)]
			}
			if rng.IntN(4) == 0 {
				req.HasLoadScale, req.PrefillLoadScale = true, []float64{0, 1.5}[rng.IntN(2)]
			}
			var fast, slow wire.RouteResponse
			// The fast answer is encoded (AppendRoute) in half the steps: then it must be the
			// bytes of the general answer's encoding, and decode to it.
			encode := rng.IntN(2) == 0
			answer := func(general bool, resp *wire.RouteResponse, book bool) {
				r.general = general
				pcg.Seed(uint64(step), uint64(round))
				var err error
				switch {
				case encode && !general && book:
					msg, err = r.AppendRoute(append(msg[:0], "xy"...), &req, &scratchResp)
				case encode && !general:
					msg, err = r.AppendMatch(append(msg[:0], "xy"...), &req, &scratchResp)
				case book:
					err = r.Route(&req, resp)
				default:
					err = r.Match(&req, resp)
				}
				if err != nil {
					t.Fatalf("round %d step %d (general %v): %v", round, step, general, err)
				}
				if encode && !general {
					if string(msg[:2]) != "xy" {
						t.Fatalf("round %d step %d: AppendRoute overwrote dst", round, step)
					}
					if err := wire.DecodeRouteResponse(msg[2:], resp); err != nil {
						t.Fatalf("round %d step %d: the encoded answer does not decode: %v", round, step, err)
					}
					resp.Cached = scratchResp.Cached // not in the format
					resp.PredictedTTFT = scratchResp.PredictedTTFT
				}
			}
			book := rng.IntN(3) != 0
			if book {
				req.RequestID = fmt.Sprintf("r%d", step)
				answer(false, &fast, true)
				if err := r.Complete(req.RequestID); err != nil {
					t.Fatal(err)
				}
				answer(true, &slow, true)
				inFlight = append(inFlight, req.RequestID)
			} else {
				answer(false, &fast, false)
				answer(true, &slow, false)
			}
			// A request with one of Dynamo's weights is scored by Dynamo's formula.
			dynamo := req.HasWeight || req.HasCredit || req.HasLoadScale
			if book && cfg.Cost == scoring.CostTTFT && !dynamo && !(fast.PredictedTTFT > 0) {
				t.Fatalf("round %d step %d: a CostTTFT route predicts no TTFT: %+v", round, step, fast)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("round %d step %d (%d workers, cap %d, book %v, encoded %v):\nscoreKV %+v\ngeneral %+v",
					round, step, workers, req.MaxCandidates, book, encode, fast, slow)
			}
			if encode && !bytes.Equal(msg[2:], wire.AppendRouteResponse(nil, &slow)) {
				t.Fatalf("round %d step %d: the encoded answer differs from the general answer's encoding", round, step)
			}
			if len(inFlight) > 0 && rng.IntN(3) == 0 { // output grows a request's blocks
				_ = r.OutputTokens(inFlight[rng.IntN(len(inFlight))], int64(rng.IntN(40)))
			}
			if len(inFlight) > 0 && rng.IntN(keep) == 0 {
				k := rng.IntN(len(inFlight))
				if rng.IntN(2) == 0 {
					_ = r.PrefillDone(inFlight[k])
				} else {
					_ = r.Complete(inFlight[k])
					inFlight = slices.Delete(inFlight, k, k+1)
				}
			}
			if keep > 2 && step >= steps/2 && len(inFlight) > 0 { // the pile drains again
				_ = r.Complete(inFlight[0])
				inFlight = inFlight[1:]
			}
		}
		r.Close()
	}
}
