// Package fleet replays a workload on simulated inference workers routed by kvrouterd's own
// router, in process, on a simulated clock: a discrete-event simulation, deterministic for a
// seed, that runs an hour of trace in seconds. Each arriving request is routed (router.Route),
// submitted to the chosen worker (bench/sim), and the workers' KV events, prefill completions
// and request completions go back to the router when the simulated step that produced them
// ends, as they would from real engines.
//
// The router is a Router: by default a router.Router in process, unpaced. Package bench/e2e
// supplies one that drives a running daemon over HTTP and NATS; such a router applies events
// when they arrive, so the simulation must then keep to wall time (Config.Pace), and is no
// longer deterministic.
package fleet

import (
	"container/heap"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Config configures a simulation; a plain value.
type Config struct {
	Workers int
	Mode    scoring.Mode // routing mode (kv by default)
	// OverlapWeight (0: 1.0), Temperature (0) and NoPrefill (false: a request's own uncached
	// tokens are charged and booked as prefill) are the router's cost settings.
	OverlapWeight float64
	Temperature   float64
	NoPrefill     bool // Dynamo's track_prefill_tokens=false: routing on load alone
	Worker        sim.WorkerConfig
	Seed          uint64
	// Sample, if > 0, records every worker's running and waiting requests every Sample of
	// simulated time.
	Sample time.Duration
	// OnEvents, if set, sees every batch of KV events a worker published, at the simulated time
	// the router got it (events is reused after the call returns): the trace's event stream,
	// for replay into an index elsewhere.
	OnEvents func(at time.Duration, worker uint64, events []kvevent.Event)

	// Router, if set, is driven instead of a router.Router of Run's own. Run registers the
	// workers on it (ids 1 to Workers, model "sim", the workers' block size) and does not close
	// it. Mode, OverlapWeight and Temperature go with every route request; NoPrefill and Seed
	// are then the router's own business. Run records each Route call's wall time.
	Router Router
	// Pace ties the simulated clock to wall time, in simulated seconds per wall second: before
	// handling an event at simulated time t, Run waits until wall time start + (t − first
	// arrival)/Pace. 0 runs unpaced, as fast as possible, which suits only a router that
	// applies events before Router.Events returns (the default one).
	Pace float64
}

// Result is what one simulation measured; plain data.
type Result struct {
	Requests      int
	TTFT, E2E     []time.Duration // per request, in arrival order
	PromptTokens  int64
	CachedTokens  int64 // prompt tokens served from a worker's prefix cache
	OutputTokens  int64
	Makespan      time.Duration // first arrival to last completion
	PerWorker     []int         // requests routed to each worker
	Samples       []LoadSample
	RouteFailures int
	RouteErr      string // the first route failure, if any
	Refused       int    // requests larger than a worker's whole KV cache
	CallErrors    int    // prefill-done and complete calls the router refused
	Blocks        []int  // blocks each worker holds at the end (sim.Worker.CachedBlocks)

	// RouteLatency is the wall time of each Route call, in arrival order, when Config.Router
	// is set (nil otherwise).
	RouteLatency []time.Duration
	// MaxLag is how far behind its pace the simulation fell at worst (Config.Pace > 0): the
	// wall time between an event's due time and its handling. A run whose lag grows with the
	// trace could not keep pace.
	MaxLag time.Duration
}

// LoadSample is the fleet's load at one simulated instant.
type LoadSample struct {
	At      time.Duration
	Running []int // per worker
	Waiting []int
}

// HitRate is the fraction of prompt tokens served from cache.
func (r *Result) HitRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.CachedTokens) / float64(r.PromptTokens)
}

// Imbalance is the most requests any worker got over the mean (1 = perfectly even).
func (r *Result) Imbalance() float64 {
	if len(r.PerWorker) == 0 || r.Requests == 0 {
		return 0
	}
	return float64(slices.Max(r.PerWorker)) * float64(len(r.PerWorker)) / float64(r.Requests)
}

