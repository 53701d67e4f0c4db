package loadgen

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// TestRunSuite runs the whole suite in-process for a moment and checks behaviour only: requests
// were made, none failed, every answer chose a registered worker, and the rows are the matrix's.
// Timing is never asserted: this machine's speed is not the code's.
func TestRunSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("twenty short load runs take about 7 s")
	}
	c := Defaults()
	c.SuiteWorkers = []int{8, 50}
	c.Duration, c.Warmup, c.Conns = 200*time.Millisecond, 50*time.Millisecond, 4
	c.SuiteWarmupCalls = 0
	var runs []Result
	var log bytes.Buffer
	rows, err := RunSuite(t.Context(), c, func(r Result) { runs = append(runs, r) }, &log)
	if err != nil {
		t.Fatalf("suite: %v\n%s", err, log.String())
	}
	// The cap of 8 candidates is skipped for 8 workers: it is all of them.
	if len(rows) != 3 || rows[0].Workers != 8 || rows[0].MaxCandidates != 0 || rows[1].Workers != 50 || rows[1].MaxCandidates != 0 ||
		rows[2].Workers != 50 || rows[2].MaxCandidates != 8 || rows[2].NoopSat != rows[1].NoopSat {
		t.Fatalf("rows %+v, want 8 workers with every candidate, 50 with every candidate and capped at 8", rows)
	}
	for _, r := range rows {
		if r.NoopSame.NoopCandidates != r.Answer() || r.Answer() != map[int]int{8: 8, 50: 50}[r.Workers] && r.MaxCandidates == 0 {
			t.Errorf("%d workers, cap %d: the same-size no-op answered %d candidates, kvrouterd %d",
				r.Workers, r.MaxCandidates, r.NoopSame.NoopCandidates, r.Answer())
		}
		for _, res := range []Result{r.NoopSat, r.RouteSat, r.NoopSame, r.RouteHalf, r.NoopHalf, r.RouteQuarter, r.NoopQuarter} {
			if res.OK == 0 || res.Requests == 0 || res.Errors != 0 || res.BadAnswer != 0 || res.Unsent != 0 {
				t.Errorf("%s, %d workers, rate %.0f: %+v; want requests and no errors", res.Target, res.Workers, res.Rate, res)
			}
			if res.P50 <= 0 || res.P50 > res.P99 || res.P99 > res.Max {
				t.Errorf("%s, %d workers: percentiles out of order: %+v", res.Target, res.Workers, res)
			}
		}
		if r.RouteQuarter.Rate != r.HalfRate/2 || r.NoopQuarter.Rate != r.RouteQuarter.Rate {
			t.Errorf("%d workers: quarter rates %v and %v, want %v", r.Workers, r.RouteQuarter.Rate, r.NoopQuarter.Rate, r.HalfRate/2)
		}
		if r.RouteHalf.Rate != r.RouteSat.RPS/2 || r.NoopHalf.Rate != r.RouteHalf.Rate {
			t.Errorf("%d workers: half rates %v and %v, want %v", r.Workers, r.RouteHalf.Rate, r.NoopHalf.Rate, r.RouteSat.RPS/2)
		}
		if r.Ratio() != r.RouteSat.RPS/r.NoopSat.RPS || r.Errors() != 0 {
			t.Errorf("%d workers: ratio %v, errors %d", r.Workers, r.Ratio(), r.Errors())
		}
	}
	// Progress sees every run once, in order: noop, then per cap kvrouterd, noop (same size),
	// kvrouterd and noop at half, and at a quarter.
	perCap := []string{"kvrouterd", "noop", "kvrouterd", "noop", "kvrouterd", "noop"}
	want := slices.Concat([]string{"noop"}, perCap, []string{"noop"}, perCap, perCap)
	var got []string
	for _, r := range runs {
		got = append(got, r.Target)
	}
	if !slices.Equal(got, want) || runs[19] != rows[2].NoopQuarter || runs[2] != rows[0].NoopSame {
		t.Fatalf("progress saw %v, want %v", got, want)
	}
}

// TestCheck checks that Run and RunSuite refuse bad settings up front, naming the field, and
// that a command can name its flags instead.
func TestCheck(t *testing.T) {
	f := func(edit func(*Config), suite bool, want string) {
		t.Helper()
		c := Defaults()
		edit(&c)
		var err error
		if suite {
			_, err = RunSuite(t.Context(), c, nil, nil)
		} else {
			_, err = Run(t.Context(), c, nil)
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want ErrConfig naming %q", err, want)
		}
	}
	f(func(c *Config) { c.Target = "nginx" }, false, `Target "nginx"`)
	f(func(c *Config) { c.Target, c.Addr = "noop", "h:1" }, false, "Addr")
	f(func(c *Config) { c.Rate = -1 }, false, "Rate -1")
	f(func(c *Config) { c.Warmup = -1 }, false, "Warmup -1ns")
	f(func(c *Config) { c.SuiteWorkers = nil }, true, "SuiteWorkers")
	f(func(c *Config) { c.SuiteWorkers = []int{8, 1 << 21} }, true, "2097152 workers")
	f(func(c *Config) { c.SuiteCandidates = []int{0, 1 << 16} }, true, "MaxCandidates 65536")

	c := Defaults()
	c.Blocks = 4
	if err := c.Check(func(f string) string { return "--" + strings.ToLower(f) }); err == nil || err.Error() != "--blocks 4: want 8 to 65536" {
		t.Fatalf("error %v, want it to name --blocks", err)
	}
	// The suite ignores Target and uses Addr for kvrouterd only.
	c = Defaults()
	c.Target, c.Addr = "noop", "h:1"
	if err := c.checkSuite(); err != nil {
		t.Fatal(err)
	}
}

