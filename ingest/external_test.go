package ingest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/internal/natstest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// natsServer is an external nats-server process (the Debian package's binary).
type natsServer struct {
	t    *testing.T
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
}

func (s *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

func (s *natsServer) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "-a", "127.0.0.1", "-p", fmt.Sprint(s.port), "-js", "-sd", s.dir)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	waitFor(s.t, "nats-server to listen", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (s *natsServer) stop() {
	s.t.Helper()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
	s.cmd = nil
}

// externalNATS runs nats-server from PATH (natstest.Binary: without it the test skips, or
// fails under KVR_REQUIRE_EXTERNAL=1).
func externalNATS(t *testing.T) *natsServer {
	bin := natstest.Binary(t)
	_, p, _ := net.SplitHostPort(freeport.TB(t))
	port, _ := strconv.Atoi(p)
	s := &natsServer{t: t, bin: bin, dir: filepath.Join(t.TempDir(), "js"), port: port}
	s.start()
	t.Cleanup(s.stop)
	return s
}

// streamGen makes random event batches for a few workers: chains of stored blocks over a few
// prompt families, and removals of blocks stored before, with event ids counting from 1.
type streamGen struct {
	rng    *rand.Rand
	ids    map[uint64]uint64
	held   map[uint64][]uint64 // worker → engine hashes it holds, in store order
	next   uint64
	prompt [][]uint32
}

func newStreamGen(seed uint64) *streamGen {
	g := &streamGen{rng: rand.New(rand.NewPCG(seed, 7)), ids: map[uint64]uint64{}, held: map[uint64][]uint64{}, next: 1}
	for f := range 6 {
		g.prompt = append(g.prompt, toks(1000*f, 4*12))
	}
	return g
}

func (g *streamGen) batch() *wire.EventBatch {
	w := uint64(1 + g.rng.IntN(4))
	b := &wire.EventBatch{Worker: w, Model: "m"}
	for range 1 + g.rng.IntN(3) {
		g.ids[w]++
		if h := g.held[w]; len(h) > 0 && g.rng.IntN(4) == 0 {
			b.Events = append(b.Events, kvevent.Event{Kind: kvevent.Removed, ID: g.ids[w], Hashes: []uint64{h[len(h)-1]}})
			g.held[w] = h[:len(h)-1]
			continue
		}
		f, n := g.rng.IntN(len(g.prompt)), 1+g.rng.IntN(12)
		ev := kvevent.Event{Kind: kvevent.Stored, ID: g.ids[w], BlockSize: 4, Tokens: g.prompt[f][:4*n]}
		for range n {
			ev.Hashes = append(ev.Hashes, g.next)
			g.next++
		}
		g.held[w] = append(g.held[w], ev.Hashes...)
		b.Events = append(b.Events, ev)
	}
	return b
}

// TestExternalNATSRestart runs against a real nats-server process: events flow, the server
// stops (the router keeps answering from its index), starts again with its files, more events
// are published, and the router ends with exactly the index of a reference that was handed
// every published event directly.
func TestExternalNATSRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs nats-server")
	}
	s := externalNATS(t)
	ctx := context.Background()
	r := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer r.Close()
	ref := router.New(router.Config{Shards: 2, Logger: quietLog()})
	defer ref.Close()
	cons, err := NewConsumer(ctx, connect(t, s.url()), r, ConsumerConfig{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	pub, err := NewPublisher(connect(t, s.url()), "")
	if err != nil {
		t.Fatal(err)
	}
	g := newStreamGen(1)
	var last uint64
	publish := func(n int) {
		for range n {
			b := g.batch()
			for {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				seq, err := pub.Batch(pctx, b)
				cancel()
				if err == nil {
					last = seq
					break
				}
				time.Sleep(50 * time.Millisecond) // reconnecting
			}
			if err := ref.Ingest(b.Worker, b.Model, b.Events); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(200)
	waitFor(t, "the first events", func() bool { return cons.LastSeq() == last })

	s.stop()
	waitFor(t, "the consumer to notice", func() bool { return !cons.Stats().Connected })
	// The index still answers while the server is down.
	before := matchAll(t, r, g)
	if len(before) == 0 {
		t.Fatal("no worker caches anything")
	}
	s.start()
	publish(200)
	waitFor(t, "the events published after the restart", func() bool { return cons.LastSeq() == last })

	got, want := matchAll(t, r, g), matchAll(t, ref, g)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("index after the restart differs from the reference:\n got %v\nwant %v", got, want)
	}
	st := r.Stats()
	if st.Events.Gaps != 0 || st.Events.ByStatus[shard.Duplicate] != 0 {
		t.Fatalf("event id gaps %d, duplicates %d: events were lost or repeated", st.Events.Gaps, st.Events.ByStatus[shard.Duplicate])
	}
	if cs := cons.Stats(); cs.Gaps != 0 || cs.Rejected[RejectInvalid]+cs.Rejected[RejectDecode] != 0 {
		t.Fatalf("consumer stats %+v", cs)
	}
}

// matchAll returns, for every prompt prefix of g, each worker's cached blocks.
func matchAll(t *testing.T, r *router.Router, g *streamGen) map[string]uint32 {
	t.Helper()
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	var resp wire.RouteResponse
	for f, p := range g.prompt {
		if err := r.Match(&wire.RouteRequest{Model: "m", Tokens: p}, &resp); err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.Candidates {
			if c.CachedBlocks > 0 {
				out[fmt.Sprintf("f%d/w%d", f, c.Worker)] = c.CachedBlocks
			}
		}
	}
	return out
}
