package mocker

import (
	"log/slog"
	"sync"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/kvevent"
)

// end is how a request ended, or endNone while it runs.
type end uint8

const (
	endNone     end = iota
	endFinished     // every output token emitted ("length")
	endAborted      // its client went away, or the mocker shut down
	endFailed       // the worker refused it (err)
)

// request is one request inside the mocker: written by the engine goroutine, read by the HTTP
// handler that submitted it, which waits on wake.
type request struct {
	id     uint64
	prompt []uint32 // the worker reads it until the request ends: never modified
	output int      // output tokens to generate
	wake   chan struct{}

	remote bool // its prompt's KV arrived from a prefill worker (sim.Request.Remote)
	hold   bool // its blocks stay pinned at completion for a decode worker to read (sim.Request.Hold)

	mu     sync.Mutex
	n      int     // output tokens emitted; REQUIRES mu
	cached int     // prompt tokens that were a prefix-cache hit, known from the first token; REQUIRES mu
	end    end     // REQUIRES mu
	err    error   // why the worker refused it, with endFailed; REQUIRES mu
	held   []int32 // a hold request's pinned block slots, once it has finished; REQUIRES mu
}

// progress returns what the engine has reported of r so far.
func (r *request) progress() (n, cached int, e end, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.cached, r.end, r.err
}

// update changes r under its lock and wakes its handler.
func (r *request) update(f func(r *request)) {
	r.mu.Lock()
	f(r)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default: // a wake-up is already pending: the handler reads the latest state
	}
}

func (r *request) finish(e end, err error) {
	r.update(func(r *request) {
		if r.end == endNone {
			r.end, r.err = e, err
		}
	})
}

// Stats are an engine's counters and gauges, as of the end of its last step.
type Stats struct {
	Running, Waiting int     // requests running and queued in the worker
	Usage            float64 // fraction of the KV blocks held by running requests (vLLM counts unused cached blocks as free)
	CachedBlocks     int     // blocks stored and published
	sim.Stats                // the worker's cumulative counters (RemoteTokens, ComputedTokens among them)
	Generated        uint64  // output tokens emitted
	Transfers                // the KV connector's counters
}

// Transfers are the KV connector's counters: a prefill worker's held blocks and their fate, a
// decode worker's reads.
type Transfers struct {
	Held     int    // finished prefill requests whose blocks wait to be read
	Sent     uint64 // held transfers a decode worker read and released
	Expired  uint64 // held transfers nobody read within Config.KVTransferTimeout, released
	Received uint64 // transfers this worker read before decoding
	BlocksIn uint64 // blocks they brought
	BytesIn  uint64 // bytes they brought (blocks × block size × Config.KVBytesPerToken)
	// TransferTime is the modelled time the reads took, simulated (bytes / bandwidth +
	// Config.KVTransferLatency each); the wall time slept is that divided by Config.Speedup.
	TransferTime time.Duration
	// Failed counts the reads that failed (the prefill worker unreachable, the transfer
	// unknown or expired, another block size): the prompt was computed here instead.
	Failed uint64
}

// opKind is what an op asks of the engine goroutine.
type opKind uint8

const (
	opSubmit  opKind = iota
	opAbort          // drop the request (its client went away)
	opRelease        // unpin a finished hold request's blocks (read, or given up)
)

// op is a submission, an abort or a release for the engine goroutine.
type op struct {
	r    *request
	kind opKind
}

// engine runs a sim.Worker in real time: its goroutine (run) is the only one that touches the
// worker. Handlers hand it submissions and aborts through a queue under mu; it steps the
// worker, sleeps each step's simulated duration divided by the speedup, then publishes the
// step's KV events and reports each request's progress. submit, abort, stats and close are
// safe for concurrent use.
type engine struct {
	w       *sim.Worker
	speedup float64
	publish func(*sim.StepOutput) // the step's KV events; nil: none
	log     *slog.Logger

	mu      sync.Mutex
	pending []op          // REQUIRES mu
	closed  bool          // no more submissions; REQUIRES mu
	nextID  uint64        // REQUIRES mu
	st      Stats         // REQUIRES mu
	kick    chan struct{} // cap 1: pending grew
	stop    chan struct{} // closed by close
	done    chan struct{} // closed when run has returned
	stopped sync.Once

	reqs map[uint64]*request // requests in the worker; run's goroutine only

	// cached mirrors the worker's cached blocks (engine hashes), kept from the published
	// events, so that a decode request can tell which of its prompt blocks it need not read
	// from the prefill worker. REQUIRES mu.
	cached map[uint64]struct{}
}

func newEngine(w *sim.Worker, speedup float64, publish func(*sim.StepOutput), log *slog.Logger) *engine {
	e := &engine{w: w, speedup: speedup, publish: publish, log: log,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		reqs: make(map[uint64]*request), cached: make(map[uint64]struct{})}
	go e.run()
	return e
}

// submit queues a request of prompt (kept, never modified) generating output tokens; remote
// and hold are sim.Request's flags. After close it returns a request already aborted.
func (e *engine) submit(prompt []uint32, output int, remote, hold bool) *request {
	r := &request{prompt: prompt, output: output, remote: remote, hold: hold, wake: make(chan struct{}, 1)}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		r.finish(endAborted, nil)
		return r
	}
	e.nextID++
	r.id = e.nextID
	e.pending = append(e.pending, op{r: r})
	e.mu.Unlock()
	e.poke()
	return r
}

