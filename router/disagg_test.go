package router

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// disaggFleet is a Router of model "m" (block size 16) with workers 1.. in the roles given.
func disaggFleet(t testing.TB, cfg Config, roles ...Role) *Router {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	cfg.Shards = 1
	r := New(cfg)
	t.Cleanup(r.Close)
	for i, role := range roles {
		if err := r.Register(Registration{ID: uint64(i + 1), Model: "m", BlockSize: 16, Role: role}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// store makes worker hold the first n blocks of toks.
func store(t testing.TB, r *Router, worker uint64, toks []uint32, n int) {
	t.Helper()
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = worker<<32 | uint64(i+1)
	}
	b := &wire.EventBatch{Worker: worker, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: uint64(n), Hashes: hashes, Tokens: toks[:16*n]}}}
	if oc, err := r.ApplyEvents(b, nil); err != nil || oc[0].Status != shard.OK {
		t.Fatalf("events: %v %v", oc, err)
	}
}

// load is a worker's booked load: active prefill tokens, active blocks, active requests.
type load struct{ prefill, blocks, requests int64 }

func loads(r *Router) map[uint64]load {
	out := map[uint64]load{}
	for _, w := range r.Workers() {
		l := out[w.ID]
		l.prefill += w.ActivePrefill
		l.blocks += w.ActiveBlocks
		l.requests += w.ActiveRequests
		out[w.ID] = l
	}
	return out
}

func disaggReq(id string, toks []uint32) *wire.RouteRequest {
	return &wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks, Disagg: true}
}

// TestDisaggTwoPicks: a disaggregated request gets a prefill worker by KV cost (the one holding
// its prefix, among prefill workers only), booked with its uncached tokens and no blocks, and a
// decode worker by load alone (the idle one, though the other holds the whole prompt), booked
// with its blocks and no prefill. Its answer names both, in Go and in the binary format.
func TestDisaggTwoPicks(t *testing.T) {
	r := disaggFleet(t, Config{}, RolePrefill, RolePrefill, RoleDecode, RoleDecode)
	toks := seq(0, 40*16+5) // 40 full blocks
	store(t, r, 2, toks, 30)
	store(t, r, 3, toks, 40)
	// Load decode worker 3 with a request of its own, served whole (pinned).
	other := &wire.RouteRequest{RequestID: "other", Model: "m", Tokens: seq(50000, 32), HasPinned: true, PinnedWorker: 3}
	var resp wire.RouteResponse
	if err := r.Route(other, &resp); err != nil || resp.Worker != 3 {
		t.Fatalf("pinned: %d %v", resp.Worker, err)
	}
	before := loads(r)

	if err := r.Route(disaggReq("a", toks), &resp); err != nil {
		t.Fatal(err)
	}
	if !resp.Chosen || !resp.Prefill || resp.PrefillWorker != 2 || resp.Worker != 4 {
		t.Fatalf("answer: prefill %v on %d, decode on %d", resp.Prefill, resp.PrefillWorker, resp.Worker)
	}
	if resp.Cached != 30 {
		t.Errorf("cached %d, want the prefill worker's 30", resp.Cached)
	}
	for _, c := range resp.Candidates {
		if c.Worker == 1 || c.Worker == 2 {
			t.Errorf("a prefill worker among the decode stage's candidates: %+v", c)
		}
	}
	got := loads(r)
	// Prefill stage: 645 − 30×16 = 165 tokens to prefill, no blocks. Decode stage: 40 blocks.
	if d := got[2]; d != (load{165, 0, 1}) {
		t.Errorf("prefill worker 2: %+v, want 165 prefill tokens, no blocks, 1 request", d)
	}
	if d := got[4]; d != (load{0, 40, 1}) {
		t.Errorf("decode worker 4: %+v, want 40 blocks and nothing to prefill", d)
	}
	if got[1] != before[1] || got[3] != before[3] {
		t.Errorf("other workers' load changed: %+v → %+v", before, got)
	}
	if r.tracker.Active() != 2 || r.tracker.Stages() != 1 {
		t.Errorf("active %d, stages %d: want 2 requests and 1 prefill stage", r.tracker.Active(), r.tracker.Stages())
	}
	if d := r.DisaggDecisions(); d[DisaggDisaggregated] != 1 {
		t.Errorf("decisions %v", d)
	}

	// The binary path answers the same, with the prefill trailer.
	in := wire.AppendRouteRequest(nil, disaggReq("b", toks))
	var req wire.RouteRequest
	if err := wire.DecodeRouteRequest(in, &req); err != nil {
		t.Fatal(err)
	}
	out, err := r.AppendRoute(nil, &req, &resp)
	if err != nil {
		t.Fatal(err)
	}
	var dec wire.RouteResponse
	if err := wire.DecodeRouteResponse(out, &dec); err != nil {
		t.Fatal(err)
	}
	if !dec.Prefill || dec.PrefillWorker != 2 || dec.Worker == 1 || dec.Worker == 2 {
		t.Fatalf("binary answer: %+v", dec)
	}
	// A match ignores Disagg: every worker, nothing chosen.
	if err := r.Match(disaggReq("", toks), &resp); err != nil || resp.Prefill || resp.Chosen || len(resp.Candidates) != 4 {
		t.Fatalf("match: %+v %v", resp, err)
	}
	// A request without Disagg is served whole, on the decode worker holding the prompt.
	if err := r.Route(&wire.RouteRequest{RequestID: "c", Model: "m", Tokens: toks}, &resp); err != nil || resp.Prefill || resp.Worker != 3 {
		t.Fatalf("aggregated: worker %d prefill %v %v", resp.Worker, resp.Prefill, err)
	}
}

