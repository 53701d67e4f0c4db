package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/internal/natstest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDaemonNATSCluster runs two kvrouterd replicas on a three-node NATS cluster (nats-server
// processes on loopback, the stream replicated on all three) while events are published without
// pause, straight to the stream as engines and bridges do and through the replicas' API. It
// kills (SIGKILL) the node leading the stream and starts it again, then kills a replica and
// starts it again from its snapshot and the stream. Publishers retry what was not acknowledged,
// as real ones do. At the end both replicas must hold exactly the index of a reference router
// that was handed every acknowledged batch once: the same /dump, the same workers and event
// cursors, the same answer to every query; and neither may have seen a gap in the stream.
//
// KVR_TEST_CLUSTER=long (make test-cluster) publishes more, kills each node in turn — the stream
// leader, the meta leader, a follower — and each replica, and once kills a node while a replica
// is down.
func TestDaemonNATSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs three nats-server processes and two replicas")
	}
	natsBin := natstest.Binary(t)
	long := os.Getenv("KVR_TEST_CLUSTER") == "long"
	rounds, perPhase, limit := 1, 150, 4*time.Minute
	if long {
		rounds, perPhase, limit = 3, 2000, 15*time.Minute
	}
	// Bounds a run that hangs; no assertion depends on how long anything takes.
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	began := time.Now()

	cl := natstest.StartCluster(t, natsBin)
	bin := buildDaemon(t)
	replicaArgs := func(id, dir string) []string {
		return []string{"--nats-url", cl.URLs(), "--nats-replicas", "3", "--data-dir", dir,
			"--snapshot-interval", "200ms", "--replica-id", id}
	}
	a := &clusterReplica{t: t, bin: bin, addr: freeport.TB(t), args: replicaArgs("a", t.TempDir())}
	b := &clusterReplica{t: t, bin: bin, addr: freeport.TB(t), args: replicaArgs("b", t.TempDir())}
	for _, r := range []*clusterReplica{a, b} {
		r.start()
		t.Cleanup(r.kill)
	}

	admin, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	// streamInfo asks the cluster about the stream until it answers: during an election it
	// may not.
	streamInfo := func() *jetstream.StreamInfo {
		t.Helper()
		for {
			ictx, icancel := context.WithTimeout(ctx, 2*time.Second)
			s, err := js.Stream(ictx, ingest.DefaultStream)
			var info *jetstream.StreamInfo
			if err == nil {
				info, err = s.Info(ictx)
			}
			icancel()
			if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
				return info
			}
			if ctx.Err() != nil {
				t.Fatalf("the stream's info: %v\n%s", err, cl.Logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The replicas created the stream on all three nodes.
	if info := streamInfo(); info.Config.Replicas != 3 || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream created with %d replicas, on leader %s and %d others; want 3 in all", info.Config.Replicas, info.Cluster.Leader, len(info.Cluster.Replicas))
	}

	load := startClusterLoad(ctx, t, cl.URLs(), []*clusterReplica{a, b})
	// phase lets the publishers have perPhase more batches acknowledged.
	phase := func(what string) {
		t.Helper()
		if err := load.await(ctx, perPhase); err != nil {
			t.Fatalf("%s: %v\n%s\n--- replica a\n%s\n--- replica b\n%s", what, err, cl.Logs(), a.log(), b.log())
		}
	}
	// killNode kills a node of the cluster while the publishers go on, and starts it again.
	nodeKills := 0
	killNode := func(n *natstest.Node, why string) {
		t.Helper()
		nodeKills++
		t.Logf("killing nats-server %s (%s)", n.Name, why)
		n.Kill()
		phase("publishing with " + n.Name + " down")
		n.Start()
		cl.AwaitJoined(n)
		phase("publishing after " + n.Name + " came back")
	}
	// killReplica kills a replica while the publishers go on, and starts it again: it restores
	// its newest snapshot and replays the stream after it. during, if set, runs while it is down.
	killReplica := func(r *clusterReplica, during func()) {
		t.Helper()
		t.Logf("killing replica %s", r.id())
		r.kill()
		phase("publishing with replica " + r.id() + " down")
		if during != nil {
			during()
		}
		r.start()
		if !strings.Contains(r.log(), "restored snapshot") {
			t.Fatalf("replica %s restarted without restoring a snapshot:\n%s", r.id(), r.log())
		}
		phase("publishing after replica " + r.id() + " came back")
	}

	phase("publishing on the whole cluster")
	for round := range rounds {
		info := streamInfo()
		switch round {
		case 0:
			killNode(cl.Node(info.Cluster.Leader), "the stream's leader")
		case 1:
			leader := cl.Node(cl.Nodes[0].MetaLeader())
			if leader == nil {
				t.Fatalf("no JetStream meta leader\n%s", cl.Logs())
			}
			killNode(leader, "the JetStream meta leader")
		default:
			killNode(cl.Node(info.Cluster.Replicas[0].Name), "a follower of the stream")
		}
		r := []*clusterReplica{b, a}[round%2]
		var during func()
		if long && round == rounds-1 {
			during = func() { killNode(cl.Node(streamInfo().Cluster.Leader), "the stream's leader, with a replica down") }
		}
		killReplica(r, during)
	}
	load.stop()
	if err := load.err(); err != nil {
		t.Fatalf("publisher: %v", err)
	}

	want, err := load.state()
	if err != nil {
		t.Fatal(err)
	}
	// Bounds replicas that never converge, sooner than the whole run's limit.
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	defer scancel()
	for _, r := range []*clusterReplica{a, b} {
		r.awaitState(sctx, want)
	}
	da, _ := httpGet(a.addr)("/dump?form=sequence")
	db, _ := httpGet(b.addr)("/dump?form=sequence")
	if string(da) != string(db) || len(da) < 100 {
		t.Fatalf("the replicas' /dump differ (%d and %d bytes)", len(da), len(db))
	}
	// The same queries get the same answers from both replicas and the reference.
	prompts := clusterPrompts()
	wantAnswers := load.answers(prompts)
	cached := 0
	for _, a := range wantAnswers {
		if a != "" {
			cached++
		}
	}
	if cached < len(prompts)/4 {
		t.Fatalf("only %d of %d prompts find cached blocks in the reference: too little to compare", cached, len(prompts))
	}
	for _, r := range []*clusterReplica{a, b} {
		if got := r.answers(prompts); !slices.Equal(got, wantAnswers) {
			for i := range got {
				if got[i] != wantAnswers[i] {
					t.Fatalf("replica %s answers prompt %d with %s, the reference with %s", r.id(), i, got[i], wantAnswers[i])
				}
			}
		}
		page := scrape(r.addr)
		if g, s := sample(t, page, "kvrouterd_stream_gap_clears_total"), sample(t, page, "kvrouterd_stream_gap_sequences_total"); g != 0 || s != 0 {
			t.Fatalf("replica %s: %v gap clears, %v stream sequences lost", r.id(), g, s)
		}
		t.Logf("replica %s: %v stalled consumers restarted since its last start", r.id(), sample(t, page, "kvrouterd_stream_consumer_restarts_total"))
	}
	st := load.stats()
	t.Logf("%d batches (%d events) acknowledged: %d straight to the stream, %d through the API; %d publishes retried; %d node kills, %d replica kills; %d of %d prompts answered alike with cached blocks; %v",
		st.batches, st.events, st.direct, st.api, st.retries, nodeKills, rounds, cached, len(prompts), time.Since(began).Round(time.Second))
}

// clusterReplica is one kvrouterd of TestDaemonNATSCluster: it keeps its HTTP address and data
// directory across restarts.
type clusterReplica struct {
	t    *testing.T
	bin  string
	addr string
	args []string
	d    *proc
	runs []*proc // every run, for the logs
}

func (r *clusterReplica) id() string { return r.args[slices.Index(r.args, "--replica-id")+1] }

// start runs the replica and waits until /readyz answers 200: its snapshot restored and every
// event the stream held at start applied.
func (r *clusterReplica) start() {
	r.t.Helper()
	r.d = &proc{addr: r.addr, logs: new(bytes.Buffer), mu: new(sync.Mutex)}
	r.runs = append(r.runs, r.d)
	r.d.cmd = exec.Command(r.bin, append([]string{"--http-addr", r.addr, "--shards", "2"}, r.args...)...)
	r.d.cmd.Stderr = lockedWriter{r.d.mu, r.d.logs}
	if err := r.d.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	waitReady(r.t, r.d)
}

// kill ends the replica with SIGKILL, if it runs.
func (r *clusterReplica) kill() {
	if r.d == nil || r.d.cmd.Process == nil || r.d.cmd.ProcessState != nil {
		return
	}
	_ = r.d.cmd.Process.Signal(syscall.SIGKILL)
	_ = r.d.cmd.Wait()
}

// log is the output of every run, but for the line of each snapshot written.
func (r *clusterReplica) log() string {
	var b strings.Builder
	for i, d := range r.runs {
		fmt.Fprintf(&b, "=== run %d\n", i+1)
		for l := range strings.SplitSeq(d.log(), "\n") {
			if !strings.Contains(l, "snapshot written") {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

// awaitState waits until the replica's state (see state) is want.
func (r *clusterReplica) awaitState(ctx context.Context, want string) {
	r.t.Helper()
	var got string
	var err error
	for ctx.Err() == nil {
		if got, err = state(httpGet(r.addr)); err == nil && got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("replica %s never reached the reference's state (err %v); lines only in the reference:\n%s\nlines only in the replica:\n%s\n%s",
		r.id(), err, lineDiff(want, got), lineDiff(got, want), r.log())
}

// answers are the replica's answers to prompts (see answer).
func (r *clusterReplica) answers(prompts [][]uint32) []string {
	c := client.New(client.Config{Addr: r.addr, Timeout: 5 * time.Second})
	var out []string
	for _, p := range prompts {
		var resp wire.RouteResponse
		err := c.Match(&wire.RouteRequest{Model: "m", Tokens: p}, &resp)
		out = append(out, answer(&resp, err))
	}
	return out
}

// answer is what a match says of the cache: each worker and rank that holds blocks, and how
// many (load differs between replicas and the reference, which routes nothing).
func answer(resp *wire.RouteResponse, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	var s []string
	for _, c := range resp.Candidates {
		if c.CachedBlocks > 0 {
			s = append(s, fmt.Sprintf("%d/%d:%d", c.Worker, c.Rank, c.CachedBlocks))
		}
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}

// clusterPrompts are prompts over the block tree of streamGen: every path up to depth 3, and
// deeper ones at random.
func clusterPrompts() [][]uint32 {
	var out [][]uint32
	var walk func(prefix []uint32, path, depth int)
	walk = func(prefix []uint32, path, depth int) {
		if depth > 0 {
			out = append(out, prefix)
		}
		if depth == 3 {
			return
		}
		for c := 1; c <= 4; c++ {
			p := path*4 + c
			walk(append(slices.Clip(prefix), uint32(p), uint32(p)+1, uint32(p)+2, uint32(p)+3), p, depth+1)
		}
	}
	walk(nil, 0, 0)
	r := rand.New(rand.NewPCG(11, 12))
	for range 40 {
		var toks []uint32
		for p, d := 0, 0; d < 8; d++ {
			p = p*4 + 1 + r.IntN(4)
			toks = append(toks, uint32(p), uint32(p)+1, uint32(p)+2, uint32(p)+3)
		}
		out = append(out, toks)
	}
	return out
}

// lineDiff is the lines of a that b lacks, at most 20, each cut to 300 bytes.
func lineDiff(a, b string) string {
	have := map[string]bool{}
	for l := range strings.SplitSeq(b, "\n") {
		have[l] = true
	}
	var out []string
	for l := range strings.SplitSeq(a, "\n") {
		if !have[l] && len(out) < 20 {
			if len(l) > 300 {
				l = fmt.Sprintf("%.300s… (%d bytes)", l, len(l))
			}
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// clusterLoad publishes batches of streamGen until stopped: workers 1 to 6 straight to the
// stream (ingest.Publisher, as a bridge does), workers 101 and 102 through the replicas' API
// (registered there, their batches posted to /v1/events of a replica that answers). A batch
// that is not acknowledged is sent again until it is (it may be in the stream already: the
// replicas drop the copy by its event ids); one that is goes to the reference router, once.
// Stopping lets the batch in flight be acknowledged, which may be in the stream whatever its
// publisher heard. Its methods are for the test's goroutine.
type clusterLoad struct {
	t        *testing.T
	quit     atomic.Bool
	wg       sync.WaitGroup
	mu       sync.Mutex // the reference and firstErr
	ref      *router.Router
	firstErr error

	direct, api, events, retries atomic.Int64
}

func startClusterLoad(ctx context.Context, t *testing.T, urls string, replicas []*clusterReplica) *clusterLoad {
	t.Helper()
	l := &clusterLoad{t: t, ref: router.New(router.Config{Shards: 2, Logger: quiet()})}
	t.Cleanup(l.ref.Close)
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := ingest.NewPublisher(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	var clients []*client.Client
	for _, r := range replicas {
		// The API answers once the replica applied the batch, which waits up to 10 s on the stream.
		clients = append(clients, client.New(client.Config{Addr: r.addr, Timeout: 15 * time.Second}))
	}
	for _, w := range []uint64{101, 102} {
		if err := clients[0].Register(client.Worker{ID: w, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
		if err := l.ref.Register(router.Registration{ID: w, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		g := &streamGen{r: rand.New(rand.NewPCG(21, 22)), next: map[uint64]uint64{}, held: map[uint64][]uint64{}}
		for !l.quit.Load() {
			b := g.batch(6)
			for {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := pub.Batch(pctx, b)
				cancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					l.fail(fmt.Errorf("worker %d's batch never acknowledged: %w", b.Worker, err))
					return
				}
				l.retries.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
			l.acked(b, l.ref.Ingest(b.Worker, b.Model, b.Events))
			l.direct.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	go func() {
		defer l.wg.Done()
		g := &streamGen{r: rand.New(rand.NewPCG(23, 24)), next: map[uint64]uint64{}, held: map[uint64][]uint64{}}
		for n := 0; !l.quit.Load(); n++ {
			b := g.batch(2)
			b.Worker += 100
			for try := n; ; try++ {
				_, err := clients[try%len(clients)].Events(b)
				if err == nil {
					break
				}
				if se := (*client.StatusError)(nil); errors.As(err, &se) && se.Code != 503 {
					l.fail(fmt.Errorf("POST /v1/events: %w", err))
					return
				}
				if ctx.Err() != nil {
					l.fail(fmt.Errorf("worker %d's batch never acknowledged: %w", b.Worker, err))
					return
				}
				l.retries.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
			_, err := l.ref.ApplyEvents(b, nil)
			l.acked(b, err)
			l.api.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return l
}

// acked records an acknowledged batch, applied to the reference with error err.
func (l *clusterLoad) acked(b *wire.EventBatch, err error) {
	l.events.Add(int64(len(b.Events)))
	if err != nil {
		l.fail(fmt.Errorf("the reference refused worker %d's batch: %w", b.Worker, err))
	}
}

func (l *clusterLoad) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.firstErr == nil {
		l.firstErr = err
	}
}

func (l *clusterLoad) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstErr
}

// await waits until n more batches are acknowledged.
func (l *clusterLoad) await(ctx context.Context, n int) error {
	target := l.direct.Load() + l.api.Load() + int64(n)
	for l.direct.Load()+l.api.Load() < target {
		if err := l.err(); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d batches acknowledged, %d retries: %w", l.direct.Load()+l.api.Load(), target, l.retries.Load(), ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// stop ends the publishers, once their batches in flight are acknowledged, and waits for them.
func (l *clusterLoad) stop() {
	l.quit.Store(true)
	l.wg.Wait()
}

// state is the reference's state (see state), once stopped.
func (l *clusterLoad) state() (string, error) {
	if err := l.ref.Flush(); err != nil {
		return "", err
	}
	return state(inProcessGet(l.ref))
}

// answers are the reference's answers to prompts, once stopped.
func (l *clusterLoad) answers(prompts [][]uint32) []string {
	var out []string
	for _, p := range prompts {
		var resp wire.RouteResponse
		err := l.ref.Match(&wire.RouteRequest{Model: "m", Tokens: p}, &resp)
		out = append(out, answer(&resp, err))
	}
	return out
}

type loadStats struct{ batches, events, direct, api, retries int64 }

func (l *clusterLoad) stats() loadStats {
	d, a := l.direct.Load(), l.api.Load()
	return loadStats{batches: d + a, events: l.events.Load(), direct: d, api: a, retries: l.retries.Load()}
}
