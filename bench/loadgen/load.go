package loadgen

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// maxFailRatio is the share of failed requests above which a run fails.
const maxFailRatio = 0.001

// drainGrace bounds how long an open-loop run keeps sending requests scheduled in its window after
// the window ends: a target that far behind did not sustain the rate, and the rest count as failed.
const drainGrace = 2 * time.Second

// Result is one run's outcome; a plain value. Its JSON encoding is kvrload's --json line.
type Result struct {
	Target        string `json:"target"`
	Workers       int    `json:"workers"`
	MaxCandidates int    `json:"max_candidates"` // 0 = every worker in each answer
	// NoopCandidates is the no-op target's answer size in candidates (0: its usual two).
	NoopCandidates int     `json:"noop_candidates,omitempty"`
	Blocks         int     `json:"blocks"`
	BlockSize      int     `json:"block_size"`
	Conns          int     `json:"conns"`
	Rate           float64 `json:"rate"`     // requested; 0 = closed loop
	Seconds        float64 `json:"seconds"`  // the window, or longer if an open loop drained late
	Requests       int64   `json:"requests"` // scheduled or sent in the measured window
	OK             int64   `json:"ok"`
	Errors         int64   `json:"errors"`      // failed calls, bad answers and unsent requests
	BadAnswer      int64   `json:"bad_answers"` // route answers that chose no registered worker
	Unsent         int64   `json:"unsent"`      // open loop: scheduled, never sent before the grace ended
	RPS            float64 `json:"rps"`         // successful routes per second of Seconds
	// Route latency percentiles (nearest rank), maximum and mean of the measured window, in µs.
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p999_us"`
	Max  float64 `json:"max_us"`
	Mean float64 `json:"mean_us"`
	// CPUPerReq is this process's CPU time per successful route in the measured window, in µs:
	// client and in-process target together, both calls (the client alone with Addr). It
	// depends less than req/s on what else runs on the machine. 0 when unknown.
	CPUPerReq float64 `json:"cpu_us_per_req"`
	// Others is the share of the machine's CPU capacity that other processes (and hypervisor
	// steal) used during the measured window, in percent; -1 when unknown. Above a few percent
	// the run measured the neighbours too. An external kvrouterd (Addr) on the same machine
	// counts as another process.
	Others float64 `json:"others_cpu_pct"`
	// EventRate is the KV event stream asked for meanwhile (Config.EventRate), in blocks per
	// second; EventsApplied is what the target's shards applied during the measured window, per
	// second, removed and stored blocks alike (the stream's, and nothing else); EventsSkipped
	// counts the stream's batches given up because it fell behind; Residencies is the index's
	// (block, worker) pairs when the window began. The last three are an in-process kvrouterd's
	// only, the first two a stream's.
	EventRate     float64 `json:"event_rate,omitempty"`
	EventsApplied float64 `json:"events_applied,omitempty"`
	EventsSkipped int64   `json:"events_skipped,omitempty"`
	Residencies   int64   `json:"residencies,omitempty"`
	FirstErr      string  `json:"first_error,omitempty"` // of the measured window
	// WarmupErrors are failures during the warmup, not counted in Errors: reported because a
	// target that fails while connections open is worth knowing about.
	WarmupErrors int64  `json:"warmup_errors"`
	WarmupErr    string `json:"warmup_error,omitempty"`
}

// Err reports a run that measured no request or failed its error budget: more than 0.1% of
// its requests failed.
func (r *Result) Err() error {
	if r.Requests == 0 {
		return fmt.Errorf("%s: no request was measured", r.Target)
	}
	if float64(r.Errors) > maxFailRatio*float64(r.Requests) {
		return fmt.Errorf("%s, %d workers: %d of %d requests failed (more than %.1f%%); first: %s",
			r.Target, r.Workers, r.Errors, r.Requests, 100*maxFailRatio, r.FirstErr)
	}
	return nil
}

// Run starts the target of c, loads it for c.Warmup and then c.Duration, stops it, and returns
// what the measured window saw; progress lines ("# …") go to log (nil: nowhere). The error is
// for a run that could not be done or cleaned up: a refused Config (ErrConfig), a target that
// did not start or stop, an index that did not fill; failed requests are the Result's, see
// Result.Err. When ctx is done the run stops early and the Result covers what was measured.
func Run(ctx context.Context, c Config, log io.Writer) (Result, error) {
	if err := c.Check(nil); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if log == nil {
		log = io.Discard
	}
	return run(ctx, c, log)
}

