package ingest

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// shareSeeds are messages of every op, in the shapes the router publishes.
func shareSeeds() []*ShareMsg {
	return []*ShareMsg{
		{Op: ShareBooked, Replica: "9f3c2a7be1d04c55", ID: "0b5c1c6e-9a43-4a8e-8f6e-2f0d1e3c4b5a", Model: "meta-llama/Llama-3.1-8B",
			Worker: radix.WorkerKey{ID: 7, Rank: 1}, Prefill: 1029, TTL: 300_000, Seqs: []uint64{1<<63 | 5, 42, 0, ^uint64(0)}},
		{Op: ShareBooked, Replica: "a", ID: "r", Model: "m", TTL: 1}, // a prompt shorter than a block
		{Op: SharePrefillDone, Replica: "9f3c2a7be1d04c55", ID: "0b5c1c6e-9a43-4a8e-8f6e-2f0d1e3c4b5a"},
		{Op: ShareCompleted, Replica: "replica-b", ID: strings.Repeat("x", 1024)},
	}
}

// TestShareLayout pins the byte layout the package documentation gives.
func TestShareLayout(t *testing.T) {
	m := &ShareMsg{Op: ShareBooked, Replica: "AB", ID: "r1", Model: "m", Worker: radix.WorkerKey{ID: 0x0102, Rank: 3},
		Prefill: 0x40, TTL: 1000, Seqs: []uint64{0x1122334455667788}}
	want := "4b565241" + "01" + "01" + "02" + "4142" + // magic, version, op, replica
		"0200" + "7231" + // request id
		"0100" + "6d" + // model
		"0201000000000000" + "03000000" + // worker, rank
		"4000000000000000" + "e8030000" + // prefill tokens, ttl ms
		"01000000" + "8877665544332211" // blocks
	if got := hex.EncodeToString(AppendShare(nil, m)); got != want {
		t.Fatalf("booked:\n got %s\nwant %s", got, want)
	}
	c := &ShareMsg{Op: ShareCompleted, Replica: "AB", ID: "r1"}
	if got := hex.EncodeToString(AppendShare(nil, c)); got != "4b565241"+"01"+"03"+"02"+"4142"+"0200"+"7231" {
		t.Fatalf("completed: %s", got)
	}
	// The size the package documentation quotes.
	big := &ShareMsg{Op: ShareBooked, Replica: strings.Repeat("r", 16), ID: strings.Repeat("i", 36), Model: strings.Repeat("m", 30), TTL: 1, Seqs: make([]uint64, 128)}
	done := &ShareMsg{Op: ShareCompleted, Replica: big.Replica, ID: big.ID}
	if n, k := len(AppendShare(nil, big)), len(AppendShare(nil, done)); n != 1145 || k != 61 {
		t.Fatalf("sizes %d and %d, documented 1145 and 61", n, k)
	}
}

func TestShareRoundTrip(t *testing.T) {
	var m ShareMsg
	for _, want := range shareSeeds() {
		b := AppendShare(nil, want)
		if err := DecodeShare(b, &m); err != nil {
			t.Fatalf("%+v: %v", want, err)
		}
		if m.Op != want.Op || m.Replica != want.Replica || m.ID != want.ID || m.Model != want.Model ||
			m.Worker != want.Worker || m.Prefill != want.Prefill || m.TTL != want.TTL || !slices.Equal(m.Seqs, want.Seqs) {
			t.Fatalf("decoded %+v, want %+v", m, *want)
		}
		if !bytes.Equal(AppendShare(nil, &m), b) {
			t.Fatal("re-encoded differently")
		}
	}
	b := AppendShare(nil, shareSeeds()[0])
	if n := testing.AllocsPerRun(100, func() { _ = DecodeShare(b, &m) }); n != 0 {
		t.Fatalf("decoding allocates %v times", n)
	}
}

func TestDecodeShareErrors(t *testing.T) {
	good := AppendShare(nil, shareSeeds()[0])
	f := func(name string, b []byte, wantField string) {
		t.Helper()
		m := ShareMsg{Seqs: []uint64{9}}
		err := DecodeShare(b, &m)
		if !errors.Is(err, ErrShareMsg) || !strings.Contains(err.Error(), `"`+wantField+`"`) || !strings.Contains(err.Error(), "offset") {
			t.Fatalf("%s: got %v, want an error in field %q", name, err, wantField)
		}
		if m.Replica != "" || m.ID != "" || len(m.Seqs) != 0 {
			t.Fatalf("%s: a failed decode left %+v", name, m)
		}
	}
	patch := func(at int, v ...byte) []byte {
		b := slices.Clone(good)
		copy(b[at:], v)
		return b
	}
	f("empty", nil, "magic")
	f("magic", patch(0, 'X'), "magic")
	f("version", patch(4, 2), "version")
	f("op 0", patch(5, 0), "op")
	f("op 4", patch(5, 4), "op")
	f("no replica", patch(6, 0), "replica_length")
	f("long replica", patch(6, 65), "replica_length")
	f("replica past the end", good[:10], "replica")
	f("no id", patch(7+16, 0, 0), "request_id_length")
	f("long id", patch(7+16, 0x01, 0x04), "request_id_length") // 1025
	f("truncated", good[:len(good)-1], "block_hashes")
	f("trailing", append(slices.Clone(good), 0), "end")
	ttl := 7 + 16 + 2 + 36 + 2 + 23 + 8 + 4 + 8
	f("ttl 0", patch(ttl, 0, 0, 0, 0), "ttl_ms")
	f("huge count", patch(ttl+4, 0xff, 0xff, 0xff, 0xff), "blocks")
	f("count past the end", patch(ttl+4, 5), "block_hashes")
	done := AppendShare(nil, shareSeeds()[2])
	f("completion with a body", append(done, 1, 0, 'm'), "end")
}

