package router

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// shareCall is one call a fakeSharer saw.
type shareCall struct {
	op      string
	model   string
	worker  radix.WorkerKey
	id      string
	seqs    []uint64
	prefill int64
	ttl     time.Duration
}

// fakeSharer records the calls, copying what they alias.
type fakeSharer struct {
	mu    sync.Mutex
	calls []shareCall
}

func (f *fakeSharer) Booked(model string, worker radix.WorkerKey, id string, seqs []uint64, prefill int64, ttl time.Duration) {
	f.add(shareCall{"booked", strings.Clone(model), worker, strings.Clone(id), slices.Clone(seqs), prefill, ttl})
}
func (f *fakeSharer) PrefillDone(id string) { f.add(shareCall{op: "prefill", id: strings.Clone(id)}) }
func (f *fakeSharer) Completed(id string)   { f.add(shareCall{op: "completed", id: strings.Clone(id)}) }
func (f *fakeSharer) SessionBound(model, session string, worker radix.WorkerKey, ttl time.Duration) {
	f.add(shareCall{op: "session", model: strings.Clone(model), worker: worker, id: strings.Clone(session), ttl: ttl})
}

func (f *fakeSharer) add(c shareCall) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

func (f *fakeSharer) take() []shareCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// sharedFleet is a Router with workers 1..3 of model "m" (block size 16), worker 1 holding
// the first 4 blocks of prompt(0).
func sharedFleet(t testing.TB, cfg Config) *Router {
	t.Helper()
	cfg.Shards, cfg.Logger = 1, quiet()
	r := New(cfg)
	t.Cleanup(r.Close)
	for id := uint64(1); id <= 3; id++ {
		if err := r.Register(Registration{ID: id, Model: "m", BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
	}
	b := &wire.EventBatch{Worker: 1, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{1, 2, 3, 4}, Tokens: prompt(0)[:64]}}}
	if oc, err := r.ApplyEvents(b, nil); err != nil || oc[0].Status != shard.OK {
		t.Fatalf("events: %v %v", oc, err)
	}
	return r
}

// prompt is an 8-block prompt plus 5 tokens; prompts of one family share their first 6 blocks.
func prompt(family int) []uint32 {
	return append(seq(0, 96), seq(1000*(family+1), 37)...)
}

// answer is the Match answer of prompt(family), every candidate.
func answer(t testing.TB, r *Router, family int) []wire.Candidate {
	t.Helper()
	var resp wire.RouteResponse
	if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: prompt(family)}, &resp); err != nil {
		t.Fatal(err)
	}
	return resp.Candidates
}

func TestShareHooks(t *testing.T) {
	f := &fakeSharer{}
	var now atomic.Int64
	r := sharedFleet(t, Config{Share: f, RequestExpiry: time.Minute, Now: now.Load})
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: prompt(0)}, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Worker != 1 {
		t.Fatalf("routed to %d, want the worker holding the prefix", resp.Worker)
	}
	var h radix.Hasher
	want := shareCall{"booked", "m", radix.WorkerKey{ID: 1}, "a", h.AppendSequence(nil, prompt(0), 16, radix.LoRASeed("")), 133 - 4*16, time.Minute}
	calls := f.take()
	if len(calls) != 1 || fmt.Sprint(calls[0]) != fmt.Sprint(want) {
		t.Fatalf("calls %+v, want %+v", calls, want)
	}
	// Refused bookings, matches and lifecycle calls of unknown requests share nothing.
	if err := r.Route(&wire.RouteRequest{RequestID: "a", Model: "m", Tokens: prompt(0)}, &resp); !errors.Is(err, ErrConflict) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := r.Route(&wire.RouteRequest{RequestID: "\x00b\x00a", Model: "m", Tokens: prompt(0)}, &resp); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("reserved id: %v", err)
	}
	answer(t, r, 0)
	if err := r.Complete("nope"); err == nil {
		t.Fatal("completed an unknown request")
	}
	if calls := f.take(); len(calls) != 0 {
		t.Fatalf("calls %+v, want none", calls)
	}
	if err := r.PrefillDone("a"); err != nil {
		t.Fatal(err)
	}
	if err := r.Complete("a"); err != nil {
		t.Fatal(err)
	}
	calls = f.take()
	if len(calls) != 2 || calls[0].op != "prefill" || calls[0].id != "a" || calls[1].op != "completed" || calls[1].id != "a" {
		t.Fatalf("calls %+v", calls)
	}
	// Expiry is not shared: every replica expires its copies itself.
	if err := r.Route(&wire.RouteRequest{RequestID: "b", Model: "m", Tokens: prompt(0)}, &resp); err != nil {
		t.Fatal(err)
	}
	f.take()
	now.Store(int64(time.Hour))
	r.ExpireRequests()
	if st := r.Stats(); st.Expired != 1 || st.ActiveRequests != 0 {
		t.Fatalf("%+v, want b expired", st)
	}
	if calls := f.take(); len(calls) != 0 {
		t.Fatalf("calls %+v, want none", calls)
	}
}

