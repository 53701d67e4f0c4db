package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/nats-io/nats.go"
	"github.com/valyala/fasthttp"
)

// Config, a plain value, is one soak: its load, its length and how it samples. Zero fields
// take defaults (withDefaults).
type Config struct {
	Bin      string        // the kvrouterd binary; empty: built into a temporary directory
	Duration time.Duration // load time, warm-up included
	Warmup   time.Duration // not judged: a third of Duration, at most 5 minutes
	Interval time.Duration // between samples: Duration / 360, from 1 s to 5 s

	Routes  float64       // routes (and matches) per second, over Conns goroutines
	Conns   int           // route goroutines, each with its own pace
	Batches float64       // event batches per second
	Churn   time.Duration // a worker leaves or comes back this often
	// FreshIDs brings a worker back under a new id, as an engine whose instance id is drawn
	// at start; otherwise it comes back under its old one.
	FreshIDs bool
	Models   int
	Workers  int // per model
	Capacity int // blocks each worker rank holds before its engine evicts
	// MaxIndexBytes, if > 0, is the daemon's --max-index-bytes: with Capacity × Workers ×
	// Models above it (at 64 B a residency), the soak runs at the bound, evicting all along.
	MaxIndexBytes int64
	Docs          int // documents per model
	Questions     int // questions per document
	// Front is the front door's requests per second, over FrontConns goroutines (0: 20;
	// negative: no front door). Three workers in four have the soak's fake engine as their
	// http_endpoint (front.go).
	Front      float64
	FrontConns int

	// The daemon's state that time bounds turns over within half the warm-up, so that it is
	// steady before the judged time: Expiry is its --request-expiry (the bookings never
	// completed are freed after it; at most 20 s), Snapshots its --snapshot-interval (at most
	// 15 s), StreamAge its --nats-max-age (the stream's retention; at most a minute).
	Expiry, Snapshots, StreamAge time.Duration
	// StreamBytes is the daemon's --nats-max-bytes, which also sizes the stream's file blocks
	// and so the file store's cache of the block being written: 0 is streamBytes, so that the
	// stream's memory is at its bound within seconds; negative leaves the daemon's default
	// (4 GiB: 8 MiB blocks, whose cache climbs for minutes; docs/performance.md, "Soak").
	StreamBytes int64

	// Tolerance is DefaultTolerance's, with youngRSSBytes and youngHeapBytes when Warmup is
	// shorter than settle.
	Tolerance Tolerance
	Log       io.Writer // progress and samples
	// Profiles, if set, is a directory: the daemon serves pprof on an admin listener, and
	// the soak saves its heap profile there when the warm-up ends (heap-warm.pb.gz) and when
	// the load ends (heap-end.pb.gz), each after a collection, for `go tool pprof -base`.
	Profiles string
}

// streamBytes is the soak's bound on the event stream: about the largest for which the NATS
// file store writes blocks of its smallest size (32 kB: it aims for a quarter of the bound plus
// one byte, rounded up to 100, and takes 32,000 bytes when that is no more), so that the cache
// of the block being written is small and turns over every second or so at the soak's rate of
// about 35 kB/s. Above it the blocks are 4 MiB, and from 32 MiB on 8 MiB: their cache steps up
// through pooled buffers of 256 KiB, 1, 4 and 8 MiB as a block fills, for minutes at this
// rate, which a soak would judge as growth.
const streamBytes = 120_000