// TestDisaggDecodeBlocksUnshared: the decode stage books its blocks under hashes of its own
// (Dynamo books the decode stage with random hashes), so two split requests for the same prompt
// charge the decode worker twice, where two whole requests for it share their blocks.
func TestDisaggDecodeBlocksUnshared(t *testing.T) {
	r := disaggFleet(t, Config{}, RolePrefill, RoleDecode)
	toks := seq(0, 10*16)
	var resp wire.RouteResponse
	for _, id := range []string{"a", "b"} {
		if err := r.Route(disaggReq(id, toks), &resp); err != nil || resp.PrefillWorker != 1 || resp.Worker != 2 {
			t.Fatalf("%s: %+v %v", id, resp, err)
		}
	}
	if d := loads(r)[2]; d.blocks != 20 || d.requests != 2 {
		t.Errorf("decode worker after two split requests: %+v, want 20 blocks (10 each, unshared)", d)
	}
	whole := disaggFleet(t, Config{}, RoleDecode)
	for _, id := range []string{"a", "b"} {
		if err := whole.Route(&wire.RouteRequest{RequestID: id, Model: "m", Tokens: toks}, &resp); err != nil {
			t.Fatal(err)
		}
	}
	if d := loads(whole)[1]; d.blocks != 10 || d.requests != 2 {
		t.Errorf("worker after two whole requests: %+v, want their 10 shared blocks", d)
	}
}

// TestDisaggLifecycle: PrefillDone releases the prefill stage whole and the decode stage's
// prefill; Complete releases both (whether PrefillDone came or not); expiry releases both.
func TestDisaggLifecycle(t *testing.T) {
	var now atomic.Int64
	r := disaggFleet(t, Config{RequestExpiry: time.Minute, Now: now.Load}, RolePrefill, RoleDecode)
	toks := seq(0, 10*16)
	var resp wire.RouteResponse
	if err := r.Route(disaggReq("a", toks), &resp); err != nil || resp.PrefillWorker != 1 || resp.Worker != 2 {
		t.Fatalf("%+v %v", resp, err)
	}
	if got := loads(r); got[1] != (load{160, 0, 1}) || got[2] != (load{0, 10, 1}) {
		t.Fatalf("booked: %+v", got)
	}
	if err := r.PrefillDone("a"); err != nil {
		t.Fatal(err)
	}
	if got := loads(r); got[1] != (load{}) || got[2] != (load{0, 10, 1}) {
		t.Fatalf("after PrefillDone: %+v", got)
	}
	if err := r.PrefillDone("a"); err != nil { // a second one is harmless, as before
		t.Fatal(err)
	}
	if err := r.Complete("a"); err != nil {
		t.Fatal(err)
	}
	if got := loads(r); got[1] != (load{}) || got[2] != (load{}) || r.tracker.Active() != 0 || r.tracker.Stages() != 0 {
		t.Fatalf("after Complete: %+v", got)
	}
	if err := r.Complete("a"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("completed twice: %v", err)
	}

	// Complete without PrefillDone.
	if err := r.Route(disaggReq("b", toks), &resp); err != nil {
		t.Fatal(err)
	}
	if err := r.Complete("b"); err != nil {
		t.Fatal(err)
	}
	if got := loads(r); got[1] != (load{}) || got[2] != (load{}) || r.tracker.Stages() != 0 {
		t.Fatalf("Complete alone: %+v", got)
	}
	// The id is free again for both stages.
	if err := r.Route(disaggReq("b", toks), &resp); err != nil {
		t.Fatal(err)
	}
	if err := r.Route(disaggReq("b", toks), &resp); !errors.Is(err, ErrConflict) {
		t.Fatalf("a duplicate id: %v", err)
	}
	if got := loads(r); got[1] != (load{160, 0, 1}) || got[2] != (load{0, 10, 1}) {
		t.Fatalf("the refused duplicate left load: %+v", got)
	}

	// Expiry.
	now.Add(int64(2 * time.Minute))
	if n := r.ExpireRequests(); n != 2 {
		t.Fatalf("expired %d bookings, want both stages", n)
	}
	if got := loads(r); got[1] != (load{}) || got[2] != (load{}) || r.tracker.Active() != 0 || r.tracker.Stages() != 0 {
		t.Fatalf("after expiry: %+v", got)
	}
	if err := r.PrefillDone("b"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("PrefillDone after expiry: %v", err)
	}
}