// TestWorkload checks the index content and the prompts against the brief: two whole holders per
// family, every worker holding data, chained events, and cached depths between 3/4 and all.
func TestWorkload(t *testing.T) {
	f := func(workers int) {
		t.Helper()
		c := Defaults()
		c.Workers = workers
		w := newWorkload(&c)
		whole := make([]int, workers)
		for i := range workers {
			full, partial := w.holdings(i)
			if len(full) == 0 && partial < 0 {
				t.Fatalf("%d workers: worker %d holds nothing", workers, i)
			}
			for _, p := range full {
				whole[i]++
				if a, b := w.holders(p); a != i && b != i {
					t.Fatalf("%d workers: worker %d holds family %d, whose holders are %d and %d", workers, i, p, a, b)
				}
			}
			seen := map[uint64]bool{}
			for j, ev := range w.events(i) {
				if len(ev.Tokens) != len(ev.Hashes)*c.BlockSize || ev.HasParent != (j > 0) {
					t.Fatalf("%d workers: worker %d event %d: %d tokens for %d hashes, parent %v", workers, i, j, len(ev.Tokens), len(ev.Hashes), ev.HasParent)
				}
				if ev.HasParent && ev.Parent != w.engineHash(0, w.prefix-1) {
					t.Fatalf("%d workers: worker %d event %d chains onto %d, not the prefix", workers, i, j, ev.Parent)
				}
				for _, h := range ev.Hashes {
					if seen[h] {
						t.Fatalf("%d workers: worker %d stores engine hash %d twice", workers, i, h)
					}
					seen[h] = true
				}
			}
		}
		total := 0
		for _, n := range whole {
			total += n
		}
		if want := 2 * c.Prompts; workers > 1 && total != want {
			t.Fatalf("%d workers: %d whole families held, want %d", workers, total, want)
		}
	}
	f(1)
	f(8)
	f(1000)

	c := Defaults()
	w := newWorkload(&c)
	rng := rand.New(rand.NewPCG(1, 2))
	var dst []uint32
	depths := map[int]bool{}
	for range 2000 {
		var depth int
		dst, depth = w.prompt(rng, dst)
		depths[depth] = true
		if depth < 96 || depth > 128 || len(dst) != 2048 {
			t.Fatalf("depth %d, %d tokens", depth, len(dst))
		}
		fam := slices.IndexFunc(w.families, func(f []uint32) bool { return slices.Equal(f[:depth*16], dst[:depth*16]) })
		if fam < 0 {
			t.Fatal("the prompt's first blocks are no family's")
		}
		if depth < 128 && dst[depth*16] == w.families[fam][depth*16] {
			t.Fatal("the tail was not changed")
		}
	}
	if len(depths) != 33 {
		t.Fatalf("%d distinct depths, want all 33 from 96 to 128", len(depths))
	}
}

// TestOpenLoopPacing drives a connection's open loop with a send that records when each request
// went out, one of them answered only after three periods, with the system's alarm and the
// fallback: no request goes out before its scheduled time, the late ones are timed from their
// schedule, and the schedule is sent in full and in order.
func TestOpenLoopPacing(t *testing.T) {
	const period = 2 * time.Millisecond
	for name, mk := range map[string]func(time.Time, time.Duration) alarm{
		"system":  newAlarm,
		"sleeper": func(time.Time, time.Duration) alarm { return sleeper{} },
	} {
		t.Run(name, func(t *testing.T) {
			c := Defaults()
			c.Conns, c.Rate = 1, float64(time.Second/period)
			start := time.Now().Add(time.Millisecond)
			end := start.Add(24 * period)
			k := &conn{}
			var scheds []time.Time
			k.openLoop(t.Context(), &c, start, start, end, mk, func(sched, from time.Time, _ bool) {
				if now := time.Now(); now.Before(sched) {
					t.Errorf("request %d sent %v before its scheduled time", len(scheds), sched.Sub(now))
				}
				if from.Before(sched) {
					t.Errorf("request %d timed from %v before its scheduled time", len(scheds), sched.Sub(from))
				}
				if len(scheds) > 0 && !sched.After(scheds[len(scheds)-1]) {
					t.Errorf("request %d scheduled out of order", len(scheds))
				}
				scheds = append(scheds, sched)
				if len(scheds) == 3 {
					time.Sleep(3 * period) // a slow answer: the next ones come due meanwhile
				}
			})
			if len(scheds) != 24 {
				t.Fatalf("%d requests sent, want 24", len(scheds))
			}
		})
	}
}