// run is Run on a checked Config.
func run(ctx context.Context, c Config, log io.Writer) (Result, error) {
	w := newWorkload(&c)
	t0 := time.Now()
	t, err := start(&c, w)
	if err != nil {
		return Result{}, err
	}
	fmt.Fprintf(log, "# %s at %s: %d workers ready in %v\n", c.Target, t.addr, c.Workers, time.Since(t0).Round(time.Millisecond))
	res, err := measure(ctx, t, w, &c)
	if stopErr := t.stop(); stopErr != nil {
		return res, fmt.Errorf("stopping %s: %w", c.Target, stopErr)
	}
	return res, err
}

// measure loads t, a started target of c, for c.WarmupCalls requests (a closed loop's prelude),
// c.Warmup and then c.Duration, streaming events into it meanwhile when c.EventRate is set and t
// is an in-process kvrouterd; the error is the stream's or c.LatencyLog's.
func measure(ctx context.Context, t *target, w *workload, c *Config) (Result, error) {
	cl := client.New(client.Config{Addr: t.addr, Timeout: c.Timeout, MaxConns: c.Conns})
	stop := make(chan struct{})
	streamed := make(chan error, 1)
	var st streamStats
	stream := c.EventRate > 0 && t.filler != nil
	if stream {
		go func() { streamed <- t.filler.stream(t.router, c.EventRate, stop, &st) }()
	} else {
		streamed <- nil
	}
	var at [2]router.Stats
	edges := 0
	var edge func()
	if t.router != nil {
		edge = func() {
			at[edges] = t.router.Stats()
			edges++
		}
	}
	res, logErr := load(ctx, cl, w, c, edge)
	close(stop)
	err := <-streamed
	if stream {
		res.EventRate = c.EventRate
		res.EventsSkipped = st.skipped.Load()
	}
	if edges == 2 {
		a, b := at[0].Events, at[1].Events
		res.EventsApplied = float64(b.StoredBlocks+b.RemovedBlocks-a.StoredBlocks-a.RemovedBlocks) / c.Duration.Seconds()
		res.Residencies = a.Residencies
	}
	if logErr != nil {
		err = errors.Join(err, fmt.Errorf("writing the latency log: %w", logErr))
	}
	return res, err
}

// conn is one load goroutine's state; it belongs to that goroutine until load merges it.
type conn struct {
	idx    int
	rng    *rand.Rand
	req    wire.RouteRequest
	resp   wire.RouteResponse
	id     []byte // the request id prefix, then the current request's sequence number
	prefix int    // length of the id prefix
	cands  int    // candidates every answer must carry, -1 for any
	seq    int64
	lat    []time.Duration // of the measured successful routes
	from   []time.Time     // when each of lat was timed from, with Config.LatencyLog
	n, ok  int64
	errs   int64
	bad    int64
	unsent int64
	first  error // of the measured window
	warm   int64 // failures during the warmup
	wfirst error
	last   time.Time // when the last measured request finished
	// logFrom keeps from, for Config.LatencyLog.
	logFrom bool
}