func (c Config) withDefaults() Config {
	if c.Duration <= 0 {
		c.Duration = 3 * time.Minute
	}
	if c.Warmup <= 0 {
		c.Warmup = min(c.Duration/3, 5*time.Minute)
	}
	if c.Interval <= 0 {
		c.Interval = min(max(c.Duration/360, time.Second), 5*time.Second)
	}
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	if c.Routes <= 0 {
		c.Routes = 150
	}
	if c.Batches <= 0 {
		c.Batches = 30
	}
	if c.Front == 0 {
		c.Front = 20
	}
	if c.Churn <= 0 {
		c.Churn = 2 * time.Second
	}
	half := func(p *time.Duration, most time.Duration) {
		if *p <= 0 {
			*p = max(min(c.Warmup/2, most), time.Second)
		}
	}
	half(&c.Expiry, 20*time.Second)
	half(&c.Snapshots, 15*time.Second)
	half(&c.StreamAge, time.Minute)
	if c.StreamBytes == 0 {
		c.StreamBytes = streamBytes
	}
	def(&c.Conns, 3)
	def(&c.FrontConns, 4)
	def(&c.Models, 2)
	def(&c.Workers, 8)
	def(&c.Capacity, 256)
	def(&c.Docs, 48)
	def(&c.Questions, 16)
	if c.Tolerance == (Tolerance{}) {
		c.Tolerance = DefaultTolerance
		if c.Warmup < settle {
			c.Tolerance.RSSBytes = youngRSSBytes
			c.Tolerance.HeapBytes = youngHeapBytes
		}
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// Result, a plain value, is what a soak measured.
type Result struct {
	Config  Config
	Idle    Sample   // the daemon with its workers registered, before the load
	Samples []Sample // every sample, warm-up included
	Warm    int      // Samples[Warm:] are after warm-up
	Verdict Verdict
	Counts  string // the calls made, by kind
	Failed  int64  // calls that failed unexpectedly
	Calls   int64
	// Front is the front door's answers by outcome, FrontMetrics the daemon's front-door and
	// ejection counters at the end, FrontUnexpected the answers that were neither 2xx nor an
	// error the engine or the client caused; empty and 0 without the front door.
	Front, FrontMetrics string
	FrontUnexpected     int64
}

// run builds (unless given) and starts the daemon, drives the load for cfg.Duration while
// sampling, stops everything it started, and judges the samples.
func run(ctx context.Context, cfg Config) (res Result, err error) {
	cfg = cfg.withDefaults()
	res.Config = cfg
	logf := func(format string, a ...any) { fmt.Fprintf(cfg.Log, format+"\n", a...) }
	dir, err := os.MkdirTemp("", "kvrouterd-soak-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	if cfg.Bin == "" {
		logf("building kvrouterd")
		if cfg.Bin, err = build(dir); err != nil {
			return res, err
		}
	}
	d, err := startDaemon(cfg, dir)
	if err != nil {
		return res, err
	}
	defer func() {
		if serr := d.stop(); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			logf("daemon log (end):\n%s", d.logs.String())
		}
	}()
	logf("kvrouterd pid %d on %s, NATS %s", d.cmd.Process.Pid, d.addr, d.nats)

	nc, err := nats.Connect("nats://"+d.nats, ingest.UserFile(filepath.Join(dir, "data", "nats", "publisher.auth")))
	if err != nil {
		return res, fmt.Errorf("soak: NATS: %w", err)
	}
	defer nc.Close()
	pub, err := ingest.NewPublisher(nc, "")
	if err != nil {
		return res, err
	}
	c := client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second, MaxConns: 2 * cfg.Conns})
	hc := &fasthttp.HostClient{Addr: d.addr, MaxConns: 2 * cfg.Conns, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	n := &counters{errLog: func(s string) { logf("error: %s", s) }}
	f := newFleet(cfg, c, hc, pub, n)
	var eng *engine
	var sickIdx []int
	if cfg.Front > 0 {
		if eng, err = startEngine(); err != nil {
			return res, err
		}
		defer eng.close()
		for i, w := range f.workers {
			if i%4 != 0 {
				w.http = eng.endpoint(i)
				sickIdx = append(sickIdx, i)
			}
		}
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	fleetErr := make(chan error, 1)
	wg.Go(func() { fleetErr <- f.run(loadCtx) })
	// The fleet registers its workers first; the idle sample is the daemon with them and
	// nothing else.
	for deadline := time.Now().Add(10 * time.Second); n.registers.ok.Load() < int64(len(f.workers)); {
		if time.Now().After(deadline) {
			stopLoad()
			wg.Wait()
			return res, fmt.Errorf("soak: workers not registered: %v", <-fleetErr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if res.Idle, err = d.sample(0); err != nil {
		stopLoad()
		wg.Wait()
		return res, err
	}
	cfg.Tolerance.IdleGoroutines, cfg.Tolerance.IdleFDs = res.Idle.Goroutines, res.Idle.FDs
	logf("idle: RSS %.1f MiB, heap in use %.1f MiB, %d goroutines, %d fds", float64(res.Idle.RSS)/(1<<20),
		float64(res.Idle.HeapInuse)/(1<<20), res.Idle.Goroutines, res.Idle.FDs)

	life := &lifecycle{}
	wg.Go(func() { life.run(loadCtx, c, n) })
	var seq atomic.Uint64
	fc := &frontCounts{errLog: func(s string) { logf("error: %s", s) }}
	if eng != nil {
		wg.Go(func() { eng.sicken(loadCtx, sickIdx) })
		hcl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.FrontConns}}
		defer hcl.CloseIdleConnections()
		var fseq atomic.Uint64
		for i := range cfg.FrontConns {
			l := &frontLoop{cfg: cfg, addr: d.front, hc: hcl, eng: eng, n: fc, seq: &fseq, rng: rand.New(rand.NewPCG(uint64(i), 11))}
			wg.Go(func() { l.run(loadCtx) })
		}
	}
	for i := range cfg.Conns {
		r := &routeLoop{cfg: cfg, c: c, hc: hc, life: life, fleet: f.routed, n: n, seq: &seq,
			rng: rand.New(rand.NewPCG(uint64(i), 7))}
		wg.Go(func() { r.run(loadCtx) })
	}

	start := time.Now()
	logf("%d s of load (%d s warm-up), a sample every %v:", int(cfg.Duration.Seconds()), int(cfg.Warmup.Seconds()), cfg.Interval)
	logf("%8s %9s %10s %10s %10s %5s %8s %11s %9s", "t(s)", "rss(MiB)", "heap(MiB)", "goal(MiB)", "goroutines", "fds", "active", "residencies", "evicted")
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case err = <-fleetErr:
			if err == nil {
				err = errors.New("soak: the fleet stopped")
			}
		case <-tick.C:
		}
		if err != nil {
			stopLoad()
			wg.Wait()
			return res, err
		}
		at := time.Since(start)
		s, serr := d.sample(at)
		if serr != nil {
			stopLoad()
			wg.Wait()
			return res, serr
		}
		if at < cfg.Warmup {
			res.Warm = len(res.Samples) + 1
		}
		res.Samples = append(res.Samples, s)
		mark := ""
		if at < cfg.Warmup {
			mark = " warm-up"
		}
		logf("%8.0f %9.1f %10.1f %10.1f %10d %5d %8d %11d %9d%s", s.At, float64(s.RSS)/(1<<20), float64(s.HeapInuse)/(1<<20),
			float64(s.HeapGoal)/(1<<20), s.Goroutines, s.FDs, s.Active, s.Residencies, s.Evicted, mark)
		done = at >= cfg.Duration
		if cfg.Profiles != "" && (len(res.Samples) == res.Warm+1 || done) {
			name := "heap-warm.pb.gz"
			if done {
				name = "heap-end.pb.gz"
			}
			if perr := d.heapProfile(cfg.Profiles, name); perr != nil {
				logf("error: %v", perr)
			}
		}
	}
	stopLoad()
	wg.Wait()

	res.Counts, res.Calls, res.Failed = n.summary()
	if eng != nil {
		res.Front = fmt.Sprintf("%s; engine: %d streams, %d cancelled before the first byte, %d broken off, %d answered 500 (%d of them by a sick worker), %d /tokenize, %d /health",
			fc, eng.streams.Load(), eng.cancelled.Load(), eng.broken.Load(), eng.failed.Load()+eng.sickFailed.Load(), eng.sickFailed.Load(), eng.tokenizes.Load(), eng.probes.Load())
		res.FrontUnexpected = fc.unexpected.Load()
		if res.FrontMetrics, err = d.frontMetrics(); err != nil {
			return res, err
		}
	}
	if life.dropped.Load() > 0 {
		res.Counts += fmt.Sprintf("; %d lifecycle calls dropped (queue full)", life.dropped.Load())
	}
	res.Verdict, err = judge(res.Samples[res.Warm:], cfg.Tolerance)
	return res, err
}

