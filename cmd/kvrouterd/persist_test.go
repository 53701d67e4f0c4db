package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/kvrouterd/kvrouterd/wire"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/valyala/fasthttp"
)

// streamGen makes event batches for workers 1..workers of model "m" (block size 4): chains over
// a small tree of blocks, removals, clears, numbered ids.
type streamGen struct {
	r    *rand.Rand
	next map[uint64]uint64
	held map[uint64][]uint64
}

func (g *streamGen) batch(workers int) *wire.EventBatch {
	w := uint64(1 + g.r.IntN(workers))
	var evs []kvevent.Event
	for range 1 + g.r.IntN(4) {
		ev := kvevent.Event{}
		switch x := g.r.IntN(100); {
		case x < 2:
			ev.Kind = kvevent.Cleared
			g.held[w] = nil
		case x < 30 && len(g.held[w]) > 0:
			h := g.held[w]
			i := g.r.IntN(len(h))
			ev.Kind, ev.Hashes = kvevent.Removed, []uint64{h[i]}
			g.held[w] = slices.Delete(h, i, i+1)
		default:
			ev.Kind, ev.BlockSize = kvevent.Stored, 4
			path, depth := 0, 1+g.r.IntN(8)
			for range depth {
				path = path*4 + g.r.IntN(4) + 1
			}
			for p, d := path, depth; d > 0; p, d = p/4, d-1 {
				ev.Hashes = append([]uint64{uint64(p)<<16 | w}, ev.Hashes...)
				ev.Tokens = append([]uint32{uint32(p), uint32(p) + 1, uint32(p) + 2, uint32(p) + 3}, ev.Tokens...)
			}
			g.held[w] = append(g.held[w], ev.Hashes...)
		}
		g.next[w]++
		ev.ID = g.next[w]
		evs = append(evs, ev)
	}
	return &wire.EventBatch{Worker: w, Model: "m", Events: evs}
}

// state is a kvrouterd's index as the HTTP API shows it: /dump (every block of every worker,
// sorted) and every worker's cached blocks and last event id.
func state(get func(path string) ([]byte, error)) (string, error) {
	dump, err := get("/dump?form=sequence")
	if err != nil {
		return "", err
	}
	body, err := get("/v1/workers")
	if err != nil {
		return "", err
	}
	var ws struct {
		Workers []router.WorkerInfo `json:"workers"`
	}
	if err := json.Unmarshal(body, &ws); err != nil {
		return "", fmt.Errorf("/v1/workers: %w", err)
	}
	var b strings.Builder
	b.Write(dump)
	slices.SortFunc(ws.Workers, func(a, b router.WorkerInfo) int { return int(a.ID) - int(b.ID) })
	for _, w := range ws.Workers {
		fmt.Fprintf(&b, "\n%d/%d blocks=%d last=%d", w.ID, w.Rank, w.CachedBlocks, w.LastEventID)
	}
	return b.String(), nil
}

func httpGet(addr string) func(string) ([]byte, error) {
	return func(path string) ([]byte, error) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s: %s", path, resp.Status)
		}
		return io.ReadAll(resp.Body)
	}
}

// inProcessGet serves the same API from a router in this process.
func inProcessGet(r *router.Router) func(string) ([]byte, error) {
	srv := server.New(r, server.Config{})
	return func(path string) ([]byte, error) {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI(path)
		ctx.Request.Header.SetMethod("GET")
		srv.Handle(&ctx)
		if ctx.Response.StatusCode() != http.StatusOK {
			return nil, fmt.Errorf("%s: %d %s", path, ctx.Response.StatusCode(), ctx.Response.Body())
		}
		return bytes.Clone(ctx.Response.Body()), nil
	}
}

// proc is one run of the daemon's binary.
type proc struct {
	cmd  *exec.Cmd
	addr string
	logs *bytes.Buffer
	mu   *sync.Mutex
}

func (d *proc) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func startDaemon(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	d := launchDaemon(t, bin, args...)
	waitReady(t, d)
	return d
}

// launchDaemon starts the binary and returns at once.
func launchDaemon(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	d := &proc{addr: freeport.TB(t), logs: new(bytes.Buffer), mu: new(sync.Mutex)}
	d.cmd = exec.Command(bin, append([]string{"--http-addr", d.addr, "--shards", "2"}, args...)...)
	d.cmd.Stderr = lockedWriter{d.mu, d.logs}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return d
}

