package scoring

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/kvrouterd/kvrouterd/radix"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }

func TestStepModelTTFT(t *testing.T) {
	m := DefaultStepModel()
	// An idle worker: one step computing the own tokens, which yields the first token.
	if got, want := m.TTFT(1000, 0, 0, 100), m.PrefillMs(1000)+m.DecodeMs(100.0/16384); !near(got, want) {
		t.Fatalf("idle: %v, want %v", got, want)
	}
	// 20,000 tokens queued and 1,000 own on a worker decoding 192 requests: budget 8,000 per
	// step, 3 steps, each paying its decode part.
	u := 8000.0 / 16384
	want := 2*m.PrefillMs(8000) + m.PrefillMs(5000) + 3.5*m.DecodeMs(u) // and half a step it arrives in
	if got := m.TTFT(1000, 20000, 192, 8000); !near(got, want) {
		t.Fatalf("queued: %v, want %v", got, want)
	}
	// More work ahead, more own work, more blocks held: never sooner.
	base := m.TTFT(500, 3000, 10, 2000)
	for _, x := range []float64{m.TTFT(600, 3000, 10, 2000), m.TTFT(500, 9000, 10, 2000), m.TTFT(500, 3000, 10, 9000)} {
		if x < base {
			t.Fatalf("more load predicted sooner: %v < %v", x, base)
		}
	}
	// The budget never falls under half a step however many requests decode, and a full
	// cache counts as full.
	if got, want := m.TTFT(100, 0, 1e6, 1e9), m.PrefillMs(100)+1.5*m.DecodeMs(1); !near(got, want) {
		t.Fatalf("saturated: %v, want %v", got, want)
	}
	// Unknown capacity: decode at an empty cache.
	m.Capacity = 0
	if got, want := m.TTFT(100, 0, 0, 5000), m.PrefillMs(100)+m.DecodeMs(0); !near(got, want) {
		t.Fatalf("no capacity: %v, want %v", got, want)
	}
}

func TestStepModelDecayed(t *testing.T) {
	m := DefaultStepModel()
	const ms = int64(1e6)
	// An idle worker but for the prefill: full steps of 8,192 tokens, no decode part.
	perMs := 8192 / m.PrefillMs(8192)
	if got, want := m.Decayed(10000, 5*ms, 105*ms, 0, 0, 1), 10000-int64(100*perMs); got != want {
		t.Fatalf("decayed %d, want %d", got, want)
	}
	// 192 requests decoding at half the cache: steps of 8,000 tokens with a decode part.
	busy := 8000 / (m.PrefillMs(8000) + m.DecodeMs(0.5))
	if got, want := m.Decayed(10000, 5*ms, 105*ms, 192, 8192, 0), 10000-int64(100*busy); got != want {
		t.Fatalf("busy worker: decayed %d, want %d", got, want)
	}
	for _, c := range []struct{ active, since, now, want int64 }{
		{10000, 5 * ms, 5 * ms, 10000}, // no time passed
		{10000, 0, 100 * ms, 10000},    // no clock
		{10000, 5 * ms, 3 * ms, 10000}, // a clock behind the booking
		{10000, 1 * ms, 10000 * ms, 0}, // all done
		{0, 1 * ms, 10 * ms, 0},        // nothing booked
		{-5, 1 * ms, 10 * ms, -5},      // whatever the tracker says when it says less
		{500, 1 * ms, 1*ms + 1, 500},   // a nanosecond computes nothing
	} {
		if got := m.Decayed(c.active, c.since, c.now, 0, 0, 1); got != c.want {
			t.Errorf("Decayed(%d, %d, %d) = %d, want %d", c.active, c.since, c.now, got, c.want)
		}
	}
}

