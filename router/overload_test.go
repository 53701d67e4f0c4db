package router

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// busyFleet is a Router with thresholds t for new models and workers 1..n of model "m", each
// with ranks, 1000 blocks of capacity and 4096 max batched tokens.
func busyFleet(t *testing.T, th Thresholds, n int, ranks ...uint32) *Router {
	t.Helper()
	r := New(Config{Shards: 1, Logger: quiet(), Busy: th})
	t.Cleanup(r.Close)
	for id := uint64(1); id <= uint64(n); id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 4, Ranks: ranks, Capacity: 1000, MaxTokens: 4096}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// book routes a request of isl tokens pinned to worker id, rank, in direct mode.
func book(t *testing.T, r *Router, id uint64, rank uint32, name string, isl int) error {
	t.Helper()
	req := wire.RouteRequest{RequestID: name, Model: "m", Tokens: seq(int(id)*1_000_000+len(name)*10_000, isl),
		Mode: wire.ModeDirect, HasPinned: true, PinnedWorker: id, PinnedRank: rank}
	var resp wire.RouteResponse
	return r.Route(&req, &resp)
}

func routeAny(r *Router, name string, mode wire.Mode) (uint64, error) {
	req := wire.RouteRequest{RequestID: name, Model: "m", Tokens: seq(0, 8), Mode: mode}
	var resp wire.RouteResponse
	err := r.Route(&req, &resp)
	return resp.Worker, err
}

// TestOverloadFiltersWorkers: a worker over the prefill threshold leaves the candidates; when
// every one is over, the route is refused with ErrOverloaded naming the reason, and counted.
func TestOverloadFiltersWorkers(t *testing.T) {
	r := busyFleet(t, Thresholds{PrefillTokens: 100, HasPrefillTokens: true}, 2)
	if err := book(t, r, 1, 0, "big-1", 200); err != nil { // 200 prefill tokens > 100
		t.Fatal(err)
	}
	for i := range 20 {
		for _, mode := range []wire.Mode{wire.ModeKV, wire.ModeRoundRobin, wire.ModeRandom, wire.ModePowerOfTwo, wire.ModeDeviceAwareWeighted} {
			w, err := routeAny(r, fmt.Sprintf("r-%d-%d", i, mode), mode)
			if err != nil || w != 2 {
				t.Fatalf("mode %v: worker %d, %v; want worker 2, the one not overloaded", mode, w, err)
			}
			_ = r.Complete(fmt.Sprintf("r-%d-%d", i, mode))
		}
	}
	if err := book(t, r, 2, 0, "big-2", 200); err != nil {
		t.Fatal(err)
	}
	_, err := routeAny(r, "refused", wire.ModeKV)
	if !errors.Is(err, ErrOverloaded) || !strings.Contains(err.Error(), "all eligible workers are overloaded") ||
		!strings.Contains(err.Error(), "active_prefill_tokens_threshold 100") {
		t.Fatalf("every worker overloaded: %v, want ErrOverloaded naming the threshold", err)
	}
	if r.Booked("refused") {
		t.Fatal("a refused request left a booking")
	}
	if got := r.OverloadRejected(); got != 1 {
		t.Fatalf("rejections %d, want 1", got)
	}
	if got := r.OverloadedWorkers()["m"]; got != 2 {
		t.Fatalf("overloaded workers %d, want 2", got)
	}
	// A match still answers for every worker.
	var resp wire.RouteResponse
	if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: seq(0, 8)}, &resp); err != nil || len(resp.Candidates) != 2 {
		t.Fatalf("match: %v, %d candidates", err, len(resp.Candidates))
	}
	_ = r.Complete("big-1")
	if w, err := routeAny(r, "after", wire.ModeKV); err != nil || w != 1 {
		t.Fatalf("after worker 1 completed: worker %d, %v", w, err)
	}
}

// TestOverloadPinned: a request pinned to an overloaded worker gets Dynamo's own error.
func TestOverloadPinned(t *testing.T) {
	r := busyFleet(t, Thresholds{PrefillFrac: 0.5, HasPrefillFrac: true}, 2)
	if err := book(t, r, 1, 0, "big", 3000); err != nil { // 3000 > 0.5 × 4096
		t.Fatal(err)
	}
	err := book(t, r, 1, 0, "pinned", 8)
	if !errors.Is(err, ErrOverloaded) || !strings.Contains(err.Error(), "pinned worker 1 is overloaded") {
		t.Fatalf("pinned to an overloaded worker: %v", err)
	}
	if err := book(t, r, 2, 0, "other", 8); err != nil {
		t.Fatalf("pinned to a free worker: %v", err)
	}
}