// waitReady waits until d's /readyz answers 200.
func waitReady(t *testing.T, d *proc) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get("http://" + d.addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			d.cmd.Process.Kill()
			t.Fatalf("daemon not ready:\n%s", d.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitState waits until the daemon's state is want.
func waitState(t *testing.T, d *proc, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got string
	var err error
	for time.Now().Before(deadline) {
		if got, err = state(httpGet(d.addr)); err == nil && got == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the daemon's state never became the reference's (err %v)\ndaemon:\n%.3000s\nreference:\n%.3000s\nlogs:\n%s", err, got, want, d.log())
}

// TestDaemonCrashSafety kills the daemon (SIGKILL) at random moments while events stream in and
// snapshots are being written, restarts it on the same data directory each time, and checks at
// the end that its index is exactly the one built from every published event: nothing lost,
// nothing applied twice. The stream lives in a NATS server of this process, so it outlives the
// daemon, as a production stream outlives a replica. It then stops the daemon gracefully and
// checks that the restart restores the same state from the shutdown snapshot alone.
func TestDaemonCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and restarts it 20 times")
	}
	ns, pub, ref := testStream(t)
	bin, dir := buildDaemon(t), t.TempDir()
	args := func(r *rand.Rand) []string {
		return []string{"--nats-url", ns.ClientURL(), "--data-dir", dir,
			"--snapshot-interval", fmt.Sprint(time.Duration(20+r.IntN(200)) * time.Millisecond)}
	}

	// The publisher: batches in order, each applied to the reference once the stream holds it.
	stop := make(chan struct{})
	var published sync.WaitGroup
	var pubErr error
	published.Add(1)
	go func() {
		defer published.Done()
		g := &streamGen{r: rand.New(rand.NewPCG(1, 2)), next: map[uint64]uint64{}, held: map[uint64][]uint64{}}
		for {
			select {
			case <-stop:
				return
			default:
			}
			b := g.batch(6)
			// A bound on a hung server, not a timing: the daemon being killed and rebuilt on two
			// loaded cores can hold the stream's acknowledgement up for seconds.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			_, err := pub.Batch(ctx, b)
			cancel()
			if err != nil {
				pubErr = err
				return
			}
			if err := ref.Ingest(b.Worker, b.Model, b.Events); err != nil {
				pubErr = err
				return
			}
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		}
	}()

	r := rand.New(rand.NewPCG(3, 4))
	restored := 0
	for i := range 20 {
		d := startDaemon(t, bin, args(r)...)
		if strings.Contains(d.log(), "restored snapshot") {
			restored++
		}
		time.Sleep(time.Duration(100+r.IntN(700)) * time.Millisecond)
		if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = d.cmd.Wait()
		if strings.Contains(d.log(), "panic") {
			t.Fatalf("run %d panicked:\n%s", i, d.log())
		}
	}
	d := startDaemon(t, bin, args(r)...)
	close(stop)
	published.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	ref.Flush()
	want, err := state(inProcessGet(ref))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(want, "blocks") || strings.Count(want, "\n") < 6 {
		t.Fatalf("the reference holds too little to compare:\n%s", want)
	}
	waitState(t, d, want)
	if restored < 10 {
		t.Errorf("only %d of 20 restarts restored a snapshot", restored)
	}

	// A graceful stop writes a snapshot of everything; the next start restores it and has
	// nothing to replay.
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = d.cmd.Wait()
	d = startDaemon(t, bin, args(r)...)
	defer func() { d.cmd.Process.Kill(); d.cmd.Wait() }()
	got, err := state(httpGet(d.addr))
	if err != nil || got != want {
		t.Fatalf("after a graceful restart (err %v):\n%.2000s\nwant\n%.2000s\n%s", err, got, want, d.log())
	}
	if !strings.Contains(d.log(), "restored snapshot") {
		t.Fatalf("the graceful restart restored nothing:\n%s", d.log())
	}
	t.Logf("%d of 20 killed runs restarted from a snapshot", restored)
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testStream is a NATS server in this process (without authentication: the daemons reach it
// with --nats-url), a publisher on it, and the reference router the
// test feeds every published batch; all stopped when the test ends.
func testStream(t *testing.T) (*natsserver.Server, *ingest.Publisher, *router.Router) {
	t.Helper()
	ns, err := ingest.StartEmbedded(ingest.EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0", NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := ingest.NewPublisher(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	ref := router.New(router.Config{Shards: 2, ClearOnGap: true, Logger: quiet()})
	t.Cleanup(ref.Close)
	return ns, pub, ref
}

// TestReplicas runs two daemons on one stream: the second starts from the first's snapshot
// (--bootstrap-from), both converge to the index built from every published event, and a
// request routed by one counts in the other's load view until it completes.
func TestReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary twice")
	}
	ns, pub, ref := testStream(t)
	g := &streamGen{r: rand.New(rand.NewPCG(5, 6)), next: map[uint64]uint64{}, held: map[uint64][]uint64{}}
	publish := func(n int) {
		for range n {
			b := g.batch(4)
			if _, err := pub.Batch(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			if err := ref.Ingest(b.Worker, b.Model, b.Events); err != nil {
				t.Fatal(err)
			}
		}
		ref.Flush()
	}
	bin := buildDaemon(t)
	a := startDaemon(t, bin, "--nats-url", ns.ClientURL(), "--data-dir", t.TempDir(), "--snapshot-interval", "50ms", "--replica-id", "a")
	defer func() { a.cmd.Process.Kill(); a.cmd.Wait() }()
	publish(300) // a created the stream
	want, err := state(inProcessGet(ref))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, a, want)
	// Wait for a snapshot that covers it all, then bootstrap b from a.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(a.log(), "snapshot written") || !strings.Contains(a.log(), "stream_seq=300") {
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot of sequence 300:\n%s", a.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	b := startDaemon(t, bin, "--nats-url", ns.ClientURL(), "--data-dir", t.TempDir(), "--bootstrap-from", "http://"+a.addr, "--replica-id", "b")
	defer func() { b.cmd.Process.Kill(); b.cmd.Wait() }()
	if !strings.Contains(b.log(), "bootstrapped from a peer's snapshot") || !strings.Contains(b.log(), "restored snapshot") {
		t.Fatalf("b did not start from a's snapshot:\n%s", b.log())
	}
	publish(200)
	if want, err = state(inProcessGet(ref)); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, want)
	waitState(t, b, want)

	// A request routed by a counts in b's view of the chosen worker's load.
	// listed is d's /v1/workers.
	listed := func(d *proc) []router.WorkerInfo {
		t.Helper()
		body, err := httpGet(d.addr)("/v1/workers")
		if err != nil {
			t.Fatal(err)
		}
		var ws struct {
			Workers []router.WorkerInfo `json:"workers"`
		}
		if err := json.Unmarshal(body, &ws); err != nil {
			t.Fatal(err)
		}
		return ws.Workers
	}
	active := func(d *proc, worker uint64) int64 {
		for _, w := range listed(d) {
			if w.ID == worker {
				return w.ActiveBlocks
			}
		}
		return -1
	}
	ca := client.New(client.Config{Addr: a.addr, Timeout: 5 * time.Second})
	var resp wire.RouteResponse
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	if err := ca.Route(&wire.RouteRequest{RequestID: "shared-1", Model: "m", Tokens: toks}, &resp); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s:\n%s", what, b.log())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("b never saw a's booking", func() bool { return active(b, resp.Worker) == 16 })
	if err := ca.Complete("shared-1"); err != nil {
		t.Fatal(err)
	}
	waitFor("b never saw a's completion", func() bool { return active(b, resp.Worker) == 0 })

	// Registrations, events and removals posted to one replica reach the other through the
	// stream, and each is answered once the replica asked has made it.
	call := func(d *proc, method, path, body string, want int) string {
		t.Helper()
		return daemonCall(t, d.addr, method, path, body, want)
	}
	ranks := func(d *proc, worker uint64) []uint32 {
		var rs []uint32
		for _, w := range listed(d) {
			if w.ID == worker {
				rs = append(rs, w.Rank)
			}
		}
		return rs
	}
	call(a, "POST", "/v1/workers", `{"worker_id": 900, "model": "m2", "block_size": 4, "dp_ranks": [0, 1]}`, 201)
	if got := ranks(a, 900); !slices.Equal(got, []uint32{0, 1}) {
		t.Fatalf("a lists worker 900's ranks %v when its registration was answered", got)
	}
	call(b, "POST", "/register", `{"instance_id": 901, "model_name": "m2", "block_size": 4, "dp_rank": 2}`, 201)
	waitFor("b never listed a's registration", func() bool { return slices.Equal(ranks(b, 900), []uint32{0, 1}) })
	waitFor("a never listed b's registration", func() bool { return slices.Equal(ranks(a, 901), []uint32{2}) })
	out := call(a, "POST", "/v1/events", `{"worker_id": 901, "events": [
		{"type": "stored", "event_id": 1, "dp_rank": 2, "block_hashes": [7001, 7002], "token_ids": [1,2,3,4,5,6,7,8], "block_size": 4}]}`, 200)
	if !strings.Contains(out, `"applied":2`) {
		t.Fatalf("the events' outcomes: %s, want 2 blocks applied", out)
	}
	dump := func(d *proc) string {
		body, err := httpGet(d.addr)("/dump?form=sequence")
		if err != nil {
			t.Fatal(err)
		}
		return string(body)
	}
	if !strings.Contains(dump(a), "901") {
		t.Fatalf("a's /dump, once the events were answered, has no blocks of worker 901:\n%.2000s", dump(a))
	}
	waitFor("b's /dump never became a's", func() bool { return dump(a) == dump(b) })
	call(b, "DELETE", "/v1/workers/900", "", 204)
	waitFor("a still lists worker 900 after b removed it", func() bool { return len(ranks(a, 900)) == 0 })
	if len(ranks(b, 900)) != 0 {
		t.Fatal("b lists worker 900 after its removal was answered")
	}
	if wa, wb := scrape(a.addr), scrape(b.addr); metricValue(t, wa, "kvrouterd_stream_changes_total") != 4 || metricValue(t, wb, "kvrouterd_stream_changes_total") != 4 {
		t.Fatal("kvrouterd_stream_changes_total is not 4 on both replicas")
	}
}

// TestDaemonCorruptSnapshots damages the snapshot store of a stopped daemon — every table file
// cut to half, or a byte flipped in each — and restarts it: the daemon says what it found
// (store moved aside; snapshots skipped), starts from what is left, here nothing, replays the
// whole stream and ends with the reference index all the same. Falling back to an older
// snapshot when only the newest is damaged is tested in package snapshot.
func TestDaemonCorruptSnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	for _, damage := range []string{"truncate", "flip"} {
		t.Run(damage, func(t *testing.T) {
			ns, pub, ref := testStream(t)
			bin, dir := buildDaemon(t), t.TempDir()
			args := []string{"--nats-url", ns.ClientURL(), "--data-dir", dir, "--snapshot-interval", "30ms"}
			d := startDaemon(t, bin, args...)
			g := &streamGen{r: rand.New(rand.NewPCG(7, 8)), next: map[uint64]uint64{}, held: map[uint64][]uint64{}}
			want := publishGen(t, pub, g, ref, 300, 5)
			waitState(t, d, want)
			d.cmd.Process.Signal(syscall.SIGTERM)
			d.cmd.Wait()
			ssts, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*.sst"))
			if len(ssts) == 0 {
				t.Fatal("no table files in the snapshot store")
			}
			for _, f := range ssts {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if damage == "truncate" {
					b = b[:len(b)/2]
				} else {
					b[len(b)/3] ^= 0xff
				}
				if err := os.WriteFile(f, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			d = startDaemon(t, bin, args...)
			defer func() { d.cmd.Process.Kill(); d.cmd.Wait() }()
			waitState(t, d, want)
			if l := d.log(); !strings.Contains(l, "moved aside") && !strings.Contains(l, "skipped") && !strings.Contains(l, "failed to restore") {
				t.Fatalf("the daemon restarted on a damaged store without saying so:\n%s", l)
			}
			for _, line := range strings.Split(d.log(), "\n") {
				if strings.Contains(line, "moved aside") || strings.Contains(line, "skipped") || strings.Contains(line, "restored snapshot") {
					t.Log(line)
				}
			}
		})
	}
}

// publishGen publishes n batches of g (each over the given number of workers) on pub, applies
// them to ref too, and returns ref's state once they are applied.
func publishGen(t *testing.T, pub *ingest.Publisher, g *streamGen, ref *router.Router, n, workers int) string {
	t.Helper()
	for range n {
		b := g.batch(workers)
		if _, err := pub.Batch(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		if err := ref.Ingest(b.Worker, b.Model, b.Events); err != nil {
			t.Fatal(err)
		}
	}
	ref.Flush()
	want, err := state(inProcessGet(ref))
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// natsAs connects to the embedded NATS server at addr as the user whose file (publisher.auth,
// kvrouterd.auth) is in dataDir/nats; closed when the test ends.
func natsAs(t *testing.T, addr, dataDir, file string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("nats://"+addr, ingest.UserFile(filepath.Join(dataDir, "nats", file)))
	if err != nil {
		t.Fatalf("nats as %s: %v", file, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