// abort asks the engine to drop r, whose client went away. A request already ended is left as
// it is.
func (e *engine) abort(r *request) { e.queue(op{r: r, kind: opAbort}) }

// release asks the engine to unpin the blocks of r, a hold request that has finished.
func (e *engine) release(r *request) { e.queue(op{r: r, kind: opRelease}) }

func (e *engine) queue(o op) {
	e.mu.Lock()
	if !e.closed {
		e.pending = append(e.pending, o)
	}
	e.mu.Unlock()
	e.poke()
}

// cachedPrefix returns how many of hashes, from the first, the worker has cached (as of its
// last step), at most limit.
func (e *engine) cachedPrefix(hashes []uint64, limit int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for n < min(limit, len(hashes)) {
		if _, ok := e.cached[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// count changes the transfer counters.
func (e *engine) count(f func(t *Transfers)) {
	e.mu.Lock()
	f(&e.st.Transfers)
	e.mu.Unlock()
}

func (e *engine) poke() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// stats returns the engine's counters as of its last step.
func (e *engine) stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st
}

// close stops the engine: every request in flight or queued ends aborted. It returns once the
// engine goroutine is gone; closing twice is harmless.
func (e *engine) close() {
	e.stopped.Do(func() { close(e.stop) })
	<-e.done
}

func (e *engine) run() {
	defer close(e.done)
	var (
		out     sim.StepOutput
		now     int64     // simulated time, ns
		due     time.Time // when the simulated instant now is due on the wall clock
		ops     []op
		stopped = false
	)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for !stopped {
		idle := e.w.Idle()
		if idle {
			select {
			case <-e.kick:
			case <-e.stop:
				stopped = true
				continue
			}
		}
		e.mu.Lock()
		ops, e.pending = e.pending, ops[:0]
		e.mu.Unlock()
		for _, o := range ops {
			e.apply(o, now)
		}
		clear(ops)
		if e.w.Idle() {
			e.gauges(0)
			continue
		}
		if idle {
			due = time.Now()
		}
		end := e.w.Step(now, &out)
		due = due.Add(time.Duration(float64(end-now) / e.speedup))
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-e.stop:
				timer.Stop()
				stopped = true
				continue
			}
		} else if wait < -time.Second {
			// Far behind (a paused process, an overloaded host): carry on from now rather
			// than run the backlog of steps without pausing.
			due = time.Now()
		}
		now = end
		if e.publish != nil {
			e.publish(&out)
		}
		e.track(&out)
		e.deliver(&out)
		e.gauges(len(out.Emitted))
	}
	e.mu.Lock()
	e.closed = true
	ops = e.pending
	e.pending = nil
	e.mu.Unlock()
	for _, o := range ops {
		o.r.finish(endAborted, nil)
	}
	for id, r := range e.reqs {
		e.w.Abort(id)
		r.finish(endAborted, nil)
	}
	clear(e.reqs)
	e.gauges(0)
}

// apply runs one submission, abort or release on the worker.
func (e *engine) apply(o op, now int64) {
	r := o.r
	switch o.kind {
	case opAbort:
		if e.reqs[r.id] == r && e.w.Abort(r.id) {
			delete(e.reqs, r.id)
			r.finish(endAborted, nil)
			e.log.Debug("request aborted", "request", r.id)
		}
		return
	case opRelease:
		e.w.Release(r.id)
		return
	}
	if err := e.w.Submit(&sim.Request{ID: r.id, Tokens: r.prompt, Output: r.output, Remote: r.remote, Hold: r.hold}, now); err != nil {
		r.finish(endFailed, err)
		return
	}
	e.reqs[r.id] = r
}

// deliver reports a step's output to its requests.
func (e *engine) deliver(out *sim.StepOutput) {
	for _, d := range out.PrefillDone {
		if r := e.reqs[d.ID]; r != nil {
			r.mu.Lock()
			r.cached = d.Cached
			r.mu.Unlock()
		}
	}
	for _, t := range out.Emitted {
		if r := e.reqs[t.ID]; r != nil {
			r.update(func(r *request) { r.n = t.N })
		}
	}
	for _, d := range out.Completed {
		if r := e.reqs[d.ID]; r != nil {
			delete(e.reqs, d.ID)
			if r.hold {
				held, _ := e.w.AppendHeldBlocks(nil, d.ID)
				r.mu.Lock()
				r.held = held
				r.mu.Unlock()
			}
			r.finish(endFinished, nil)
		}
	}
}

// track keeps the mirror of the worker's cached blocks up to date with a step's events.
func (e *engine) track(out *sim.StepOutput) {
	if len(out.Events) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range out.Events {
		ev := &out.Events[i]
		switch ev.Kind {
		case kvevent.Stored:
			for _, h := range ev.Hashes {
				e.cached[h] = struct{}{}
			}
		case kvevent.Removed:
			for _, h := range ev.Hashes {
				delete(e.cached, h)
			}
		case kvevent.Cleared:
			clear(e.cached)
		}
	}
}

func (e *engine) gauges(emitted int) {
	e.mu.Lock()
	e.st.Held = e.w.Held()
	e.st.Running, e.st.Waiting = e.w.Running(), e.w.Waiting()
	e.st.Usage, e.st.CachedBlocks = e.w.ActiveUsage(), e.w.CachedBlocks()
	e.st.Stats = e.w.Stats()
	e.st.Generated += uint64(emitted)
	e.mu.Unlock()
}
