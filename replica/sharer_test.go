package replica

import (
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/prometheus/client_golang/prometheus"
)

func TestNew(t *testing.T) {
	a, err := New(Config{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(Config{Logger: quietLog()})
	if len(a.Replica()) != 16 || a.Replica() == b.Replica() {
		t.Fatalf("random replica ids %q and %q", a.Replica(), b.Replica())
	}
	for _, bad := range []string{"a.b", "a b", "a*", strings.Repeat("a", 65)} {
		if _, err := New(Config{Replica: bad}); err == nil {
			t.Fatalf("replica id %q accepted", bad)
		}
	}
	// Not started: nothing is published, and that is counted.
	a.Completed("x")
	if st := a.Stats(); st.Published != 0 || st.PublishErrors != 1 {
		t.Fatalf("%+v", st)
	}
}

// peer is one router replica with its Sharer.
type peer struct {
	r  *router.Router
	sh *Sharer
}

// newPeer starts a router with workers 1 and 2 of model "m" (block size 16) and its Sharer
// on url: on a connection of its own if own, else on a plain one, as if shared.
func newPeer(t testing.TB, url, id string, own bool) *peer {
	return newPeerWith(t, url, id, own, nil)
}

// newPeerWith is newPeer with session affinity (aff non-nil).
func newPeerWith(t testing.TB, url, id string, own bool, aff *router.AffinityConfig) *peer {
	t.Helper()
	sh, err := New(Config{Replica: id, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	r := router.New(router.Config{Shards: 1, Logger: quietLog(), Share: sh, Affinity: aff})
	t.Cleanup(r.Close)
	for w := uint64(1); w <= 2; w++ {
		if err := r.Register(router.Registration{ID: w, Model: "m", BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
	}
	nc := connect(t, url)
	if own {
		nc = ownConn(t, url)
	}
	if err := sh.Start(nc, r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.Close)
	return &peer{r, sh}
}

// active returns worker w's active blocks and prefill tokens as the replica sees them.
func (p *peer) active(w uint64) (blocks, prefill int64) {
	for _, x := range p.r.Workers() {
		if x.ID == w {
			return x.ActiveBlocks, x.ActivePrefill
		}
	}
	return -1, -1
}

// TestSharerReplicas routes on replica A and checks that replica B sees the load, routes
// around it, and sees it go.
func TestSharerReplicas(t *testing.T) {
	s := embedded(t)
	a := newPeer(t, s.ClientURL(), "A", false) // its own messages come back
	b := newPeer(t, s.ClientURL(), "B", true)  // they do not

	// An 8-block prompt on A: no cache and no load anywhere, so either worker.
	var resp wire.RouteResponse
	if err := a.r.Route(&wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: toks(0, 128)}, &resp); err != nil {
		t.Fatal(err)
	}
	w, other := resp.Worker, 3-resp.Worker
	waitFor(t, "B to see A's booking", func() bool { n, p := b.active(w); return n == 8 && p == 128 })

	// A similar request on B, sharing the first 4 blocks. With overlap weight 1, block size 16
	// and nothing cached:
	//   w:     (128 + 128 active) / 16 = 16 prefill blocks + (8 active + 8 − 4 shared) = 28
	//   other:  128 / 16           =  8 prefill blocks + (0 active + 8)             = 16
	// B must avoid w. The same request id as A's must not collide with it.
	if err := b.r.Route(&wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: append(toks(0, 64), toks(5000, 64)...)}, &resp); err != nil {
		t.Fatal(err)
	}
	logits := map[uint64]float64{}
	for _, c := range resp.Candidates {
		logits[c.Worker] = c.Logit
	}
	if resp.Worker != other || logits[w] != 28 || logits[other] != 16 {
		t.Fatalf("B routed to %d with logits %v; want %d, with %d: 28, %d: 16", resp.Worker, logits, other, w, other)
	}
	waitFor(t, "A to see B's booking", func() bool { n, _ := a.active(other); return n == 8 })

	// Prefill done, then completion on A: B's view of w drops to zero; B's own request stays.
	if err := a.r.PrefillDone("req-1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B to see the prefill done", func() bool { _, p := b.active(w); return p == 0 })
	if err := a.r.Complete("req-1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B to see the completion", func() bool { n, _ := b.active(w); return n == 0 })
	if n, _ := b.active(other); n != 8 {
		t.Fatalf("B's own request: %d active blocks, want 8", n)
	}
	if err := b.r.Complete("req-1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A to see B's completion", func() bool { n, _ := a.active(other); return n == 0 })

	// A published booked, prefill done and completed; B booked and completed. A received all
	// five and skipped its own; B, on a connection without echo, received only A's.
	waitFor(t, "the counters", func() bool {
		sa, sb := a.sh.Stats(), b.sh.Stats()
		return sa.Received == 5 && sb.Received == 3 && handled(sa) == 5 && handled(sb) == 3
	})
	sa, sb := a.sh.Stats(), b.sh.Stats()
	if sa.Published != 3 || sa.SkippedOwn != 3 || sa.Applied != 2 || sb.Published != 2 || sb.SkippedOwn != 0 || sb.Applied != 3 {
		t.Fatalf("\nA %+v\nB %+v", sa, sb)
	}
	for _, st := range []Stats{sa, sb} {
		for reason, n := range st.Rejected {
			if n != 0 {
				t.Fatalf("%d rejected for %s", n, reason)
			}
		}
	}
}

// TestSharerAffinity: a session bound on one replica is honoured by the other, through NATS.
func TestSharerAffinity(t *testing.T) {
	s := embedded(t)
	aff := &router.AffinityConfig{TTL: time.Minute}
	a := newPeerWith(t, s.ClientURL(), "A", false, aff)
	b := newPeerWith(t, s.ClientURL(), "B", true, aff)
	var resp wire.RouteResponse
	if err := a.r.Route(&wire.RouteRequest{RequestID: "r1", Model: "m", Tokens: toks(0, 128), SessionID: "sess"}, &resp); err != nil {
		t.Fatal(err)
	}
	bound := resp.Worker
	waitFor(t, "B to learn the binding", func() bool { st, _ := b.r.AffinityStats(); return st.Remote == 1 })
	// On B the other worker is idle and A's worker carries A's booking: without the binding B
	// would choose the other one.
	if err := b.r.Route(&wire.RouteRequest{RequestID: "r2", Model: "m", Tokens: toks(9000, 128), SessionID: "sess"}, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Worker != bound {
		t.Fatalf("B sent the session to %d, want %d (bound on A)", resp.Worker, bound)
	}
}

// TestSharerRejects checks that bad and unusable messages are counted and change nothing.
func TestSharerRejects(t *testing.T) {
	s := embedded(t)
	b := newPeer(t, s.ClientURL(), "B", false)
	nc := connect(t, s.ClientURL())
	send := func(subject string, m *Msg) {
		t.Helper()
		if err := nc.Publish(subject, Append(nil, m)); err != nil {
			t.Fatal(err)
		}
	}
	booked := func(rep, model string, w uint64, id string) *Msg {
		return &Msg{Op: OpBooked, Replica: rep, ID: id, Model: model, Worker: radix.WorkerKey{ID: w}, TTL: 60_000, Seqs: []uint64{1, 2}}
	}
	if err := nc.Publish("kvr.active.C", []byte("KVRA garbage")); err != nil {
		t.Fatal(err)
	}
	send("kvr.active.C", booked("D", "m", 1, "x"))                     // replica is not the subject's
	send("kvr.active.C", booked("C", "nope", 1, "x"))                  // unknown model
	send("kvr.active.C", booked("C", "m", 9, "x"))                     // unknown worker
	send("kvr.active.B", booked("B", "m", 1, "x"))                     // B's own: skipped
	send("kvr.active.C", booked("C", "m", 1, "x"))                     // applied
	send("kvr.active.C", booked("C", "m", 1, "x"))                     // duplicate
	send("kvr.active.C", &Msg{Op: OpCompleted, Replica: "C", ID: "y"}) // unknown request
	m := booked("C", "m", 1, "big")
	m.Prefill = 1 << 63
	send("kvr.active.C", m) // refused by the router
	waitFor(t, "every message", func() bool { st := b.sh.Stats(); return st.Received == 9 && handled(st) == 9 })
	st := b.sh.Stats()
	want := map[string]int64{RejectDecode: 2, RejectModel: 1, RejectWorker: 1, RejectRequest: 1, RejectConflict: 1, RejectInvalid: 1}
	if st.SkippedOwn != 1 || st.Applied != 1 || !mapsEqual(st.Rejected, want) {
		t.Fatalf("%+v, want rejections %v", st, want)
	}
	if n, _ := b.active(1); n != 2 {
		t.Fatalf("worker 1: %d active blocks, want the one booking's 2", n)
	}
	// The collector reports the same counters.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(b.sh.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = m.GetCounter().GetValue()
		}
	}
	if got["kvrouterd_share_received_total"] != 9 || got["kvrouterd_share_rejected_total/decode"] != 2 || got["kvrouterd_share_skipped_own_total"] != 1 {
		t.Fatalf("metrics %v", got)
	}
}

// handled is how many of the messages received a Sharer is done with: skipped, applied or
// rejected. Received counts a message before it is applied, so waiting for Received alone can
// read the other counters while the last message is still being applied.
func handled(st Stats) int64 {
	n := st.SkippedOwn + st.Applied
	for _, k := range st.Rejected {
		n += k
	}
	return n
}

func mapsEqual(a, b map[string]int64) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

// TestSharerAllocs checks that publishing allocates nothing once warm. The connection has no
// echo: receiving the messages back would allocate on the subscription's goroutine.
func TestSharerAllocs(t *testing.T) {
	s := embedded(t)
	sh, err := New(Config{Replica: "A", Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(ownConn(t, s.ClientURL()), nopSink{}); err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	seqs := make([]uint64, 128)
	id := "0b5c1c6e-9a43-4a8e-8f6e-2f0d1e3c4b5a"
	step := func() {
		sh.Booked("meta-llama/Llama-3.1-8B", radix.WorkerKey{ID: 3}, id, seqs, 2048, 300*time.Second)
		sh.PrefillDone(id)
		sh.Completed(id)
	}
	step()
	if raceEnabled {
		t.Skip("allocation counts need a build without -race")
	}
	// AllocsPerRun counts the whole process's allocations, the embedded NATS server's too,
	// which under load resizes its read buffers; and a collection would drop the publish
	// buffers' pooled spares. So the collector is held off, and the sharer is taken to allocate
	// only if three runs all count allocations.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var n float64
	for range 3 {
		if n = testing.AllocsPerRun(200, step); n == 0 {
			break
		}
	}
	if n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
	if st := sh.Stats(); st.PublishErrors != 0 {
		t.Fatalf("%+v", st)
	}
}

type nopSink struct{}

func (nopSink) BookRemote(string, string, radix.WorkerKey, string, []uint64, int64, time.Duration) error {
	return nil
}
func (nopSink) PrefillDoneRemote(string, string) error { return nil }
func (nopSink) CompleteRemote(string, string) error    { return nil }
func (nopSink) BindRemote(string, string, string, radix.WorkerKey, time.Duration) error {
	return nil
}

// TestSharerSinkPanic: a panic while applying another replica's message is recovered on NATS's
// goroutine, counted as rejected for "panic", and the next message is applied.
func TestSharerSinkPanic(t *testing.T) {
	s := embedded(t)
	sh, err := New(Config{Replica: "B", Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	sink := &panicSink{}
	if err := sh.Start(connect(t, s.ClientURL()), sink); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.Close)
	nc := connect(t, s.ClientURL())
	for _, id := range []string{"boom", "fine"} {
		if err := nc.Publish("kvr.active.C", Append(nil, &Msg{Op: OpCompleted, Replica: "C", ID: id})); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both messages", func() bool { return sh.Stats().Received == 2 })
	waitFor(t, "the second applied", func() bool { return sh.Stats().Applied == 1 })
	if st := sh.Stats(); st.Rejected[RejectPanic] != 1 {
		t.Fatalf("%+v: want one rejected for panic", st)
	}
}

type panicSink struct{ nopSink }

func (panicSink) CompleteRemote(_, id string) error {
	if id == "boom" {
		panic("sink failure")
	}
	return nil
}