// TestDisaggFallback: without a prefill worker a disaggregated request is served whole, on the
// serve pool, and counted as a fallback; under Enforce it is refused with ErrNoPrefill,
// counted, and nothing is booked. Prefill workers outside the request's allowed workers count
// as none.
func TestDisaggFallback(t *testing.T) {
	toks := seq(0, 4*16)
	for _, enforce := range []bool{false, true} {
		r := disaggFleet(t, Config{Disagg: &DisaggConfig{Enforce: enforce}}, RoleDecode, RoleBoth)
		// A caller asks for a split only when it can matter (the front door does).
		if r.Disaggregates("m") != enforce || r.Disaggregates("other") != enforce {
			t.Fatalf("enforce %v: Disaggregates says %v, %v without a prefill worker", enforce, r.Disaggregates("m"), r.Disaggregates("other"))
		}
		var resp wire.RouteResponse
		err := r.Route(disaggReq("a", toks), &resp)
		d := r.DisaggDecisions()
		if enforce {
			var fe *FieldError
			if !errors.Is(err, ErrNoPrefill) || !errors.As(err, &fe) || fe.Field != "model" {
				t.Fatalf("enforced: %v", err)
			}
			if d[DisaggRefused] != 1 || r.tracker.Active() != 0 {
				t.Fatalf("enforced: decisions %v, %d active", d, r.tracker.Active())
			}
		} else {
			if err != nil || resp.Prefill || !resp.Chosen {
				t.Fatalf("fallback: %+v %v", resp, err)
			}
			if d[DisaggFallback] != 1 || loads(r)[resp.Worker] != (load{64, 4, 1}) {
				t.Fatalf("fallback: decisions %v, loads %+v", d, loads(r))
			}
		}
		// A prefill worker joins: the request is split. It leaves: back to the fallback.
		if err := r.Register(Registration{ID: 3, Model: "m", Role: RolePrefill}); err != nil {
			t.Fatal(err)
		}
		if !r.Disaggregates("m") {
			t.Fatal("Disaggregates is false with a prefill worker")
		}
		if err := r.Route(disaggReq("b", toks), &resp); err != nil || !resp.Prefill || resp.PrefillWorker != 3 {
			t.Fatalf("with a prefill worker: %+v %v", resp, err)
		}
		req := disaggReq("c", toks)
		req.Allowed = []uint64{1, 2}
		err = r.Route(req, &resp)
		if enforce != errors.Is(err, ErrNoPrefill) || err == nil && resp.Prefill {
			t.Fatalf("prefill worker not allowed: %+v %v", resp, err)
		}
		if err := r.Unregister(3); err != nil {
			t.Fatal(err)
		}
		err = r.Route(disaggReq("d", toks), &resp)
		if enforce != errors.Is(err, ErrNoPrefill) || err == nil && resp.Prefill {
			t.Fatalf("prefill worker gone: %+v %v", resp, err)
		}
		// PrefillDone and Complete of the split request, whose prefill worker left, still
		// release what is left of it.
		if err := r.Complete("b"); err != nil {
			t.Fatal(err)
		}
	}
}