// TestCostTTFT checks the logit against the model by hand, and that a prefix is worth its
// prefill time (and the cache weight's multiple of it) against a queue.
func TestCostTTFT(t *testing.T) {
	p := Params{Mode: KV, BlockSize: 64, ISL: 6400, Blocks: 100, TrackPrefill: true, Formula: CostTTFT,
		Step: DefaultStepModel(), CacheWeight: 2, Weight: 1}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	m := &p.Step
	// 60 blocks cached, 1,000 tokens queued on a worker with 4 requests and 500 blocks.
	_, decode, logit := p.Cost(60, 0, 500, 1000, 4)
	own := 6400.0 - 60*64
	want := m.TTFT(int64(own), 1000, 4, decode) + 2*m.PrefillMs(own)
	if decode != 600 || !near(logit, want) {
		t.Fatalf("logit %v decode %d, want %v and 600", logit, decode, want)
	}
	if pr := p.PredictTTFT(60, 0, TierExt{}, 500, 1000, 4); !near(pr, m.TTFT(int64(own), 1000, 4, decode)) {
		t.Fatalf("prediction %v", pr)
	}
	// Blocks booked on the worker by a request ahead count as computed by the time this one
	// runs.
	_, _, withShared := p.Cost(10, 60, 500, 1000, 4)
	_, decode2, _ := p.Cost(10, 60, 500, 1000, 4)
	if want := m.TTFT(int64(own), 1000, 4, decode2) + 2*m.PrefillMs(own); !near(withShared, want) {
		t.Fatalf("shared: %v, want %v", withShared, want)
	}
	// The host tier's blocks are loaded, not computed; with its credit 0 (indexed only), computed.
	host := TierExt{Host: 30}
	p.Tiers = DefaultTierCredit()
	_, _, lh := p.CostExt(60, host, 0, 500, 1000, 4)
	own2 := 6400.0 - 90*64
	want = m.TTFT(int64(own2), 1000, 4, decode) + 30*64*m.HostMsPerToken + 2*m.PrefillMs(own2)
	if !near(lh, want) {
		t.Fatalf("host: %v, want %v", lh, want)
	}
	p.Tiers.Host = 0
	if _, _, l0 := p.CostExt(60, host, 0, 500, 1000, 4); !near(l0, logit) {
		t.Fatalf("host tier not credited: %v, want the device's alone %v", l0, logit)
	}
	p.Tiers = TierCredit{}
	// A worker holding the prefix behind a short queue beats an idle one without it; a long
	// enough queue turns that round.
	c := []Candidate{{Worker: 1, Cached: 90, ActivePrefill: 2000, ActiveRequests: 3, ActiveBlocks: 300}, {Worker: 2}}
	var ch Chooser
	if i, err := ch.Choose(c, &p, nil); err != nil || i != 0 {
		t.Fatalf("short queue: chose %d (%v), logits %v %v", i, err, c[0].Logit, c[1].Logit)
	}
	c[0].ActivePrefill = 200000
	if i, err := ch.Choose(c, &p, nil); err != nil || i != 1 {
		t.Fatalf("long queue: chose %d (%v), logits %v %v", i, err, c[0].Logit, c[1].Logit)
	}
	// A worker twice as slow: its predicted time doubles, the price of its computed tokens
	// (the cache weight's) does not.
	slow := Candidate{Cached: 60, ActivePrefill: 1000, ActiveRequests: 4, ActiveBlocks: 500, Slow: 2}
	_, _, ls := p.CostAt(&slow)
	ttft := m.TTFT(int64(own), 1000, 4, 600)
	if want := 2*ttft + 2*m.PrefillMs(own); !near(ls, want) {
		t.Fatalf("slow worker: %v, want %v", ls, want)
	}
	if tt, price := p.TTFTParts(&slow); !near(tt, 2*ttft) || !near(price, 2*m.PrefillMs(own)) {
		t.Fatalf("parts %v + %v, want %v + %v", tt, price, 2*ttft, 2*m.PrefillMs(own))
	}
	slow.Slow = 1
	if _, _, l1 := p.CostAt(&slow); !near(l1, ttft+2*m.PrefillMs(own)) {
		t.Fatalf("slowness 1: %v", l1)
	}
	// Untracked prefill: only the load ahead counts.
	p.TrackPrefill = false
	_, _, l0 := p.Cost(0, 0, 0, 0, 0)
	_, _, l90 := p.Cost(90, 0, 0, 0, 0)
	if l0 != l90 {
		t.Fatalf("untracked prefill: the cache changed the logit: %v %v", l0, l90)
	}
}