// TestOverloadAllRanks: a worker is overloaded only when every one of its ranks is.
func TestOverloadAllRanks(t *testing.T) {
	r := busyFleet(t, Thresholds{PrefillTokens: 100, HasPrefillTokens: true}, 1, 0, 1)
	if err := book(t, r, 1, 0, "rank0", 200); err != nil {
		t.Fatal(err)
	}
	if _, err := routeAny(r, "one-busy", wire.ModeKV); err != nil {
		t.Fatalf("one rank of two overloaded: %v, want routed", err)
	}
	_ = r.Complete("one-busy")
	if err := book(t, r, 1, 1, "rank1", 200); err != nil {
		t.Fatal(err)
	}
	if _, err := routeAny(r, "both-busy", wire.ModeKV); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("both ranks overloaded: %v, want ErrOverloaded", err)
	}
}

// TestOverloadDecodeHysteresis: the decode check fires on the router's bookings, the reported
// active blocks or the reported used blocks (kv_usage × capacity); it clears only when every
// signal is below the threshold, so a worker that reports a full cache stays out however little
// the router booked on it.
func TestOverloadDecodeHysteresis(t *testing.T) {
	r := busyFleet(t, Thresholds{DecodeBlocks: 0.5, HasDecodeBlocks: true}, 2)
	over := func() int { return r.OverloadedWorkers()["m"] }
	report := func(usage float64, active int64) {
		t.Helper()
		if err := r.Report(&LoadReport{Worker: 1, Model: "m", KVUsage: usage, ActiveBlocks: active}); err != nil {
			t.Fatal(err)
		}
	}
	report(0.9, 0) // 900 used blocks > 500
	if over() != 1 {
		t.Fatal("a worker reporting 90% usage is not overloaded")
	}
	if w, err := routeAny(r, "a", wire.ModeRoundRobin); err != nil || w != 2 {
		t.Fatalf("worker %d, %v; want 2", w, err)
	}
	_ = r.Complete("a")
	// A pinned request is refused while the report stays high, however little is booked.
	if err := book(t, r, 1, 0, "pin", 8); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("pinned while the report is over: %v", err)
	}
	report(0.1, 0)
	if over() != 0 {
		t.Fatal("report below, nothing booked: still overloaded")
	}
	// Bookings over the threshold, the report below: overloaded, by the bookings.
	if err := book(t, r, 1, 0, "big", 4*600); err != nil { // 600 blocks > 500
		t.Fatal(err)
	}
	if over() != 1 {
		t.Fatal("booked blocks over the threshold did not keep the worker overloaded")
	}
	// Both below: cleared.
	_ = r.Complete("big")
	if over() != 0 {
		t.Fatal("every signal below the threshold, still overloaded")
	}
	// The report's own active blocks count too.
	report(0.1, 501)
	if over() != 1 {
		t.Fatal("reported active blocks over the threshold: not overloaded")
	}
	report(0.5, 500) // at the threshold is not over it
	if over() != 0 {
		t.Fatal("at the threshold: overloaded")
	}
}

// TestBusyThresholdsAtRunTime: thresholds set for a model take effect on the next route; only
// the fields given change; an unknown model is refused.
func TestBusyThresholdsAtRunTime(t *testing.T) {
	r := busyFleet(t, Thresholds{}, 1)
	if err := book(t, r, 1, 0, "big", 200); err != nil {
		t.Fatal(err)
	}
	if _, err := routeAny(r, "free", wire.ModeKV); err != nil {
		t.Fatalf("no thresholds: %v", err)
	}
	got, err := r.SetBusyThresholds("m", Thresholds{PrefillTokens: 100, HasPrefillTokens: true})
	if err != nil || !got.HasPrefillTokens || got.HasDecodeBlocks {
		t.Fatalf("set: %+v, %v", got, err)
	}
	if _, err := routeAny(r, "now-busy", wire.ModeKV); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("after setting the threshold: %v, want ErrOverloaded", err)
	}
	got, err = r.SetBusyThresholds("m", Thresholds{DecodeBlocks: 0.9, HasDecodeBlocks: true})
	if err != nil || !got.HasPrefillTokens || got.PrefillTokens != 100 || got.DecodeBlocks != 0.9 {
		t.Fatalf("a second field: %+v, %v; want both", got, err)
	}
	got, _ = r.SetBusyThresholds("m", Thresholds{PrefillTokens: 1000, HasPrefillTokens: true})
	if _, err := routeAny(r, "free-again", wire.ModeKV); err != nil || got.PrefillTokens != 1000 {
		t.Fatalf("raised threshold: %v", err)
	}
	if _, err := r.SetBusyThresholds("nope", Thresholds{PrefillTokens: 1, HasPrefillTokens: true}); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unknown model: %v", err)
	}
	if _, err := r.SetBusyThresholds("m", Thresholds{DecodeBlocks: 1.5, HasDecodeBlocks: true}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("decode threshold 1.5: %v", err)
	}
	if l := r.ListBusyThresholds(); len(l) != 1 || l[0].Model != "m" || l[0].PrefillTokens != 1000 {
		t.Fatalf("list: %+v", l)
	}
}