// worker is one simulated worker and its step in flight.
type worker struct {
	id   uint64
	w    *sim.Worker
	out  sim.StepOutput
	busy bool  // a step is in flight, ending at end
	end  int64 // ns
	idx  int   // position in the heap
}

// stepHeap orders the workers with a step in flight by its end, then by id.
type stepHeap []*worker

func (h stepHeap) Len() int { return len(h) }
func (h stepHeap) Less(i, j int) bool {
	return h[i].end < h[j].end || h[i].end == h[j].end && h[i].id < h[j].id
}
func (h stepHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *stepHeap) Push(x any)   { w := x.(*worker); w.idx = len(*h); *h = append(*h, w) }
func (h *stepHeap) Pop() any     { old := *h; w := old[len(old)-1]; *h = old[:len(old)-1]; return w }
func (h stepHeap) peek() *worker { return h[0] }

const model = "sim"

// Run replays reqs (sorted by arrival) on cfg.Workers simulated workers.
func Run(cfg Config, reqs []trace.Request) (*Result, error) {
	if cfg.Workers < 1 {
		return nil, fmt.Errorf("fleet: %d workers", cfg.Workers)
	}
	if !slices.IsSortedFunc(reqs, func(a, b trace.Request) int { return int(a.At - b.At) }) {
		return nil, fmt.Errorf("fleet: requests not sorted by arrival")
	}
	wc := cfg.Worker
	if wc.BlockSize == 0 {
		wc.BlockSize = 64
	}
	// now is the simulated clock; clock mirrors it for the router, whose expiry goroutine reads
	// it concurrently.
	var (
		now   int64
		clock atomic.Int64
	)
	rt := cfg.Router
	if rt == nil {
		r := router.New(router.Config{
			BlockSize:      wc.BlockSize,
			Mode:           cfg.Mode,
			OverlapWeight:  cfg.OverlapWeight, // 0: the router's default, 1.0
			Temperature:    cfg.Temperature,
			NoTrackPrefill: cfg.NoPrefill,
			RequestExpiry:  24 * time.Hour,
			Shards:         1,
			Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
			Rand:           rand.New(rand.NewPCG(cfg.Seed, 0x666c656574)),
			Now:            clock.Load,
		})
		defer r.Close()
		rt = &local{r: r}
	}
	ws := make([]*worker, cfg.Workers)
	for i := range ws {
		id := uint64(i + 1)
		ws[i] = &worker{id: id, w: sim.NewWorker(id, wc)}
		if err := rt.Register(router.Registration{ID: id, Model: model, BlockSize: wc.BlockSize}); err != nil {
			return nil, fmt.Errorf("fleet: register worker %d: %w", id, err)
		}
	}
	res := &Result{Requests: len(reqs), TTFT: make([]time.Duration, len(reqs)), E2E: make([]time.Duration, len(reqs)),
		PerWorker: make([]int, cfg.Workers)}
	// A router of the caller's gets the simulation's settings with every request.
	req0 := wire.RouteRequest{Model: model}
	if cfg.Router != nil {
		res.RouteLatency = make([]time.Duration, len(reqs))
		req0.Mode = wire.Mode(cfg.Mode)
		if cfg.Mode == scoring.Default {
			req0.Mode = wire.ModeKV
		}
		req0.HasWeight, req0.Weight = true, cfg.OverlapWeight
		if req0.Weight == 0 {
			req0.Weight = 1
		}
		req0.HasTemperature, req0.Temperature = true, cfg.Temperature
	}
	arrival := make([]int64, len(reqs))
	var h stepHeap
	start := func(w *worker, at int64) {
		if w.busy || w.w.Idle() {
			return
		}
		w.end = w.w.Step(at, &w.out)
		w.busy = true
		heap.Push(&h, w)
	}
	var batch wire.EventBatch
	ids := make([]string, len(reqs))
	// deliver hands the router what worker w's finished step produced.
	deliver := func(w *worker) error {
		if len(w.out.Events) > 0 {
			if cfg.OnEvents != nil {
				cfg.OnEvents(time.Duration(now), w.id, w.out.Events)
			}
			batch = wire.EventBatch{Worker: w.id, Model: model, Events: w.out.Events}
			if err := rt.Events(&batch); err != nil {
				return fmt.Errorf("worker %d events: %w", w.id, err)
			}
		}
		for _, d := range w.out.PrefillDone {
			res.TTFT[d.ID] = time.Duration(d.At - arrival[d.ID])
			res.CachedTokens += int64(d.Cached)
			if rt.PrefillDone(ids[d.ID]) != nil {
				res.CallErrors++
			}
		}
		for _, d := range w.out.Completed {
			res.E2E[d.ID] = time.Duration(d.At - arrival[d.ID])
			if rt.Complete(ids[d.ID]) != nil {
				res.CallErrors++
			}
			res.Makespan = max(res.Makespan, time.Duration(d.At))
		}
		return nil
	}
	var (
		req     wire.RouteRequest
		resp    wire.RouteResponse
		next    = 0
		sampleT int64
		pace    = pacer{pace: cfg.Pace}
	)
	if len(reqs) > 0 {
		pace.origin, pace.start = int64(reqs[0].At), time.Now()
	}
	for next < len(reqs) || h.Len() > 0 {
		// Step ends first at equal times: the router sees what the workers did by then.
		if h.Len() > 0 && (next == len(reqs) || h.peek().end <= int64(reqs[next].At)) {
			pace.wait(h.peek().end)
			w := heap.Pop(&h).(*worker)
			now = w.end
			clock.Store(now)
			w.busy = false
			if err := deliver(w); err != nil {
				return nil, err
			}
			start(w, now)
			continue
		}
		q := &reqs[next]
		pace.wait(int64(q.At))
		now = int64(q.At)
		clock.Store(now)
		for cfg.Sample > 0 && sampleT <= now {
			s := LoadSample{At: time.Duration(sampleT), Running: make([]int, len(ws)), Waiting: make([]int, len(ws))}
			for i, w := range ws {
				s.Running[i], s.Waiting[i] = w.w.Running(), w.w.Waiting()
			}
			res.Samples = append(res.Samples, s)
			sampleT += int64(cfg.Sample)
		}
		arrival[next] = now
		ids[next] = strconv.Itoa(next)
		req = req0
		req.RequestID, req.Tokens = ids[next], q.Tokens
		t0 := time.Now()
		err := rt.Route(&req, &resp)
		if res.RouteLatency != nil {
			res.RouteLatency[next] = time.Since(t0)
		}
		if err == nil && (resp.Worker < 1 || resp.Worker > uint64(len(ws))) {
			err = fmt.Errorf("fleet: routed to worker %d, not a simulated one", resp.Worker)
		}
		if err != nil {
			if res.RouteFailures == 0 {
				res.RouteErr = err.Error()
			}
			res.RouteFailures++
			next++
			continue
		}
		w := ws[resp.Worker-1]
		res.PerWorker[resp.Worker-1]++
		res.PromptTokens += int64(len(q.Tokens))
		res.OutputTokens += int64(max(q.Output, 1))
		if err := w.w.Submit(&sim.Request{ID: uint64(next), Tokens: q.Tokens, Output: max(q.Output, 1)}, now); err != nil {
			// Larger than the worker's whole cache: no engine could serve it.
			res.Refused++
			if rt.Complete(ids[next]) != nil {
				res.CallErrors++
			}
			next++
			continue
		}
		start(w, now)
		next++
	}
	if len(reqs) > 0 {
		res.Makespan -= reqs[0].At
	}
	res.MaxLag = pace.maxLag
	res.Blocks = make([]int, len(ws))
	for i, w := range ws {
		res.Blocks[i] = w.w.CachedBlocks()
	}
	return res, nil
}