// summary is the calls made by kind, their total and the failed ones.
func (n *counters) summary() (string, int64, int64) {
	var b strings.Builder
	var calls, failed int64
	for _, c := range []struct {
		name string
		c    *counter
	}{
		{"binary routes", &n.routesBinary}, {"JSON routes", &n.routesJSON}, {"matches", &n.matches},
		{"prefill-dones", &n.prefillDone}, {"completions", &n.complete}, {"left to expire", &n.expired},
		{"refusals asked for", &n.badRequests}, {"registrations", &n.registers}, {"unregistrations", &n.unregisters},
		{"load reports", &n.reports}, {"NATS batches", &n.natsBatches}, {"binary /v1/events", &n.binaryBatches},
		{"JSON /v1/events", &n.jsonBatches},
	} {
		ok, bad := c.c.ok.Load(), c.c.failed.Load()
		calls += ok + bad
		failed += bad
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s", ok, c.name)
		if bad > 0 {
			fmt.Fprintf(&b, " (%d failed)", bad)
		}
	}
	return b.String(), calls, failed
}

// build builds kvrouterd into dir with the go command of the running toolchain.
func build(dir string) (string, error) {
	bin := filepath.Join(dir, "kvrouterd")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	out, err := exec.Command(gobin, "build", "-o", bin, "github.com/kvrouterd/kvrouterd/cmd/kvrouterd").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("soak: go build: %v\n%s", err, out)
	}
	return bin, nil
}