// TestOverloadFastPathUnchanged: with no thresholds the kv route allocates nothing, as before;
// with thresholds set and no worker over them, the kv general path picks what the fast one
// would.
func TestOverloadFastPathUnchanged(t *testing.T) {
	r := fleet(t, 8)
	req := wire.RouteRequest{RequestID: "x", Model: "m", Tokens: familyPrompt(3)}
	var resp wire.RouteResponse
	if err := r.Route(&req, &resp); err != nil {
		t.Fatal(err)
	}
	fast := resp.Worker
	_ = r.Complete("x")
	step := func() {
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		_ = r.Complete("x")
	}
	if n := testing.AllocsPerRun(100, step); n != 0 && !raceEnabled { // -race allocates
		t.Fatalf("route without thresholds: %v allocations", n)
	}
	if _, err := r.SetBusyThresholds("m", Thresholds{PrefillTokens: 1 << 40, HasPrefillTokens: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.Route(&req, &resp); err != nil || resp.Worker != fast {
		t.Fatalf("with thresholds none fires: worker %d, %v; want %d", resp.Worker, err, fast)
	}
}

// TestDeviceAwareWeights: registered weights (and device_type cpu) steer device_aware_weighted.
func TestDeviceAwareWeights(t *testing.T) {
	r := New(Config{Shards: 1, Logger: quiet()})
	t.Cleanup(r.Close)
	if err := r.Register(Registration{ID: 1, Model: "m", BlockSize: 4, Weight: 4}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(Registration{ID: 2, Model: "m", BlockSize: 4, Weight: DeviceWeight("cpu", 0)}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(Registration{ID: 3, Model: "m", BlockSize: 4, Weight: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("weight -1: %v", err)
	}
	// Worker 1 (weight 4) takes 4 requests per 1/8 request of the CPU worker: the first 32 go to
	// worker 1 save the first, which the CPU worker, idle, ties for and wins or loses by the
	// scan's start.
	n := map[uint64]int{}
	for i := range 33 {
		w, err := routeAny(r, fmt.Sprintf("d%d", i), wire.ModeDeviceAwareWeighted)
		if err != nil {
			t.Fatal(err)
		}
		n[w]++
	}
	if n[2] != 1 || n[1] != 32 {
		t.Fatalf("requests per worker %v, want 32 on worker 1 and 1 on the CPU worker", n)
	}
	for _, w := range r.Workers() {
		if want := map[uint64]float64{1: 4, 2: CPUWeight}[w.ID]; w.Weight != want {
			t.Fatalf("worker %d weight %v, want %v", w.ID, w.Weight, want)
		}
	}
}

// TestOverloadWaitingRequests: with the waiting-requests threshold, a worker whose load reports
// say more requests wait in its engine's queue leaves routing until a report says fewer.
func TestOverloadWaitingRequests(t *testing.T) {
	r := busyFleet(t, Thresholds{WaitingRequests: 2, HasWaitingRequests: true}, 2)
	report := func(waiting int64) {
		t.Helper()
		if err := r.Report(&LoadReport{Worker: 1, Model: "m", WaitingRequests: waiting}); err != nil {
			t.Fatal(err)
		}
	}
	report(3)
	if w, err := routeAny(r, "a", wire.ModeRoundRobin); err != nil || w != 2 {
		t.Fatalf("worker %d, %v; want 2 (worker 1's engine queues 3 requests)", w, err)
	}
	_ = r.Complete("a")
	if err := book(t, r, 1, 0, "pin", 8); !errors.Is(err, ErrOverloaded) || !strings.Contains(err.Error(), "waiting_requests_threshold") {
		t.Fatalf("pinned to a queueing engine: %v", err)
	}
	report(2) // at the threshold is not over it
	if n := r.OverloadedWorkers()["m"]; n != 0 {
		t.Fatalf("%d overloaded at the threshold", n)
	}
}