// load drives c.Conns goroutines against cl, a closed loop first for c.WarmupCalls requests
// between them, then for c.Warmup and c.Duration, and summarizes the measured window; the error
// is c.LatencyLog's. edge, if not nil, is called at the window's start and at its end, right
// after the CPU accounting is sampled there.
func load(ctx context.Context, cl *client.Client, w *workload, c *Config, edge func()) (Result, error) {
	// A nonce in the request ids keeps runs against the same external kvrouterd apart.
	nonce := strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36)
	conns := make([]*conn, c.Conns)
	for i := range conns {
		k := &conn{idx: i, rng: rand.New(rand.NewPCG(c.Seed, uint64(i)+1))}
		k.req.Model = model
		k.req.MaxCandidates = uint16(c.MaxCandidates)
		k.cands = -1 // the no-op target's usual answer is fixed
		if c.NoopCandidates > 0 {
			k.cands = c.NoopCandidates
		}
		if c.Target == "kvrouterd" {
			k.cands = c.Workers
			if c.MaxCandidates > 0 {
				k.cands = min(c.MaxCandidates, c.Workers)
			}
		}
		k.logFrom = c.LatencyLog != nil
		k.id = append(k.id, "kvrl-"+nonce+"-"+strconv.Itoa(i)+"-"...)
		k.prefix = len(k.id)
		conns[i] = k
	}
	if c.Rate == 0 && c.WarmupCalls > 0 {
		// A closed loop's rate is not known beforehand, so its warm-up in calls is a prelude.
		var sent atomic.Int64
		var wg sync.WaitGroup
		for _, k := range conns {
			wg.Go(func() {
				for ctx.Err() == nil && sent.Add(1) <= int64(c.WarmupCalls) {
					k.request(cl, w, time.Now(), false)
				}
			})
		}
		wg.Wait()
	}
	start := time.Now()
	ws := start.Add(c.Warmup)
	end := ws.Add(c.Duration)
	var wg sync.WaitGroup
	for _, k := range conns {
		wg.Go(func() {
			if c.Rate > 0 {
				k.openLoop(ctx, c, start, ws, end, newAlarm, func(_, from time.Time, measured bool) { k.request(cl, w, from, measured) })
			} else {
				k.closedLoop(ctx, cl, w, ws, end)
			}
		})
	}
	// Sample the CPU accounting at the window's edges while the goroutines run.
	sleepUntil(ctx, ws)
	cpu0 := sampleCPU()
	if edge != nil {
		edge()
	}
	sleepUntil(ctx, end)
	cpu1 := sampleCPU()
	if edge != nil {
		edge()
	}
	wg.Wait()

	r := Result{Target: c.Target, Workers: c.Workers, MaxCandidates: c.MaxCandidates, NoopCandidates: c.NoopCandidates, Blocks: c.Blocks, BlockSize: c.BlockSize, Conns: c.Conns, Rate: c.Rate}
	var lat []time.Duration
	last := end
	for _, k := range conns {
		if k.last.After(last) {
			last = k.last
		}
		r.Requests += k.n
		r.OK += k.ok
		r.Errors += k.errs + k.bad + k.unsent
		r.BadAnswer += k.bad
		r.Unsent += k.unsent
		if k.first != nil && r.FirstErr == "" {
			r.FirstErr = k.first.Error()
		}
		r.WarmupErrors += k.warm
		if k.wfirst != nil && r.WarmupErr == "" {
			r.WarmupErr = k.wfirst.Error()
		}
		lat = append(lat, k.lat...)
	}
	// An open loop that fell behind finishes its window's requests after the window: its rate is
	// over the time it took, not the window's.
	r.Seconds = last.Sub(ws).Seconds()
	r.RPS = float64(r.OK) / r.Seconds
	self, others := cpuUse(cpu0, cpu1)
	r.Others = others
	if others >= 0 {
		r.Others = math.Round(1000*others) / 10
	}
	if r.RPS > 0 && self > 0 {
		// The CPU time is the window's; so is this count of requests.
		r.CPUPerReq = float64(self) / 1e3 / (r.RPS * c.Duration.Seconds())
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		us := func(d time.Duration) float64 { return float64(d) / 1e3 }
		// Nearest rank: the smallest sample with at least q of the samples at or below it.
		q := func(q float64) float64 {
			i := int(math.Ceil(q*float64(len(lat)))) - 1
			return us(lat[min(max(i, 0), len(lat)-1)])
		}
		var sum time.Duration
		for _, d := range lat {
			sum += d
		}
		r.P50, r.P90, r.P99, r.P999 = q(0.5), q(0.9), q(0.99), q(0.999)
		r.Max = us(lat[len(lat)-1])
		r.Mean = us(sum / time.Duration(len(lat)))
	}
	if c.LatencyLog != nil {
		return r, writeLatencyLog(c.LatencyLog, conns, ws)
	}
	return r, nil
}

// writeLatencyLog writes the conns' measured routes to out as Config.LatencyLog describes,
// timed from ws.
func writeLatencyLog(out io.Writer, conns []*conn, ws time.Time) error {
	type line struct {
		from, lat time.Duration
		conn      int
	}
	var lines []line
	for _, k := range conns {
		for i, d := range k.lat {
			lines = append(lines, line{k.from[i].Sub(ws), d, k.idx})
		}
	}
	slices.SortFunc(lines, func(a, b line) int { return cmp.Compare(a.from, b.from) })
	bw := bufio.NewWriter(out)
	for _, l := range lines {
		fmt.Fprintf(bw, "%d %d %d\n", l.from.Microseconds(), l.lat.Microseconds(), l.conn)
	}
	return bw.Flush()
}