// daemon is the kvrouterd process under test.
type daemon struct {
	cmd        *exec.Cmd
	addr, nats string
	admin      string // the admin listener (pprof); empty when off
	front      string // the front door's listener; empty when off
	logs       *tail
	exited     chan struct{}
	waitErr    error
}

// startDaemon starts cfg.Bin on loopback ports with its data in dir/data, and waits until it
// is ready. Its stream's retention, snapshot interval and request expiry are cfg's;
// predict-on-route and session affinity are on, with short lives, so that their maps fill and
// empty all the time.
func startDaemon(cfg Config, dir string) (*daemon, error) {
	addr, err := freeport.Addr()
	if err != nil {
		return nil, err
	}
	natsAddr, err := freeport.Addr()
	if err != nil {
		return nil, err
	}
	d := &daemon{addr: addr, nats: natsAddr, logs: &tail{max: 64 << 10}, exited: make(chan struct{})}
	args := []string{"--http-addr", addr, "--nats-listen", natsAddr, "--data-dir", filepath.Join(dir, "data"),
		"--shards", "2", "--log-level", "warn", "--snapshot-interval", cfg.Snapshots.String(),
		"--nats-max-age", cfg.StreamAge.String(), "--request-expiry", cfg.Expiry.String(), "--router-predicted-ttl", "2s", "--router-session-affinity-ttl", "5s",
		"--max-index-bytes", strconv.FormatInt(cfg.MaxIndexBytes, 10)}
	if cfg.StreamBytes >= 0 {
		args = append(args, "--nats-max-bytes", strconv.FormatInt(cfg.StreamBytes, 10))
	}
	if cfg.Front > 0 {
		if d.front, err = freeport.Addr(); err != nil {
			return nil, err
		}
		args = append(args, "--frontend-addr", d.front)
	}
	if cfg.Profiles != "" {
		if d.admin, err = freeport.Addr(); err != nil {
			return nil, err
		}
		args = append(args, "--admin-addr", d.admin)
	}
	d.cmd = exec.Command(cfg.Bin, args...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.cmd.SysProcAttr = daemonAttr()
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("soak: start kvrouterd: %w", err)
	}
	go func() { d.waitErr = d.cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return d, nil
			}
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("soak: kvrouterd exited: %v\n%s", d.waitErr, d.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, fmt.Errorf("soak: kvrouterd not ready in 30 s:\n%s", d.logs.String())
		}
	}
}