// TestBookRemote checks that a remote booking changes the load view exactly as the same local
// booking does on an identical Router, through prefill done and completion, with blocks
// shared between requests counted once.
func TestBookRemote(t *testing.T) {
	f := &fakeSharer{}
	local := sharedFleet(t, Config{Share: f})
	remote := sharedFleet(t, Config{})
	same := func(step string) {
		t.Helper()
		for fam := range 3 {
			a, b := answer(t, local, fam), answer(t, remote, fam)
			if !slices.Equal(a, b) {
				t.Fatalf("%s, family %d:\nlocal  %+v\nremote %+v", step, fam, a, b)
			}
		}
	}
	book := func(id string, fam int, pin uint64) {
		t.Helper()
		req := wire.RouteRequest{RequestID: id, Model: "m", Tokens: prompt(fam), Mode: wire.ModeDirect, HasPinned: true, PinnedWorker: pin}
		var resp wire.RouteResponse
		if err := local.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		c := f.take()[0]
		if err := remote.BookRemote("A", c.model, c.worker, c.id, c.seqs, c.prefill, c.ttl); err != nil {
			t.Fatal(err)
		}
	}
	before := answer(t, remote, 0)
	book("x", 0, 2)
	same("booked x")
	// Scored for another request of the family: 8 active blocks, 6 of them shared.
	if a := answer(t, remote, 1); a[1].ActiveBlocks != 8+8-6 || a[1].PrefillTokens != 133+133 {
		t.Fatalf("worker 2 after booking 8 blocks and 133 tokens: %+v", a[1])
	}
	book("y", 1, 2) // shares 6 blocks with x
	book("z", 0, 1)
	same("booked y and z")
	for _, id := range []string{"x", "z"} {
		if err := local.PrefillDone(id); err != nil {
			t.Fatal(err)
		}
		if err := remote.PrefillDoneRemote("A", id); err != nil {
			t.Fatal(err)
		}
	}
	f.take()
	same("prefill done")
	for _, id := range []string{"x", "y", "z"} {
		if err := local.Complete(id); err != nil {
			t.Fatal(err)
		}
		if err := remote.CompleteRemote("A", id); err != nil {
			t.Fatal(err)
		}
	}
	same("completed")
	if a := answer(t, remote, 0); !slices.Equal(a, before) {
		t.Fatalf("after completion %+v, before any booking %+v", a, before)
	}
	if n := remote.Stats().ActiveRequests; n != 0 {
		t.Fatalf("%d requests still active", n)
	}
}

// TestRemoteNamespace checks that another replica's request ids never touch local requests or
// a third replica's, however they are spelled.
func TestRemoteNamespace(t *testing.T) {
	r := sharedFleet(t, Config{})
	var h radix.Hasher
	seqs := h.AppendSequence(nil, prompt(0), 16, radix.LoRASeed(""))
	var resp wire.RouteResponse
	if err := r.Route(&wire.RouteRequest{RequestID: "x", Model: "m", Tokens: prompt(0)}, &resp); err != nil {
		t.Fatal(err)
	}
	w2 := radix.WorkerKey{ID: 2}
	long := strings.Repeat("L", 1024) // too long to keep beside the replica id: hashed
	for _, rep := range []string{"B", "BB"} {
		for _, id := range []string{"x", "\x00B\x00x", long, long[:1023] + "M"} {
			if err := r.BookRemote(rep, "m", w2, id, seqs, 0, time.Minute); err != nil {
				t.Fatalf("replica %q, id %.8q: %v", rep, id, err)
			}
		}
	}
	if err := r.BookRemote("B", "m", w2, "x", seqs, 0, time.Minute); !errors.Is(err, ErrConflict) {
		t.Fatalf("second booking: %v", err)
	}
	if n := r.Stats().ActiveRequests; n != 9 {
		t.Fatalf("%d active requests, want 9", n)
	}
	for _, id := range []string{"\x00B\x00x", "\x00BB\x00x"} {
		if err := r.Complete(id); !errors.Is(err, ErrUnknownRequest) {
			t.Fatalf("local complete of %q: %v", id, err)
		}
		if err := r.PrefillDone(id); !errors.Is(err, ErrUnknownRequest) {
			t.Fatalf("local prefill done of %q: %v", id, err)
		}
	}
	if err := r.CompleteRemote("C", "x"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("replica C: %v", err)
	}
	if err := r.CompleteRemote("B", "x"); err != nil {
		t.Fatal(err)
	}
	if err := r.CompleteRemote("B", "x"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("second completion: %v", err)
	}
	if err := r.Complete("x"); err != nil {
		t.Fatalf("the local request went with the remote one: %v", err)
	}
	for _, rep := range []string{"B", "BB"} {
		for _, id := range []string{"\x00B\x00x", long, long[:1023] + "M"} {
			if err := r.CompleteRemote(rep, id); err != nil {
				t.Fatalf("replica %q, id %.8q: %v", rep, id, err)
			}
		}
	}
	if err := r.CompleteRemote("BB", "x"); err != nil {
		t.Fatal(err)
	}
	if n := r.Stats().ActiveRequests; n != 0 {
		t.Fatalf("%d active requests, want 0", n)
	}
}