func TestCostTTFTCheck(t *testing.T) {
	p := Params{Mode: KV, BlockSize: 64, Formula: CostTTFT, Step: DefaultStepModel()}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	p.CacheWeight = -1
	if err := p.Check(); !errors.Is(err, ErrCacheWeight) {
		t.Fatalf("negative cache weight: %v", err)
	}
	p.CacheWeight = 0
	for _, bad := range []func(*StepModel){
		func(m *StepModel) { m.MaxBatched = 0 },
		func(m *StepModel) { m.P1 = math.NaN() },
		func(m *StepModel) { m.D0 = math.Inf(1) },
		func(m *StepModel) { m.Capacity = -1 },
		func(m *StepModel) { m.HostMsPerToken = -1 },
	} {
		p.Step = DefaultStepModel()
		bad(&p.Step)
		if err := p.Check(); !errors.Is(err, ErrStepModel) {
			t.Fatalf("%+v: %v", p.Step, err)
		}
	}
	if c, err := ParseCost("ttft"); err != nil || c != CostTTFT || c.String() != "ttft" {
		t.Fatalf("ParseCost(ttft) = %v, %v", c, err)
	}
}

// TestTrackerPendingAndSince: the requests waiting for their first token, and when the
// oldest prefill not yet done started, through bookings, prefill-done and completion.
func TestTrackerPendingAndSince(t *testing.T) {
	tr := NewTracker()
	var now int64 = 100
	tr.Now = func() int64 { return now }
	w := mustRegister(t, tr, 1)
	check := func(pending, since int64) {
		t.Helper()
		if w.Pending() != pending || w.PrefillSince() != since {
			t.Fatalf("pending %d since %d, want %d %d", w.Pending(), w.PrefillSince(), pending, since)
		}
	}
	if err := tr.Book("cached", w, []uint64{1}, 0, 1e12); err != nil { // nothing to compute
		t.Fatal(err)
	}
	check(0, 0)
	if err := tr.Book("a", w, []uint64{2}, 500, 1e12); err != nil {
		t.Fatal(err)
	}
	check(1, 100)
	now = 150
	if err := tr.Book("b", w, []uint64{3}, 700, 1e12); err != nil { // queued behind a: since stays
		t.Fatal(err)
	}
	check(2, 100)
	now = 200
	if err := tr.PrefillDone("a"); err != nil { // b's prefill starts now
		t.Fatal(err)
	}
	check(1, 200)
	if err := tr.PrefillDone("a"); err != nil { // a second call changes nothing
		t.Fatal(err)
	}
	check(1, 200)
	if err := tr.Complete("b"); err != nil { // completed before its first token
		t.Fatal(err)
	}
	check(0, 200)
	for _, id := range []string{"a", "cached"} {
		if err := tr.Complete(id); err != nil {
			t.Fatal(err)
		}
	}
	check(0, 200)
	if got := Backlog([]Candidate{{Pending: 3}, {Pending: 0}, {Pending: 1}, {Pending: -1}}); got != 4.0/4 {
		t.Fatalf("backlog %v", got)
	}
	if Backlog(nil) != 0 {
		t.Fatal("backlog of no candidate")
	}
}