// stop ends the daemon with SIGTERM, as an operator would, and kills it if it has not exited
// after 30 s.
func (d *daemon) stop() error {
	select {
	case <-d.exited:
		return fmt.Errorf("soak: kvrouterd exited during the soak: %v", d.waitErr)
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		return errors.New("soak: kvrouterd did not stop within 30 s of SIGTERM")
	}
}

// sample reads the daemon's RSS from /proc and its goroutines, heap and state from /metrics.
func (d *daemon) sample(at time.Duration) (Sample, error) {
	s := Sample{At: at.Seconds()}
	var err error
	if s.RSS, err = rss(d.cmd.Process.Pid); err != nil {
		return s, err
	}
	if s.FDs, err = fds(d.cmd.Process.Pid); err != nil {
		return s, err
	}
	resp, err := http.Get("http://" + d.addr + "/metrics")
	if err != nil {
		return s, fmt.Errorf("soak: /metrics: %w", err)
	}
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return s, fmt.Errorf("soak: /metrics: %w", err)
	}
	var found bool
	for line := range strings.SplitSeq(string(page), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		v, perr := strconv.ParseFloat(val, 64)
		if perr != nil {
			continue
		}
		switch {
		case name == "go_goroutines":
			s.Goroutines, found = int(v), true
		case name == "go_memstats_heap_inuse_bytes":
			s.HeapInuse = int64(v)
		case name == "go_memstats_next_gc_bytes":
			s.HeapGoal = int64(v)
		case name == "kvrouterd_active_requests":
			s.Active = int(v)
		case strings.HasPrefix(name, "kvrouterd_index_residencies{"):
			s.Residencies += int(v)
		case name == "kvrouterd_index_evicted_blocks_total":
			s.Evicted = int(v)
		}
	}
	if !found {
		return s, errors.New("soak: no go_goroutines in /metrics")
	}
	return s, nil
}

// frontMetrics is the daemon's front-door and outlier-ejection counters, from /metrics, one
// "name{labels} value" a line.
func (d *daemon) frontMetrics() (string, error) {
	resp, err := http.Get("http://" + d.addr + "/metrics")
	if err != nil {
		return "", fmt.Errorf("soak: /metrics: %w", err)
	}
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", fmt.Errorf("soak: /metrics: %w", err)
	}
	var b strings.Builder
	for line := range strings.SplitSeq(string(page), "\n") {
		for _, p := range []string{"kvrouterd_frontdoor_requests_total{", "kvrouterd_frontdoor_streams_total{",
			"kvrouterd_frontdoor_migrations_total ", "kvrouterd_frontdoor_upstream_errors_total{", "kvrouterd_worker_ejections_total",
			"kvrouterd_worker_failures_total{", "kvrouterd_worker_ejections_refused_total ", "kvrouterd_route_panic_total ",
			"kvrouterd_health_probes_total{"} {
			if strings.HasPrefix(line, p) && !strings.HasSuffix(line, " 0") {
				b.WriteString(line)
				b.WriteByte('\n')
			}
		}
	}
	return b.String(), nil
}

// heapProfile saves the daemon's heap profile, taken after a collection, as dir/name.
func (d *daemon) heapProfile(dir, name string) error {
	resp, err := http.Get("http://" + d.admin + "/debug/pprof/heap?gc=1")
	if err != nil {
		return fmt.Errorf("soak: heap profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("soak: heap profile: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("soak: heap profile: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, name), b, 0o644)
}

// fds is the number of file descriptors process pid has open.
func fds(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, fmt.Errorf("soak: the daemon's fds: %w", err)
	}
	return len(ents), nil
}

// rss is the resident set of process pid (VmRSS), in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("soak: the daemon's RSS: %w", err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("soak: VmRSS %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("soak: no VmRSS in /proc status")
}

// tail keeps the last max bytes written to it; safe for concurrent use.
type tail struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}