func TestBookRemoteRefused(t *testing.T) {
	r := sharedFleet(t, Config{})
	seqs := []uint64{1, 2}
	f := func(replica, model string, w radix.WorkerKey, id string, prefill int64, ttl time.Duration, want error) {
		t.Helper()
		if err := r.BookRemote(replica, model, w, id, seqs, prefill, ttl); !errors.Is(err, want) {
			t.Fatalf("got %v, want %v", err, want)
		}
	}
	w1 := radix.WorkerKey{ID: 1}
	f("A", "nope", w1, "x", 0, time.Second, ErrUnknownModel)
	f("A", "m", radix.WorkerKey{ID: 4}, "x", 0, time.Second, ErrUnknownWorker)
	f("A", "m", radix.WorkerKey{ID: 1, Rank: 1}, "x", 0, time.Second, ErrUnknownWorker)
	f("", "m", w1, "x", 0, time.Second, ErrInvalid)
	f("A\x00", "m", w1, "x", 0, time.Second, ErrInvalid)
	f("A\x01", "m", w1, "x", 0, time.Second, ErrInvalid)
	f(strings.Repeat("A", MaxReplicaID+1), "m", w1, "x", 0, time.Second, ErrInvalid)
	f("A", "m", w1, "", 0, time.Second, ErrInvalid)
	f("A", "m", w1, strings.Repeat("x", 1025), 0, time.Second, ErrInvalid)
	f("A", "m", w1, "x", -1, time.Second, ErrInvalid)
	f("A", "m", w1, "x", MaxTokens+1, time.Second, ErrInvalid)
	f("A", "m", w1, "x", 0, 0, ErrInvalid)
	if n := r.Stats().ActiveRequests; n != 0 {
		t.Fatalf("%d active requests, want 0", n)
	}
	if err := r.PrefillDoneRemote("A", "x"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatal(err)
	}
	if err := r.CompleteRemote("", "x"); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

// TestRemoteExpiry checks that a remote booking expires after its ttl, or the local
// RequestExpiry if shorter.
func TestRemoteExpiry(t *testing.T) {
	var now atomic.Int64
	r := sharedFleet(t, Config{RequestExpiry: time.Minute, Now: now.Load})
	w := radix.WorkerKey{ID: 2}
	if err := r.BookRemote("A", "m", w, "short", []uint64{1}, 0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := r.BookRemote("A", "m", w, "long", []uint64{1}, 0, time.Hour); err != nil {
		t.Fatal(err)
	}
	// The Router's own expiry loop may run too: count what is left, not what a call freed.
	f := func(at time.Duration, active int64) {
		t.Helper()
		now.Store(int64(at))
		r.ExpireRequests()
		if n := r.Stats().ActiveRequests; n != active {
			t.Fatalf("at %v: %d requests active, want %d", at, n, active)
		}
	}
	f(10*time.Second, 2)
	f(11*time.Second, 1)
	f(time.Minute, 1)
	f(time.Minute+time.Second, 0)
}

// TestShareAllocs checks that sharing adds no allocation to the request path, and that
// applying remote bookings allocates nothing once warm.
func TestShareAllocs(t *testing.T) {
	r := sharedFleet(t, Config{Share: nopSharer{}})
	in := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: prompt(0)})
	var req wire.RouteRequest
	var resp wire.RouteResponse
	var h radix.Hasher
	seqs := h.AppendSequence(nil, prompt(0), 16, radix.LoRASeed(""))
	id := "0123456789abcdef0123456789abcdef0123" // a UUID's length
	step := func() {
		if err := wire.DecodeRouteRequest(in, &req); err != nil {
			t.Fatal(err)
		}
		if err := r.Route(&req, &resp); err != nil {
			t.Fatal(err)
		}
		if err := r.PrefillDone(req.RequestID); err != nil {
			t.Fatal(err)
		}
		if err := r.Complete(req.RequestID); err != nil {
			t.Fatal(err)
		}
		if err := r.BookRemote("replica-b", "m", radix.WorkerKey{ID: 2}, id, seqs, 133, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := r.PrefillDoneRemote("replica-b", id); err != nil {
			t.Fatal(err)
		}
		if err := r.CompleteRemote("replica-b", id); err != nil {
			t.Fatal(err)
		}
	}
	allocFree(t, "a route", step)
}

type nopSharer struct{}

func (nopSharer) Booked(string, radix.WorkerKey, string, []uint64, int64, time.Duration) {}
func (nopSharer) PrefillDone(string)                                                     {}
func (nopSharer) Completed(string)                                                       {}
func (nopSharer) SessionBound(string, string, radix.WorkerKey, time.Duration)            {}
