package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/internal/natstest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestConfigEnvAndFlags(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c, err := parseConfig([]string{"--shards", "5"}, env(map[string]string{
		"KVR_SHARDS": "3", "KVR_ROUTER_MODE": "random", "KVR_REQUEST_EXPIRY": "90s", "KVR_TRACK_PREFILL_TOKENS": "false",
		"KVR_MAX_CANDIDATES": "8", "KVR_HTTP_READ_BUFFER": "32768", "KVR_TRANSPARENT_HUGE_PAGES": "system",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Shards != 5 || c.RouterMode != "random" || c.RequestExpiry != 90*time.Second || c.TrackPrefillTokens || c.MaxCandidates != 8 || c.HTTPReadBuffer != 32768 || c.TransparentHugePages != "system" {
		t.Fatalf("flags over env over defaults: got %+v", c)
	}
	d, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil || d.HTTPAddr != ":8090" || d.BlockSize != 16 || d.OverlapScoreWeight != 1 || !d.TrackPrefillTokens || d.RequestExpiry != 300*time.Second || d.HTTPWriteBuffer != 64<<10 || d.TransparentHugePages != "off" {
		t.Fatalf("defaults: %+v %v", d, err)
	}
	f := func(args []string, envs map[string]string, want string) {
		t.Helper()
		_, err := parseConfig(args, env(envs), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v %v: error %v, want it to name %q", args, envs, err, want)
		}
	}
	f(nil, map[string]string{"KVR_SHARDS": "many"}, "KVR_SHARDS")
	f([]string{"--router-mode", "fastest"}, nil, "--router-mode")
	f([]string{"--overlap-score-weight", "NaN"}, nil, "--overlap-score-weight")
	f([]string{"--log-format", "xml"}, nil, "--log-format")
	f([]string{"--transparent-huge-pages", "madvise"}, nil, "--transparent-huge-pages")
	f([]string{"--max-candidates", "70000"}, nil, "--max-candidates")
	f([]string{"--http-write-buffer", "100"}, nil, "--http-write-buffer")
	f([]string{"--zmq", "worker=1,model=m"}, nil, "endpoint")
	f([]string{"--nats-tls-cert", "c.pem"}, nil, "--nats-tls-key")
	f([]string{"--nats-no-auth", "--nats-url", "nats://h:4222"}, nil, "--nats-no-auth")
	f([]string{"--nats-user-file", filepath.Join(t.TempDir(), "none.auth")}, nil, "--nats-user-file")
	f(nil, map[string]string{"KVR_NATS_NO_AUTH": "maybe"}, "KVR_NATS_NO_AUTH")
	f([]string{"--approx-prune-target", "1.5"}, nil, "--approx-prune-target")
	f([]string{"--http-max-conns", "0"}, nil, "--http-max-conns")
	f(nil, map[string]string{"KVR_HTTP_MAX_CONNS_PER_IP": "-1"}, "--http-max-conns-per-ip")
	f([]string{"--http-idle-timeout", "0s"}, nil, "--http-idle-timeout")
	f(nil, map[string]string{"KVR_ZMQ_STALE_AFTER": "0s"}, "--zmq-stale-after")
	hc, err := parseConfig([]string{"--http-max-conns", "500"}, env(map[string]string{
		"KVR_HTTP_MAX_CONNS": "100", "KVR_HTTP_MAX_CONNS_PER_IP": "50", "KVR_HTTP_IDLE_TIMEOUT": "10s"}), io.Discard)
	if err != nil || hc.HTTPMaxConns != 500 || hc.HTTPMaxConnsPerIP != 50 || hc.HTTPIdleTimeout != 10*time.Second {
		t.Fatalf("connection flags: %d %d %v %v", hc.HTTPMaxConns, hc.HTTPMaxConnsPerIP, hc.HTTPIdleTimeout, err)
	}
	dr := router.New(router.Config{Shards: 1, Logger: quiet()})
	defer dr.Close()
	_, perIP := server.New(dr, server.Config{MaxConns: d.HTTPMaxConns, MaxConnsPerIP: d.HTTPMaxConnsPerIP, Logger: quiet()}).ConnLimits()
	if d.HTTPMaxConns != server.DefaultMaxConns(server.FileLimit()) || d.HTTPMaxConnsPerIP != 0 || perIP != d.HTTPMaxConns/4 {
		t.Fatalf("connection defaults: %d, per address %d", d.HTTPMaxConns, d.HTTPMaxConnsPerIP)
	}
	z, err := parseConfig(nil, env(map[string]string{"KVR_ZMQ": "worker=1,model=m,endpoint=tcp://h:5557;worker=2,model=m,endpoint=tcp://h:6557,ranks=2"}), io.Discard)
	if err != nil || len(z.ZMQ) != 2 || z.ZMQ[1].Ranks != 2 {
		t.Fatalf("KVR_ZMQ with two sources: %+v %v", z.ZMQ, err)
	}
	if d.ZMQStaleAfter != time.Minute {
		t.Fatalf("--zmq-stale-after defaults to %v, want 1m", d.ZMQStaleAfter)
	}
	if st, err := parseConfig(nil, env(map[string]string{"KVR_ZMQ_STALE_AFTER": "500ms"}), io.Discard); err != nil || st.ZMQStaleAfter != 500*time.Millisecond {
		t.Fatalf("KVR_ZMQ_STALE_AFTER=500ms: %v %v", st.ZMQStaleAfter, err)
	}
	if _, err := parseBridgeConfig(nil, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "--zmq") {
		t.Fatalf("bridge without --zmq: %v", err)
	}
	var help bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, env(nil), &help); err == nil || !strings.Contains(help.String(), "KVR_ROUTER_TEMPERATURE") {
		t.Fatalf("--help: %v\n%s", err, help.String())
	}
}

// TestDaemonOverTCP builds the binary, runs it on a real port, drives a request's whole life
// through the client, and stops it with SIGTERM.
func TestDaemonOverTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildDaemon(t)
	addr, natsAddr, dataDir := freeport.TB(t), freeport.TB(t), t.TempDir()
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--http-addr", addr, "--nats-listen", natsAddr, "--data-dir", dataDir, "--shards", "2", "--log-level", "debug")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	c := client.New(client.Config{Addr: addr, Timeout: 5 * time.Second})
	deadline := time.Now().Add(20 * time.Second)
	for c.Register(client.Worker{ID: 1, Model: "m", BlockSize: 4}) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("daemon not up:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.Register(client.Worker{ID: 2, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	res, err := c.Events(&wire.EventBatch{Worker: 2, Model: "m", Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{70, 71}, Tokens: toks[:8]},
	}})
	if err != nil || res.OK != 1 {
		t.Fatalf("events: %+v %v", res, err)
	}
	var resp wire.RouteResponse
	if err := c.Route(&wire.RouteRequest{RequestID: "r1", Model: "m", Tokens: toks}, &resp); err != nil {
		t.Fatal(err)
	}
	// The default cost (ttft): worker 2 has 1 token to prefill, worker 1 all 9, so worker 2
	// is predicted sooner; both logits are times (ms), above the step model's fixed cost.
	if resp.Worker != 2 || len(resp.Candidates) != 2 || !(resp.Candidates[1].Logit < resp.Candidates[0].Logit) ||
		!(resp.Candidates[1].Logit > 16) || resp.Candidates[1].PrefillTokens != 1 || resp.Candidates[0].PrefillTokens != 9 {
		t.Fatalf("route: %+v", resp)
	}
	if err := c.PrefillDone("r1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete("r1"); err != nil {
		t.Fatal(err)
	}

	// The embedded NATS server refuses anonymous clients. An engine's batch published to it by
	// another process's connection, as the publisher user of publisher.auth, registers worker 3
	// and reaches the index.
	if nc, err := nats.Connect("nats://" + natsAddr); err == nil {
		nc.Close()
		t.Fatal("the embedded NATS server accepted an anonymous client")
	}
	pubFile := filepath.Join(dataDir, "nats", "publisher.auth")
	pub, err := ingest.NewPublisher(natsAs(t, natsAddr, dataDir, "publisher.auth"), "")
	if err != nil {
		t.Fatal(err)
	}
	eb := wire.EngineBatch{Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{5, 6}, Tokens: toks[:8]}}}
	if _, err := pub.Engine(context.Background(), "m", 3, -1, 0, wire.AppendEngineBatch(nil, &eb, wire.EngineForm{MapBatch: true, MapEvents: true})); err != nil {
		t.Fatal(err)
	}
	// awaitCached repeats poke (nil: nothing) until worker w's rank caches blocks of toks.
	awaitCached := func(w uint64, rank uint32, blocks uint32, poke func()) {
		t.Helper()
		for {
			if poke != nil {
				poke()
			}
			if err := c.Match(&wire.RouteRequest{Model: "m", Tokens: toks}, &resp); err != nil {
				t.Fatal(err)
			}
			for _, cd := range resp.Candidates {
				if cd.Worker == w && cd.Rank == rank && cd.CachedBlocks == blocks {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("worker %d's events never applied: %+v\n%s", w, resp, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	awaitCached(3, 0, 2, nil)
	// A worker registered through Dynamo's /register with its ZMQ endpoint (data-parallel rank 1)
	// is subscribed to: a fake engine's PUB socket reaches the index.
	engine := zmq4.NewPub(context.Background())
	defer engine.Close()
	zaddr := freeport.TB(t)
	if err := engine.Listen("tcp://" + zaddr); err != nil {
		t.Fatal(err)
	}
	reg := fmt.Sprintf(`{"instance_id":4,"endpoint":"tcp://%s","model_name":"m","block_size":4,"dp_rank":1}`, zaddr)
	hr, err := http.Post("http://"+addr+"/register", "application/json", strings.NewReader(reg))
	if err != nil || hr.StatusCode != 201 {
		t.Fatalf("/register: %v %v", hr, err)
	}
	hr.Body.Close()
	zb := wire.EngineBatch{Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{9, 10}, Tokens: toks[:8]}}}
	payload := wire.AppendEngineBatch(nil, &zb, wire.EngineForm{})
	seq0 := make([]byte, 8) // the first batch, sequence 0; repeats are duplicates until one lands
	send := func(e zmq4.Socket, payload []byte) func() {
		return func() {
			if err := e.Send(zmq4.NewMsgFrom([]byte("kv"), seq0, payload)); err != nil {
				t.Fatal(err)
			}
		}
	}
	awaitCached(4, 1, 2, send(engine, payload))

	// `kvrouterd bridge` beside another engine forwards its events through the daemon's NATS
	// stream into the index (worker 5).
	engine2 := zmq4.NewPub(context.Background())
	defer engine2.Close()
	zaddr2 := freeport.TB(t)
	if err := engine2.Listen("tcp://" + zaddr2); err != nil {
		t.Fatal(err)
	}
	var blogs bytes.Buffer
	bridge := exec.Command(bin, "bridge", "--zmq", "worker=5,model=m,endpoint=tcp://"+zaddr2, "--nats-url", "nats://"+natsAddr, "--nats-user-file", pubFile)
	bridge.Stderr = &blogs
	if err := bridge.Start(); err != nil {
		t.Fatal(err)
	}
	defer bridge.Process.Kill()
	zb.Events[0].Hashes = []uint64{11, 12}
	awaitCached(5, 0, 2, send(engine2, wire.AppendEngineBatch(nil, &zb, wire.EngineForm{})))
	if err := bridge.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := bridge.Wait(); err != nil {
		t.Fatalf("bridge exit: %v\n%s", err, blogs.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no exit 15 s after SIGTERM\n%s", logs.String())
	}
	for _, want := range []string{"worker 2: logit ", "= predicted TTFT ", " ms (queued 0 + own 1 tokens) + cache 1.0 × ", " ms + backlog 0.0 × ", "(cached blocks 2)", "shutting down", "stopped",
		"--nats-user-file " + pubFile} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// buildDaemon builds the binary once per test process, into a directory removed by TestMain:
// a dozen daemon tests each linking their own copy took most of the package's time.
func buildDaemon(t testing.TB) string {
	t.Helper()
	daemonBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "kvrouterd-test-")
		if err != nil {
			daemonBuild.err = err
			return
		}
		daemonBuild.dir = dir
		bin := filepath.Join(dir, "kvrouterd")
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
			daemonBuild.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		daemonBuild.bin = bin
	})
	if daemonBuild.err != nil {
		t.Fatal(daemonBuild.err)
	}
	return daemonBuild.bin
}

var daemonBuild struct {
	once     sync.Once
	dir, bin string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if daemonBuild.dir != "" {
		os.RemoveAll(daemonBuild.dir)
	}
	os.Exit(code)
}

// TestDaemonExternalNATS runs the binary with --nats-url against a nats-server process, which is
// stopped and started again: the daemon keeps answering, reconnects, and applies what is
// published after the restart.
func TestDaemonExternalNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and nats-server")
	}
	natsBin := natstest.Binary(t)
	natsAddr, store := freeport.TB(t), t.TempDir()
	host, port, _ := net.SplitHostPort(natsAddr)
	startNATS := func() *exec.Cmd {
		c := exec.Command(natsBin, "-a", host, "-p", port, "-js", "-sd", store)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	ns := startNATS()
	defer func() { ns.Process.Kill(); ns.Wait() }()
	// The daemon's first connection must succeed (it refuses to start against no server): wait
	// until nats-server listens, which on a loaded machine takes a while.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if conn, err := net.Dial("tcp", natsAddr); err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nats-server never listened on " + natsAddr)
		}
	}

	bin := buildDaemon(t)
	addr := freeport.TB(t)
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--http-addr", addr, "--nats-url", "nats://"+natsAddr, "--data-dir", t.TempDir(), "--shards", "2")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	c := client.New(client.Config{Addr: addr, Timeout: 5 * time.Second})
	deadline := time.Now().Add(30 * time.Second)
	// The server may not listen yet: the connection retries until it does.
	nc, err := nats.Connect("nats://"+natsAddr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := ingest.NewPublisher(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	// publish stores block b (chained) on worker w, retrying while the server is away or the
	// stream does not exist yet (the daemon creates it).
	publish := func(w, id uint64, hashes []uint64, tokens []uint32, parent uint64) {
		b := &wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: id, BlockSize: 4,
			Hashes: hashes, Tokens: tokens, Parent: parent, HasParent: parent != 0}}}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := pub.Batch(ctx, b)
			cancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish: %v\n%s", err, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var resp wire.RouteResponse
	waitCached := func(w uint64, blocks uint32) {
		for {
			err := c.Match(&wire.RouteRequest{Model: "m", Tokens: toks}, &resp)
			if err == nil {
				for _, cd := range resp.Candidates {
					if cd.Worker == w && cd.CachedBlocks == blocks {
						return
					}
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("worker %d never cached %d blocks: %+v %v\n%s", w, blocks, resp, err, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	publish(1, 1, []uint64{11}, toks[:4], 0)
	waitCached(1, 1)

	ns.Process.Signal(syscall.SIGTERM)
	ns.Wait()
	// The server is gone: routes are still answered from the index.
	if err := c.Route(&wire.RouteRequest{RequestID: "r", Model: "m", Tokens: toks}, &resp); err != nil || resp.Worker != 1 {
		t.Fatalf("route while NATS is down: %+v %v", resp, err)
	}
	ns = startNATS()
	publish(1, 2, []uint64{12}, toks[4:8], 11)
	waitCached(1, 2)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "nats reconnected") {
		t.Fatalf("no reconnection in the log:\n%s", logs.String())
	}
}

// TestDaemonStreamRepair runs the binary with its embedded NATS server and does to the event
// stream, as kvrouterd's own user (the publisher user may not: it is refused), what an
// operator's mistake could. A sealed stream, which the server will not unseal, makes /readyz
// answer 503 naming the stream and kvrouterd_stream_connected read 0. Deleting it has the daemon
// create it again (kvrouterd_stream_recreated_total), clear the index the lost events built,
// become ready again and apply what is published next. A second replica then reads the stream
// through the first's embedded server with its kvrouterd.auth (--nats-user-file).
func TestDaemonStreamRepair(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildDaemon(t)
	natsAddr, dir := freeport.TB(t), t.TempDir()
	d := startDaemon(t, bin, "--nats-listen", natsAddr, "--data-dir", dir, "--no-snapshots")
	defer d.cmd.Process.Kill()
	// until waits for cond, which reads the daemon over HTTP.
	until := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s\n%s", what, d.log())
			}
		}
	}
	metric := func(name string) string {
		if v, ok := sampleText(scrape(d.addr), name); ok {
			return v
		}
		return "absent"
	}
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + d.addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	pnc, admin := natsAs(t, natsAddr, dir, "publisher.auth"), natsAs(t, natsAddr, dir, "kvrouterd.auth")
	pub, err := ingest.NewPublisher(pnc, "")
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second})
	toks := []uint32{1, 2, 3, 4}
	ctx := context.Background()
	// store publishes worker w's block, retrying while the stream is being repaired, and waits
	// until the index has it.
	store := func(w uint64) {
		t.Helper()
		b := &wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{{Kind: kvevent.Stored, ID: 1, BlockSize: 4, Hashes: []uint64{w}, Tokens: toks}}}
		until("the batch stored", func() bool { _, err := pub.Batch(ctx, b); return err == nil })
		until("the batch in the index", func() bool { return cachedOn(c, toks, w) == 1 })
	}
	store(1)
	if v := metric("kvrouterd_stream_connected"); v != "1" {
		t.Fatalf("kvrouterd_stream_connected %s, want 1", v)
	}

	// The publisher may not delete the stream.
	pjs, err := jetstream.New(pnc)
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = pjs.DeleteStream(dctx, ingest.DefaultStream)
	cancel()
	ajs, err2 := jetstream.New(admin)
	if err2 != nil {
		t.Fatal(err2)
	}
	s, err2 := ajs.Stream(ctx, ingest.DefaultStream)
	if err == nil || err2 != nil {
		t.Fatalf("the publisher deleting the stream: %v; the stream after: %v", err, err2)
	}

	// Sealed: not ready, not connected.
	cfg := s.CachedInfo().Config
	cfg.Sealed = true
	if _, err := ajs.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	until("/readyz to fail on the sealed stream", func() bool {
		code, body := readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "stream: ") && strings.Contains(body, "sealed")
	})
	if v := metric("kvrouterd_stream_connected"); v != "0" {
		t.Fatalf("kvrouterd_stream_connected %s with a sealed stream, want 0", v)
	}

	// Deleted: created again, the index cleared, ready, new events applied.
	if err := ajs.DeleteStream(ctx, ingest.DefaultStream); err != nil {
		t.Fatal(err)
	}
	until("the stream created again", func() bool { return metric("kvrouterd_stream_recreated_total") == "1" })
	store(2)
	if n := cachedOn(c, toks, 1); n != 0 {
		t.Fatalf("worker 1 still has %d blocks from the lost stream", n)
	}
	until("/readyz to pass", func() bool { code, _ := readyz(); return code == http.StatusOK })
	if v := metric("kvrouterd_stream_connected"); v != "1" {
		t.Fatalf("kvrouterd_stream_connected %s after the repair, want 1", v)
	}

	// A second replica on this daemon's embedded server, as its kvrouterd user, reads the
	// stream (and shares load over it).
	b := startDaemon(t, bin, "--nats-url", "nats://"+natsAddr, "--nats-user-file", filepath.Join(dir, "nats", "kvrouterd.auth"),
		"--data-dir", t.TempDir(), "--no-snapshots")
	defer b.cmd.Process.Kill()
	bc := client.New(client.Config{Addr: b.addr, Timeout: 5 * time.Second})
	until("the second replica to read the stream", func() bool { return cachedOn(bc, toks, 2) == 1 })
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := b.cmd.Wait(); err != nil {
		t.Fatalf("second replica's exit: %v\n%s", err, b.log())
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, d.log())
	}
	for _, want := range []string{"every worker's blocks cleared", "the stream was deleted; creating it again"} {
		if !strings.Contains(d.log(), want) {
			t.Fatalf("log lacks %q:\n%s", want, d.log())
		}
	}
}

// cachedOn is how many leading blocks of toks worker w caches, per a match; -1 if the match
// fails.
func cachedOn(c *client.Client, toks []uint32, w uint64) int {
	var resp wire.RouteResponse
	if err := c.Match(&wire.RouteRequest{Model: "m", Tokens: toks}, &resp); err != nil {
		return -1
	}
	for _, cd := range resp.Candidates {
		if cd.Worker == w {
			return int(cd.CachedBlocks)
		}
	}
	return -1
}