// conditional routes one disaggregated request of isl tokens with the decode worker (worker 2)
// holding cached blocks of it, on a fresh router with a prefill worker (1) and cfg, and reports
// whether it was split.
func conditional(t *testing.T, cfg DisaggConfig, isl, cached int) bool {
	t.Helper()
	r := disaggFleet(t, Config{Disagg: &cfg}, RolePrefill, RoleDecode)
	toks := seq(0, isl)
	if cached > 0 {
		store(t, r, 2, toks, cached)
	}
	var resp wire.RouteResponse
	if err := r.Route(disaggReq("a", toks), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Worker != 2 {
		t.Fatalf("decode worker %d", resp.Worker)
	}
	d := r.DisaggDecisions()
	if resp.Prefill {
		if d[DisaggDisaggregated] != 1 {
			t.Fatalf("split, decisions %v", d)
		}
		return true
	}
	// Kept whole: booked on the decode worker with its cache credit, prefilling the rest.
	if d[DisaggBypassed] != 1 || loads(r)[2].prefill != int64(isl-16*cached) {
		t.Fatalf("bypassed: decisions %v, loads %+v", d, loads(r))
	}
	return false
}

// TestConditionalISLBounding holds isl_bounding to Dynamo's rule at its edges, worked by hand
// with its defaults (2,048 tokens, 0.7), blocks of 16 tokens: a request is kept whole when
// eff = prompt − cached tokens on the decode worker is below 2,048 and eff / prompt below 0.7.
func TestConditionalISLBounding(t *testing.T) {
	cfg := DisaggConfig{Policy: DisaggISLBounding}
	for _, c := range []struct {
		isl, cached int
		split       bool
	}{
		{4096, 128, true},  // eff 2048: not below the threshold
		{4096, 129, false}, // eff 2032, ratio 0.496
		{2560, 48, true},   // eff 1792, ratio exactly 0.7: not below it
		{2560, 49, false},  // eff 1776, ratio 0.69375
		{2560, 33, true},   // eff 2032 < 2048, but ratio 0.79375
		{100, 0, true},     // short, but nothing cached: ratio 1
		{1000, 62, false},  // eff 8: short and cached
	} {
		if got := conditional(t, cfg, c.isl, c.cached); got != c.split {
			t.Errorf("isl %d, %d blocks cached: split %v, want %v", c.isl, c.cached, got, c.split)
		}
	}
	// Thresholds of one's own.
	cfg = DisaggConfig{Policy: DisaggISLBounding, EffISLThreshold: 512, EffISLRatioThreshold: 0.5}
	if conditional(t, cfg, 2000, 94) { // eff 2000 − 1504 = 496, ratio 0.248
		t.Error("eff 496, ratio 0.248 under 512 and 0.5: split")
	}
	if !conditional(t, cfg, 2000, 93) { // eff 512: not below 512
		t.Error("eff 512 under a threshold of 512: kept whole")
	}
}

// TestConditionalPrefillLoad: prefill_load keeps a request whole once the prefill worker the
// router would pick has more than threshold × its max batched tokens active (Dynamo's
// prefill_load_exceeds: strictly more). Threshold 0.5 of 1,000 tokens: busy above 500.
func TestConditionalPrefillLoad(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet(), Disagg: &DisaggConfig{Policy: DisaggPrefillLoad, PrefillBusyThreshold: 0.5, HasPrefillBusyThreshold: true}})
	t.Cleanup(r.Close)
	if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 16, Role: RolePrefill, MaxTokens: 1000}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(Registration{ID: 2, Model: "m", Role: RoleDecode}); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	// 250 prompt tokens each, with 0, 250, 500 (not above 500) and 750 active before.
	for i, want := range []bool{true, true, true, false} {
		if err := r.Route(disaggReq(fmt.Sprint(i), seq(1000*i, 250)), &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Prefill != want {
			t.Fatalf("request %d with %d prefill tokens active: split %v, want %v", i, loads(r)[1].prefill, resp.Prefill, want)
		}
	}
	if got := loads(r)[1].prefill; got != 750 {
		t.Fatalf("prefill worker: %d tokens, want 750", got)
	}
	// A prefill done frees the prefill worker: split again.
	if err := r.PrefillDone("0"); err != nil {
		t.Fatal(err)
	}
	if err := r.Route(disaggReq("x", seq(90000, 250)), &resp); err != nil || !resp.Prefill {
		t.Fatalf("after a prefill done: %+v %v", resp, err)
	}
	if d := r.DisaggDecisions(); d[DisaggDisaggregated] != 4 || d[DisaggBypassed] != 1 {
		t.Fatalf("decisions %v", d)
	}
}