// FuzzDecodeShare checks that decoding arbitrary bytes never panics, that whatever decodes
// re-encodes to the same bytes, and that a value decoded into before does not change the result.
func FuzzDecodeShare(f *testing.F) {
	for _, m := range shareSeeds() {
		f.Add(AppendShare(nil, m))
	}
	f.Add([]byte("KVRA\x01\x03"))
	prev := AppendShare(nil, shareSeeds()[0])
	f.Fuzz(func(t *testing.T, b []byte) {
		var fresh, reused ShareMsg
		if err := DecodeShare(prev, &reused); err != nil {
			t.Fatal(err)
		}
		err := DecodeShare(b, &fresh)
		err2 := DecodeShare(b, &reused)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("fresh: %v, reused: %v", err, err2)
		}
		if err != nil {
			if !errors.Is(err, ErrShareMsg) {
				t.Fatalf("error %v does not wrap ErrShareMsg", err)
			}
			return
		}
		if enc := AppendShare(nil, &fresh); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", enc, b)
		}
		if enc := AppendShare(nil, &reused); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded after reuse\n%x\nfrom\n%x", enc, b)
		}
	})
}

func TestNewSharer(t *testing.T) {
	a, err := NewSharer(ShareConfig{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewSharer(ShareConfig{Logger: quietLog()})
	if len(a.Replica()) != 16 || a.Replica() == b.Replica() {
		t.Fatalf("random replica ids %q and %q", a.Replica(), b.Replica())
	}
	for _, bad := range []string{"a.b", "a b", "a*", strings.Repeat("a", 65)} {
		if _, err := NewSharer(ShareConfig{Replica: bad}); err == nil {
			t.Fatalf("replica id %q accepted", bad)
		}
	}
	// Not started: nothing is published, and that is counted.
	a.Completed("x")
	if st := a.Stats(); st.Published != 0 || st.PublishErrors != 1 {
		t.Fatalf("%+v", st)
	}
}

// replica is one router replica with its Sharer.
type replica struct {
	r  *router.Router
	sh *Sharer
}

// shareConn is a connection of a Sharer's own (no echo).
func shareConn(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := (&Stream{URL: url, log: quietLog()}).Dial("kvrouterd-share", nats.NoEcho())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// newReplica starts a router with workers 1 and 2 of model "m" (block size 16) and its Sharer
// on url: on a connection of its own if own, else on a plain one, as if shared.
func newReplica(t testing.TB, url, id string, own bool) *replica {
	t.Helper()
	sh, err := NewSharer(ShareConfig{Replica: id, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	r := router.New(router.Config{Shards: 1, Logger: quietLog(), Share: sh})
	t.Cleanup(r.Close)
	for w := uint64(1); w <= 2; w++ {
		if err := r.Register(router.Registration{ID: w, Model: "m", BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
	}
	nc := connect(t, url)
	if own {
		nc = shareConn(t, url)
	}
	if err := sh.Start(nc, r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.Close)
	return &replica{r, sh}
}

// active returns worker w's active blocks and prefill tokens as the replica sees them.
func (p *replica) active(w uint64) (blocks, prefill int64) {
	for _, x := range p.r.Workers() {
		if x.ID == w {
			return x.ActiveBlocks, x.ActivePrefill
		}
	}
	return -1, -1
}

// TestShareReplicas routes on replica A and checks that replica B sees the load, routes
// around it, and sees it go.
func TestShareReplicas(t *testing.T) {
	s := embedded(t)
	a := newReplica(t, s.ClientURL(), "A", false) // its own messages come back
	b := newReplica(t, s.ClientURL(), "B", true)  // they do not

	// An 8-block prompt on A: no cache and no load anywhere, so either worker.
	var resp wire.RouteResponse
	if err := a.r.Route(&wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: toks(0, 128)}, &resp); err != nil {
		t.Fatal(err)
	}
	w, other := resp.Worker, 3-resp.Worker
	waitFor(t, "B to see A's booking", func() bool { n, p := b.active(w); return n == 8 && p == 128 })

	// A similar request on B, sharing the first 4 blocks. With overlap weight 1, block size 16,
	// nothing cached and prefill tokens not tracked:
	//   w:     8 prefill blocks + (8 active + 8 − 4 shared) decode blocks = 20
	//   other: 8 prefill blocks + (0 active + 8)             decode blocks = 16
	// B must avoid w. The same request id as A's must not collide with it.
	if err := b.r.Route(&wire.RouteRequest{RequestID: "req-1", Model: "m", Tokens: append(toks(0, 64), toks(5000, 64)...)}, &resp); err != nil {
		t.Fatal(err)
	}
	logits := map[uint64]float64{}
	for _, c := range resp.Candidates {
		logits[c.Worker] = c.Logit
	}
	if resp.Worker != other || logits[w] != 20 || logits[other] != 16 {
		t.Fatalf("B routed to %d with logits %v; want %d, with %d: 20, %d: 16", resp.Worker, logits, other, w, other)
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
		return sa.Received == 5 && sb.Received == 3
	})
	sa, sb := a.sh.Stats(), b.sh.Stats()
	if sa.Published != 3 || sa.SkippedOwn != 3 || sa.Applied != 2 || sb.Published != 2 || sb.SkippedOwn != 0 || sb.Applied != 3 {
		t.Fatalf("\nA %+v\nB %+v", sa, sb)
	}
	for _, st := range []ShareStats{sa, sb} {
		for reason, n := range st.Rejected {
			if n != 0 {
				t.Fatalf("%d rejected for %s", n, reason)
			}
		}
	}
}

// TestShareRejects checks that bad and unusable messages are counted and change nothing.
func TestShareRejects(t *testing.T) {
	s := embedded(t)
	b := newReplica(t, s.ClientURL(), "B", false)
	nc := connect(t, s.ClientURL())
	send := func(subject string, m *ShareMsg) {
		t.Helper()
		if err := nc.Publish(subject, AppendShare(nil, m)); err != nil {
			t.Fatal(err)
		}
	}
	booked := func(rep, model string, w uint64, id string) *ShareMsg {
		return &ShareMsg{Op: ShareBooked, Replica: rep, ID: id, Model: model, Worker: radix.WorkerKey{ID: w}, TTL: 60_000, Seqs: []uint64{1, 2}}
	}
	if err := nc.Publish("kvr.active.C", []byte("KVRA garbage")); err != nil {
		t.Fatal(err)
	}
	send("kvr.active.C", booked("D", "m", 1, "x"))                             // replica is not the subject's
	send("kvr.active.C", booked("C", "nope", 1, "x"))                          // unknown model
	send("kvr.active.C", booked("C", "m", 9, "x"))                             // unknown worker
	send("kvr.active.B", booked("B", "m", 1, "x"))                             // B's own: skipped
	send("kvr.active.C", booked("C", "m", 1, "x"))                             // applied
	send("kvr.active.C", booked("C", "m", 1, "x"))                             // duplicate
	send("kvr.active.C", &ShareMsg{Op: ShareCompleted, Replica: "C", ID: "y"}) // unknown request
	m := booked("C", "m", 1, "big")
	m.Prefill = 1 << 63
	send("kvr.active.C", m) // refused by the router
	waitFor(t, "every message", func() bool { return b.sh.Stats().Received == 9 })
	st := b.sh.Stats()
	want := map[string]int64{ShareRejectDecode: 2, ShareRejectModel: 1, ShareRejectWorker: 1, ShareRejectRequest: 1, ShareRejectConflict: 1, ShareRejectInvalid: 1}
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
	sh, err := NewSharer(ShareConfig{Replica: "A", Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(shareConn(t, s.ClientURL()), nopShareSink{}); err != nil {
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
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
	if st := sh.Stats(); st.PublishErrors != 0 {
		t.Fatalf("%+v", st)
	}
}

type nopShareSink struct{}

func (nopShareSink) BookRemote(string, string, radix.WorkerKey, string, []uint64, int64, time.Duration) error {
	return nil
}
func (nopShareSink) PrefillDoneRemote(string, string) error { return nil }
func (nopShareSink) CompleteRemote(string, string) error    { return nil }

// TestShareSinkPanic: a panic while applying another replica's message is recovered on NATS's
// goroutine, counted as rejected for "panic", and the next message is applied.
func TestShareSinkPanic(t *testing.T) {
	s := embedded(t)
	sh, err := NewSharer(ShareConfig{Replica: "B", Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	sink := &panicShareSink{}
	if err := sh.Start(connect(t, s.ClientURL()), sink); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.Close)
	nc := connect(t, s.ClientURL())
	for _, id := range []string{"boom", "fine"} {
		if err := nc.Publish("kvr.active.C", AppendShare(nil, &ShareMsg{Op: ShareCompleted, Replica: "C", ID: id})); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both messages", func() bool { return sh.Stats().Received == 2 })
	waitFor(t, "the second applied", func() bool { return sh.Stats().Applied == 1 })
	if st := sh.Stats(); st.Rejected[ShareRejectPanic] != 1 {
		t.Fatalf("%+v: want one rejected for panic", st)
	}
}

type panicShareSink struct{ nopShareSink }

func (panicShareSink) CompleteRemote(_, id string) error {
	if id == "boom" {
		panic("sink failure")
	}
	return nil
}