// TestOpenLoopSchedule checks that an open-loop run sends its schedule: as many requests in the
// measured window as the rate and the window give, give or take one per connection; and that
// its latency log has a line per successful route, in time order, inside the window, agreeing
// with the Result's percentiles.
func TestOpenLoopSchedule(t *testing.T) {
	c := Defaults()
	c.Target, c.Workers, c.Conns = "noop", 8, 4
	c.Duration, c.Warmup, c.Rate = 300*time.Millisecond, 50*time.Millisecond, 2000
	var log bytes.Buffer
	c.LatencyLog = &log
	r, err := Run(t.Context(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(c.Rate * c.Duration.Seconds())
	if r.Requests < want-int64(c.Conns) || r.Requests > want+int64(c.Conns) || r.Errors != 0 {
		t.Fatalf("%d requests in the window (%d errors), want %d ± %d", r.Requests, r.Errors, want, c.Conns)
	}
	lines := strings.Split(strings.TrimSuffix(log.String(), "\n"), "\n")
	if int64(len(lines)) != r.OK {
		t.Fatalf("%d lines in the latency log, %d routes succeeded", len(lines), r.OK)
	}
	var lats []int64
	prev := int64(-1)
	perConn := make([]int, c.Conns)
	for i, l := range lines {
		var from, lat int64
		var k int
		if n, err := fmt.Sscanf(l, "%d %d %d", &from, &lat, &k); n != 3 || err != nil {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		// A request scheduled in the window whose goroutine woke late is timed from its wake-up,
		// which may come after the window, but not after the drain's grace.
		if from < prev || from < 0 || from > (c.Duration+drainGrace).Microseconds() || lat < 0 || k < 0 || k >= c.Conns {
			t.Fatalf("line %d %q: want time order from the window's start to its grace's end, a latency ≥ 0, a connection below %d", i, l, c.Conns)
		}
		prev = from
		perConn[k]++
		lats = append(lats, lat)
	}
	for k, n := range perConn {
		if n == 0 {
			t.Errorf("connection %d has no line", k)
		}
	}
	slices.Sort(lats)
	if got := lats[len(lats)-1]; got != int64(r.Max) {
		t.Errorf("longest logged latency %d µs, the Result's maximum %.1f µs", got, r.Max)
	}
}

// TestSuiteWarmupCalls: an open-loop run of the suite warms up for SuiteWarmupCalls requests at
// least; a closed loop keeps its warmup and sends SuiteWarmupCalls requests before it.
func TestSuiteWarmupCalls(t *testing.T) {
	c := Defaults()
	c.Warmup = time.Second
	if got := c.suiteRun("kvrouterd", 8, 0, 9000).Warmup; got != 5*time.Second {
		t.Fatalf("at 9,000 req/s: warmup %v, want 5s", got)
	}
	if got := c.suiteRun("noop", 8, 0, 90000).Warmup; got != time.Second {
		t.Fatalf("at 90,000 req/s: warmup %v, want the configured 1s", got)
	}
	if got := c.suiteRun("kvrouterd", 8, 0, 0); got.Warmup != time.Second || got.WarmupCalls != c.SuiteWarmupCalls {
		t.Fatalf("closed loop: warmup %v and %d calls, want 1s and %d calls", got.Warmup, got.WarmupCalls, c.SuiteWarmupCalls)
	}
	if got := c.suiteRun("kvrouterd", 8, 0, 9000).WarmupCalls; got != 0 {
		t.Fatalf("open loop: %d warmup calls, want none (its warmup is lengthened instead)", got)
	}
}

// TestWarmupCalls: a closed loop with WarmupCalls sends that many routes, unmeasured, before its
// timed warmup and window.
func TestWarmupCalls(t *testing.T) {
	c := Defaults()
	c.Target, c.Workers, c.Conns, c.Warmup, c.Duration, c.WarmupCalls = "noop", 8, 4, 0, 30*time.Millisecond, 3000
	w := newWorkload(&c)
	body := noopBody(w, 0)
	var routes atomic.Int64
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/v1/route" {
			routes.Add(1)
			ctx.SetContentType(wire.ContentType)
			ctx.SetBody(body)
			return
		}
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		if err := errors.Join(srv.Shutdown(), <-served); err != nil {
			t.Error(err)
		}
	}()
	// A generous timeout: the count below is exact only if no request gives up.
	cl := client.New(client.Config{Addr: ln.Addr().String(), MaxConns: c.Conns, Timeout: time.Minute})
	r, err := load(t.Context(), cl, w, &c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.OK == 0 || r.Errors != 0 || r.WarmupErrors != 0 {
		t.Fatalf("run %+v: want answered requests and no errors", r)
	}
	// The prelude's goroutines stop at WarmupCalls between them; the window adds r.Requests.
	if got := routes.Load() - r.Requests; got != int64(c.WarmupCalls) {
		t.Fatalf("%d routes before the window, want %d", got, c.WarmupCalls)
	}
}