// TestConditionalISLOrLoad: either condition keeps a request whole.
func TestConditionalISLOrLoad(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet(), Disagg: &DisaggConfig{Policy: DisaggISLOrLoad, PrefillBusyThreshold: 0.5, HasPrefillBusyThreshold: true}})
	t.Cleanup(r.Close)
	if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 16, Role: RolePrefill, MaxTokens: 4000}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(Registration{ID: 2, Model: "m", Role: RoleDecode}); err != nil {
		t.Fatal(err)
	}
	long := seq(0, 3000)
	short := seq(100000, 1000)
	store(t, r, 2, short, 62) // eff 8: ISL says whole
	var resp wire.RouteResponse
	steps := []struct {
		id    string
		toks  []uint32
		split bool
	}{
		{"short-calm", short, false}, // ISL
		{"long-calm", long, true},    // neither: prefill 0 of 2000 allowed
		{"long-busy", long, false},   // 3000 active > 2000: load
		{"short-busy", short, false}, // both
	}
	for _, s := range steps {
		if err := r.Route(disaggReq(s.id, s.toks), &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Prefill != s.split {
			t.Fatalf("%s: split %v", s.id, resp.Prefill)
		}
	}
}

// TestConditionalDecodeGate: with decode_busy_threshold a bypass stands only if the decode
// worker's KV capacity is known and its blocks with the request's stay within the fraction.
func TestConditionalDecodeGate(t *testing.T) {
	cfg := DisaggConfig{Policy: DisaggISLBounding, DecodeBusyThreshold: 0.5, HasDecodeBusyThreshold: true}
	if !conditional(t, cfg, 1000, 62) {
		t.Error("capacity unknown: the gate let a bypass through")
	}
	for _, c := range []struct {
		capacity int64
		split    bool
	}{{124, false}, {123, true}} { // 62 blocks (prompt) ≤ 0.5 × 124; > 0.5 × 123
		r := New(Config{Shards: 1, Logger: quiet(), Disagg: &cfg})
		t.Cleanup(r.Close)
		if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 16, Role: RolePrefill}); err != nil {
			t.Fatal(err)
		}
		if err := r.Register(Registration{ID: 2, Model: "m", Role: RoleDecode, Capacity: c.capacity}); err != nil {
			t.Fatal(err)
		}
		toks := seq(0, 1000)
		store(t, r, 2, toks, 62)
		var resp wire.RouteResponse
		if err := r.Route(disaggReq("a", toks), &resp); err != nil || resp.Prefill != c.split {
			t.Errorf("capacity %d: split %v, want %v (%v)", c.capacity, resp.Prefill, c.split, err)
		}
	}
}

// TestDisaggShared: the other replicas learn of both stages: the prefill stage as a request of
// its own under its key, freed on PrefillDone, the decode stage under the request's id. A
// receiver applying them holds the same loads as the sender, through the lifecycle.
func TestDisaggShared(t *testing.T) {
	f := &fakeSharer{}
	a := disaggFleet(t, Config{Share: f}, RolePrefill, RoleDecode)
	b := disaggFleet(t, Config{}, RolePrefill, RoleDecode)
	apply := func() {
		t.Helper()
		for _, c := range f.take() {
			var err error
			switch c.op {
			case "booked":
				err = b.BookRemote("a", c.model, c.worker, c.id, c.seqs, c.prefill, c.ttl)
			case "prefill":
				err = b.PrefillDoneRemote("a", c.id)
			case "completed":
				err = b.CompleteRemote("a", c.id)
			}
			if err != nil {
				t.Fatalf("%s %q: %v", c.op, c.id, err)
			}
		}
		if la, lb := loads(a), loads(b); la[1] != lb[1] || la[2] != lb[2] {
			t.Fatalf("sender %+v, receiver %+v", la, lb)
		}
	}
	var resp wire.RouteResponse
	if err := a.Route(disaggReq("r", seq(0, 100)), &resp); err != nil || !resp.Prefill {
		t.Fatal(err)
	}
	apply()
	if got := loads(b); got[1] != (load{100, 0, 1}) || got[2] != (load{0, 6, 1}) {
		t.Fatalf("receiver: %+v", got)
	}
	if err := a.PrefillDone("r"); err != nil {
		t.Fatal(err)
	}
	apply()
	if err := a.Complete("r"); err != nil {
		t.Fatal(err)
	}
	apply()
	if got := loads(b); got[1] != (load{}) || got[2] != (load{}) {
		t.Fatalf("receiver after completion: %+v", got)
	}
	// Complete without PrefillDone frees both stages there too.
	if err := a.Route(disaggReq("s", seq(0, 100)), &resp); err != nil {
		t.Fatal(err)
	}
	apply()
	if err := a.Complete("s"); err != nil {
		t.Fatal(err)
	}
	apply()
}