// closedLoop sends the next request as soon as the previous one is done, until end.
func (k *conn) closedLoop(ctx context.Context, cl *client.Client, w *workload, ws, end time.Time) {
	for ctx.Err() == nil {
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		k.request(cl, w, t0, !t0.Before(ws))
	}
}

// openLoop sends request j of this goroutine at start + idx/rate + j·conns/rate, so that the
// goroutines together send at c.Rate, evenly spaced, waking on an alarm (see alarm). A request due
// while the goroutine was idle is timed from when it woke, since the wake-up's lateness is the
// load generator's, not the target's; one that came due while it still waited for an earlier
// answer is sent at once and timed from its scheduled time, so that queueing is not hidden
// (coordinated omission). Requests still unsent drainGrace after the window count as failed.
// mk makes the alarm for the schedule (newAlarm); send does the request scheduled at sched,
// timing it from from.
func (k *conn) openLoop(ctx context.Context, c *Config, start, ws, end time.Time, mk func(time.Time, time.Duration) alarm, send func(sched, from time.Time, measured bool)) {
	// The schedule in whole nanoseconds, as the alarm keeps it.
	period := time.Duration(float64(c.Conns) * 1e9 / c.Rate)
	first := start.Add(time.Duration(float64(k.idx) * 1e9 / c.Rate))
	at := func(j int64) time.Time { return first.Add(time.Duration(j) * period) }
	alarm := mk(first, period)
	defer alarm.stop()
	hard := end.Add(drainGrace)
	for j := int64(0); ctx.Err() == nil; j++ {
		sched := at(j)
		if !sched.Before(end) {
			return
		}
		from := sched
		if now := time.Now(); sched.After(now) {
			if err := alarm.waitUntil(sched); err != nil {
				return
			}
			from = time.Now()
		} else if now.After(hard) {
			// Too far behind to catch up: the rest of the window counts as failed.
			for ; at(j).Before(end); j++ {
				if !at(j).Before(ws) {
					k.n++
					k.unsent++
				}
			}
			if k.first == nil {
				k.first = fmt.Errorf("open loop at %.0f req/s: connection %d had %d requests still unsent %v after the window",
					c.Rate, k.idx, k.unsent, drainGrace)
			}
			return
		}
		send(sched, from, !sched.Before(ws))
	}
}

// request routes one prompt and completes it, timing the route from from.
func (k *conn) request(cl *client.Client, w *workload, from time.Time, measured bool) {
	k.req.Tokens, _ = w.prompt(k.rng, k.req.Tokens)
	k.seq++
	k.id = strconv.AppendInt(k.id[:k.prefix], k.seq, 10)
	k.req.RequestID = string(k.id)
	err := cl.Route(&k.req, &k.resp)
	lat := time.Since(from)
	if measured {
		k.n++
	}
	if err != nil {
		k.fail(err, measured, &k.errs)
		return
	}
	if !k.resp.Chosen || k.resp.Worker < workerID(0) || k.resp.Worker > workerID(w.workers-1) {
		k.fail(fmt.Errorf("route %s: the answer chose no registered worker: chosen %v, worker %d",
			k.req.RequestID, k.resp.Chosen, k.resp.Worker), measured, &k.bad)
		return
	}
	if k.cands >= 0 && len(k.resp.Candidates) != k.cands {
		k.fail(fmt.Errorf("route %s: %d candidates in the answer, want %d (max_candidates %d, %d workers)",
			k.req.RequestID, len(k.resp.Candidates), k.cands, k.req.MaxCandidates, w.workers), measured, &k.bad)
		return
	}
	if err := cl.Complete(k.req.RequestID); err != nil {
		k.fail(err, measured, &k.errs)
		return
	}
	if measured {
		k.ok++
		k.lat = append(k.lat, lat)
		if k.logFrom {
			k.from = append(k.from, from)
		}
		k.last = time.Now()
	}
}

// fail records a failure: in counter during the measured window, as a warmup error before it.
func (k *conn) fail(err error, measured bool, counter *int64) {
	if !measured {
		k.warm++
		if k.wfirst == nil {
			k.wfirst = err
		}
		return
	}
	*counter++
	if k.first == nil {
		k.first = err
	}
}

// sleepUntil sleeps until t or until ctx is done.
func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}
