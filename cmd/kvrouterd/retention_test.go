package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestStreamRetentionGap stops the daemon, publishes while it is down until the stream's small
// retention (--nats-max-bytes) has dropped the events right after its shutdown snapshot, and
// restarts it. The dropped events could have removed anything, so the restarted daemon must
// clear every worker's blocks once and rebuild from what the stream still holds: a block that
// only a dropped event removed is not reported, a block stored after the gap is, and the whole
// index is the reference's "clear everything, then apply the retained events".
//
// The block whose removal is lost belongs to a worker that publishes nothing after it, so no
// skip in that worker's event ids could clear it: only the stream's gap does.
func TestStreamRetentionGap(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary twice")
	}
	ns, pub, ref := testStream(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bin, dir := buildDaemon(t), t.TempDir()
	// Under two hundred bytes a message: the stream keeps about a dozen.
	args := []string{"--nats-url", ns.ClientURL(), "--data-dir", dir, "--snapshot-interval", "0", "--nats-max-bytes", "2048"}

	// chain is the two-block chain of tokens base..base+7 (block size 4).
	chain := func(base uint32) (hashes []uint64, toks []uint32) {
		for i := range uint32(8) {
			toks = append(toks, base+i)
		}
		return []uint64{uint64(base) * 10, uint64(base)*10 + 1}, toks
	}
	store := func(w, id uint64, base uint32) *wire.EventBatch {
		h, toks := chain(base)
		return &wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: id, BlockSize: 4, Hashes: h, Tokens: toks}}}
	}
	publish := func(b *wire.EventBatch) uint64 {
		t.Helper()
		seq, err := pub.Batch(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	streamState := func() jetstream.StreamState {
		t.Helper()
		s, err := js.Stream(ctx, ingest.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State
	}
	const chainA, chainB, chainC, chainD = 100, 200, 300, 400 // their first tokens
	_, toksA := chain(chainA)
	_, toksD := chain(chainD)

	d := startDaemon(t, bin, args...) // creates the stream with the retention limit
	defer func() { d.cmd.Process.Kill(); d.cmd.Wait() }()
	var snapSeq uint64
	for _, bt := range []*wire.EventBatch{store(1, 1, chainA), store(2, 1, chainB), store(1, 2, chainC)} {
		snapSeq = publish(bt)
		if err := ref.Ingest(bt.Worker, bt.Model, bt.Events); err != nil {
			t.Fatal(err)
		}
	}
	ref.Flush()
	want, err := state(inProcessGet(ref))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, d, want)
	if first := streamState().FirstSeq; first != 1 {
		t.Fatalf("the stream dropped sequences before %d while the daemon was reading it; the retention is too small for the test", first)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := exited(t, d); err != nil {
		t.Fatalf("exit: %v\n%s", err, d.log())
	}
	if l := d.log(); !strings.Contains(l, `msg="snapshot written"`) || !strings.Contains(l, fmt.Sprintf("stream_seq=%d ", snapSeq)) {
		t.Fatalf("no shutdown snapshot of sequence %d:\n%s", snapSeq, l)
	}

	// While the daemon is down: worker 1 drops chain A (the event retention will lose), worker
	// 3 stores a chain at a time until the stream no longer holds that removal, then worker 2
	// stores chain D, which the stream keeps.
	type published struct {
		seq uint64
		b   *wire.EventBatch
	}
	removal := &wire.EventBatch{Worker: 1, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Removed, ID: 3, Hashes: []uint64{chainA * 10, chainA*10 + 1}}}}
	down := []published{{publish(removal), removal}}
	for id := uint64(1); streamState().FirstSeq <= down[0].seq; id++ {
		if id > 1000 {
			t.Fatalf("1000 batches did not make the stream drop sequence %d: %+v", down[0].seq, streamState())
		}
		bt := store(3, id, 1000+8*uint32(id))
		down = append(down, published{publish(bt), bt})
	}
	last := store(2, 2, chainD)
	down = append(down, published{publish(last), last})
	first := streamState().FirstSeq
	if first > down[len(down)-1].seq {
		t.Fatalf("the stream kept nothing after the gap: first sequence %d", first)
	}

	// The reference: everything cleared, then what the stream still holds.
	if _, err := ref.ClearAll(); err != nil {
		t.Fatal(err)
	}
	for _, p := range down {
		if p.seq >= first {
			if err := ref.Ingest(p.b.Worker, p.b.Model, p.b.Events); err != nil {
				t.Fatal(err)
			}
		}
	}
	ref.Flush()
	if want, err = state(inProcessGet(ref)); err != nil {
		t.Fatal(err)
	}

	d = startDaemon(t, bin, args...) // returns once /readyz is 200: the retained events are applied
	if l := d.log(); !strings.Contains(l, `msg="restored snapshot"`) || !strings.Contains(l, fmt.Sprintf("stream_seq=%d ", snapSeq)) {
		t.Fatalf("the restart did not restore the snapshot of sequence %d:\n%s", snapSeq, l)
	}
	cl := client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second})
	if n := cachedOn(cl, toksA, 1); n != 0 {
		t.Fatalf("worker 1 reports %d blocks of chain A, whose removal the stream lost (want 0: the index cleared)\n%s", n, d.log())
	}
	if n := cachedOn(cl, toksD, 2); n != 2 {
		t.Fatalf("worker 2 reports %d blocks of chain D, stored after the gap, want 2\n%s", n, d.log())
	}
	got, err := state(httpGet(d.addr))
	if err != nil || got != want {
		t.Fatalf("after the gap the index is not the reference's (err %v):\n%.3000s\nwant\n%.3000s\n%s", err, got, want, d.log())
	}
	page := scrape(d.addr)
	if v := metricValue(t, page, "kvrouterd_stream_gap_clears_total"); v != 1 {
		t.Fatalf("kvrouterd_stream_gap_clears_total %v, want 1", v)
	}
	if v, lost := metricValue(t, page, "kvrouterd_stream_gap_sequences_total"), first-1-snapSeq; v != float64(lost) {
		t.Fatalf("kvrouterd_stream_gap_sequences_total %v, want %d (sequences %d to %d)", v, lost, snapSeq+1, first-1)
	}
	gapLine := fmt.Sprintf("from=%d to=%d ", snapSeq+1, first-1)
	if !hasLine(d.log(), "event-stream sequences were lost: every worker's blocks cleared", gapLine) {
		t.Fatalf("no log line of the clear naming %q:\n%s", gapLine, d.log())
	}
	if code, body := readyz(d); code != http.StatusOK {
		t.Fatalf("/readyz %d %q after the gap was rebuilt", code, body)
	}
	t.Logf("snapshot of sequence %d; the stream kept %d to %d", snapSeq, first, down[len(down)-1].seq)
}

// hasLine reports whether one line of log contains every one of parts.
func hasLine(log string, parts ...string) bool {
	for line := range strings.SplitSeq(log, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}