// TestTrackerSlowness: a worker whose requests take twice the predicted time, among workers
// that take what is predicted, learns a slowness step of 2, relative to them, and stays among
// the workers a router prices one by one while idle; noise within the step leaves a worker at 1.
func TestTrackerSlowness(t *testing.T) {
	tr := NewTracker()
	var now int64 = 1
	tr.Now = func() int64 { return now }
	ws := []*Load{mustRegister(t, tr, 1), mustRegister(t, tr, 2), mustRegister(t, tr, 3)}
	took := []float64{100, 2 * 100, 100} // ms, for a prediction of 100 ms
	for i := range 300 {
		for k, w := range ws {
			id := fmt.Sprintf("r%d-%d", i, k)
			if err := tr.BookOutput(id, w, []uint64{uint64(i)}, 64, 1e18, Output{PredictedTTFT: 100}); err != nil {
				t.Fatal(err)
			}
			now += int64(took[k] * (1 + 0.1*float64(i%3-1)) * 1e6) // ±10 % noise
			if err := tr.PrefillDone(id); err != nil {
				t.Fatal(err)
			}
			if err := tr.Complete(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k, want := range []float64{1, 2, 1} {
		if got := ws[k].SlownessStep(); got != want {
			t.Errorf("worker %d: slowness step %v, want %v (slowness %v)", k+1, got, want, ws[k].Slowness())
		}
	}
	if s := ws[1].Slowness(); s < 1.8 || s > 2.2 {
		t.Errorf("worker 2's slowness %v, want about 2", s)
	}
	if busy := tr.AppendBusy(nil); !slices.Equal(busy, []radix.Slot{ws[1].Slot()}) {
		t.Errorf("priced one by one while idle: %v, want worker 2's slot only", busy)
	}
	// A booking without a prediction teaches nothing.
	before := ws[0].Slowness()
	if err := tr.Book("plain", ws[0], []uint64{7}, 64, 1e18); err != nil {
		t.Fatal(err)
	}
	now += 5e9
	if err := tr.PrefillDone("plain"); err != nil || ws[0].Slowness() != before {
		t.Errorf("learnt from a booking without a prediction: %v %v", ws[0].Slowness(), err)
	}
}

// TestTrackerFleetSlowness: a fleet uniformly four times faster than the step model is learnt
// within tens of requests, as the fleet's slowness, not as any worker's own step; and it keeps
// following when the fleet's speed changes.
func TestTrackerFleetSlowness(t *testing.T) {
	tr := NewTracker()
	var now int64 = 1
	tr.Now = func() int64 { return now }
	ws := []*Load{mustRegister(t, tr, 1), mustRegister(t, tr, 2), mustRegister(t, tr, 3), mustRegister(t, tr, 4)}
	if tr.FleetSlowness() != 1 || ws[0].Slowness() != 1 {
		t.Fatalf("cold: fleet %v, worker %v, want 1", tr.FleetSlowness(), ws[0].Slowness())
	}
	n := 0
	run := func(requests int, took float64) {
		for range requests {
			k := n % len(ws)
			id := fmt.Sprintf("r%d", n)
			n++
			if err := tr.BookOutput(id, ws[k], []uint64{uint64(n)}, 64, 1e18, Output{PredictedTTFT: 100}); err != nil {
				t.Fatal(err)
			}
			now += int64(took * (1 + 0.2*float64(n%5-2)/2) * 1e6) // ±20 % noise
			if err := tr.PrefillDone(id); err != nil {
				t.Fatal(err)
			}
			if err := tr.Complete(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(40, 25) // 10 a worker
	if f := tr.FleetSlowness(); f < 0.2 || f > 0.3 {
		t.Errorf("after 40 requests 4× faster: fleet slowness %v, want about 0.25", f)
	}
	for k, w := range ws {
		if w.SlownessStep() != 1 {
			t.Errorf("worker %d: step %v, want 1: the whole fleet is fast alike", k+1, w.SlownessStep())
		}
		if s := w.Slowness(); s < 0.2 || s > 0.3 {
			t.Errorf("worker %d: slowness %v, want about 0.25", k+1, s)
		}
	}
	run(400, 50) // the fleet slows to twice the model's speed
	if f := tr.FleetSlowness(); f < 0.4 || f > 0.6 {
		t.Errorf("after the fleet slowed: fleet slowness %v, want about 0.5", f)
	}
}

// TestTTFTWaitsForCapacity: a request whose blocks do not fit beside the active ones waits
// for them to finish, over the workers' mean request lifetime; without one, it is not
// predicted to wait.
func TestTTFTWaitsForCapacity(t *testing.T) {
	m := DefaultStepModel()
	m.Capacity = 1000
	fits := m.TTFT(100, 0, 5, 1000)
	m.RequestMs = 8000
	if got := m.TTFT(100, 0, 5, 1000); got != fits {
		t.Fatalf("a request that fits waits: %v against %v", got, fits)
	}
	over := m.TTFT(100, 0, 5, 1250)                  // a quarter of the capacity too many
	if want := fits + 0.25*8000; !near(over, want) { // both at full KV usage
		t.Fatalf("over capacity: %v, want %v", over, want)
	}
	m.RequestMs = 0
	if got := m.TTFT(100, 0, 5, 1250); got > fits+1e-9 {
		t.Fatalf("no lifetime known, yet a wait: %v against %v", got, fits)
	}
}

// TestCostTTFTHoldsCapacity: over the KV capacity, the blocks a request adds are priced at
// their share of a lifetime for each request of the backlog that will wait behind them; within
// the capacity, or with no backlog, they are not.
func TestCostTTFTHoldsCapacity(t *testing.T) {
	p := Params{Mode: KV, BlockSize: 64, ISL: 6400, Blocks: 100, TrackPrefill: true, Formula: CostTTFT,
		Step: DefaultStepModel(), CacheWeight: 2, Weight: 1, Backlog: 3}
	p.Step.Capacity, p.Step.RequestMs = 1000, 8000
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	m := &p.Step
	own := 6400.0 - 60*64 // 40 blocks added
	base := (2 + 3) * m.PrefillMs(own)
	if _, price := p.TTFTParts(&Candidate{Cached: 60, ActiveBlocks: 900}); !near(price, base) {
		t.Fatalf("within capacity: price %v, want %v", price, base)
	}
	// 990 active + 40 added: 30 blocks over, 30 of the request's own held back.
	if _, price := p.TTFTParts(&Candidate{Cached: 60, ActiveBlocks: 930}); !near(price, base+3*8000*30.0/1000) {
		t.Fatalf("30 blocks over: price %v, want %v", price, base+3*8000*30.0/1000)
	}
	// Far over: only the request's own 40 blocks count.
	if _, price := p.TTFTParts(&Candidate{Cached: 60, ActiveBlocks: 5000}); !near(price, base+3*8000*40.0/1000) {
		t.Fatalf("far over: price %v, want %v", price, base+3*8000*40.0/1000)
	}
	p.Backlog = 0
	if _, price := p.TTFTParts(&Candidate{Cached: 60, ActiveBlocks: 5000}); !near(price, 2*m.PrefillMs(own)) {
		t.Fatalf("no backlog: price %v, want %v", price, 2*m.PrefillMs(own))
	}
}

// TestTrackerMeanLifetime: completions teach the mean time from booking to completion;
// bookings whose deadline is not booking + expiry, and expiries, do not.
func TestTrackerMeanLifetime(t *testing.T) {
	tr := NewTracker()
	var now int64 = 1e9
	tr.Now, tr.Expiry = func() int64 { return now }, int64(60e9)
	w := mustRegister(t, tr, 1)
	for i, life := range []int64{2e9, 4e9} {
		id := fmt.Sprint("r", i)
		if err := tr.Book(id, w, []uint64{uint64(i)}, 10, now+tr.Expiry); err != nil {
			t.Fatal(err)
		}
		now += life
		if err := tr.Complete(id); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := tr.MeanLifetime(), 2000+(4000-2000)/64.0; !near(got, want) {
		t.Fatalf("mean lifetime %v ms, want %v", got, want)
	}
	if err := tr.Book("odd", w, []uint64{9}, 10, now+1e6); err != nil { // a deadline of its own
		t.Fatal(err)
	}
	now += 1e9
	before := tr.MeanLifetime()
	if err := tr.Complete("odd"); err != nil || tr.MeanLifetime() != before {
		t.Fatalf("a booking with its own deadline changed the mean: %v %v", tr.MeanLifetime(), err)
	}
}