// TestDisaggAllocs: a disaggregated route, its prefill done and its completion allocate
// nothing once warm, on the Go and the binary paths.
func TestDisaggAllocs(t *testing.T) {
	r := disaggFleet(t, Config{}, RolePrefill, RolePrefill, RoleDecode, RoleDecode)
	toks := seq(0, 40*16)
	store(t, r, 2, toks, 30)
	in := wire.AppendRouteRequest(nil, disaggReq("req-1", toks))
	var req wire.RouteRequest
	var resp wire.RouteResponse
	var out []byte
	step := func() {
		if err := wire.DecodeRouteRequest(in, &req); err != nil {
			t.Fatal(err)
		}
		var err error
		if out, err = r.AppendRoute(out[:0], &req, &resp); err != nil {
			t.Fatal(err)
		}
		if !resp.Prefill {
			t.Fatal("not split")
		}
		if err := r.PrefillDone(req.RequestID); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete(req.RequestID); err != nil {
			t.Fatal(err)
		}
	}
	allocFree(t, "a disaggregated route", step)
	r.cfg.Disagg = &DisaggConfig{Policy: DisaggISLBounding, EffISLThreshold: DefaultEffISLThreshold, EffISLRatioThreshold: DefaultEffISLRatioThreshold}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("a conditional disaggregated route allocates %v times per request", n)
	}
}

// TestDisaggQueue: the router queue holds a disaggregated request while every prefill worker is
// busy, whatever the decode workers' load, and admits it when a prefill done frees one; a
// request served whole waits on the serve pool alone, so a busy prefill pool holds nothing
// back from it.
func TestDisaggQueue(t *testing.T) {
	now := new(atomic.Int64)
	r := New(Config{Shards: 1, Logger: quiet(), Now: now.Load, Queue: &QueueConfig{Threshold: 0.5}})
	t.Cleanup(r.Close)
	for i, role := range []Role{RolePrefill, RoleDecode} {
		if err := r.Register(Registration{ID: uint64(i + 1), Model: "m", BlockSize: 16, MaxTokens: 100, Role: role}); err != nil {
			t.Fatal(err)
		}
	}
	var resp wire.RouteResponse
	// 96 prompt tokens on the prefill worker: busy (96 > 50). The decode worker books none.
	if tk, err := r.Enqueue(disaggReq("a", seq(0, 96)), &resp, func(*Ticket) {}); tk != nil || err != nil || !resp.Prefill {
		t.Fatalf("first: %v %v %+v", tk, err, resp)
	}
	admitted := make(chan *Ticket, 1)
	tk, err := r.Enqueue(disaggReq("b", seq(1000, 96)), new(wire.RouteResponse), func(t *Ticket) { admitted <- t })
	if err != nil || tk == nil {
		t.Fatalf("the second did not wait: %v %v", tk, err)
	}
	// Served whole: the decode worker is not busy, so it goes at once.
	if tk, err := r.Enqueue(&wire.RouteRequest{RequestID: "c", Model: "m", Tokens: seq(2000, 32)}, &resp, func(*Ticket) {}); tk != nil || err != nil || resp.Worker != 2 {
		t.Fatalf("aggregated: %v %v %+v", tk, err, resp)
	}
	if err := r.PrefillDone("a"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-admitted:
		if got.Err != nil || !got.resp.Prefill || got.resp.PrefillWorker != 1 {
			t.Fatalf("admitted: %v %+v", got.Err, got.resp)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not admitted after the prefill done")
	}
}
