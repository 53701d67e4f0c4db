// Package fleet replays a workload on simulated inference workers routed by kvrouterd's own
// router, in process, on a simulated clock: a discrete-event simulation, deterministic for a
// seed, that runs an hour of trace in seconds. Each arriving request is routed (router.Route),
// submitted to the chosen worker (bench/sim), and the workers' KV events, prefill completions
// and request completions go back to the router when the simulated step that produced them
// ends, as they would from real engines.
//
// With Config.Queue the router queue stands in front of the fleet, as the front door or a
// gateway holds a request while kvrouterd's queue does: each arrival goes through
// router.Router.Enqueue, and a request the queue holds back starts on its worker at the simulated
// time of the prefill-done or completion that admitted it. Its TTFT counts from its arrival, the
// wait included.
//
// Three features of large fleets can be measured: a disaggregated fleet (Config.PrefillWorkers:
// prefill and decode pools at the same worker count, a prompt's KV moving between them at
// Config.Transfer's cost), a host-memory tier per worker (sim.WorkerConfig.HostBlocks, its
// events indexed by the router and credited by Config.TierCredit), and the delay between a
// worker storing a block and the router hearing of it (Config.EventDelay), against which the
// router's predict-on-route (Config.PredictedTTL) is meant to help.
//
// Run takes the whole workload and returns every request's figures; RunSource reads a
// trace.Source as requests come due and keeps only those in flight, so a workload of any length
// replays in bounded memory, its figures summarised in histograms.
//
// For comparison, the fleet can instead be routed by the default policies of the routers users
// would otherwise run (Config.Peer: llm-d's inference scheduler, SGLang's router, the Gateway
// API inference extension's endpoint picker; peer.go), each knowing only what it would in
// production: its own record of what it routed or the KV events, and the workers' metrics as a
// scrape sees them.
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
	"math"
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
	// Cost is the router's cost formula (scoring.CostV1 by default), Terms CostMain's terms
	// (nil: Dynamo main's defaults), NoAssumeReuse Dynamo's router_assume_kv_reuse=false
	// (Policy sets the three).
	Cost          scoring.CostModel
	Terms         *scoring.Terms
	NoAssumeReuse bool
	// CacheWeight is CostTTFT's cache weight (router.Config.CacheWeight; 0: its default).
	CacheWeight float64
	Worker      sim.WorkerConfig
	// Speeds, if set, makes the fleet heterogeneous: worker i+1 runs at Speeds[i] of
	// Worker's speed (its every step Worker.Timing's time / Speeds[i]); a missing or
	// non-positive entry is 1. The router is not told.
	Speeds []float64
	Seed   uint64
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

	// Queue, if set, turns on the router queue of Run's own router (router.Config.Queue) and
	// routes every arrival through it; a caller's Router must then be a Queuer, whose queue is
	// its own business. Workers register MaxBatchedTokens as their max batched tokens, so a rank
	// is busy above Threshold × that many booked prompt tokens not yet prefilled. A request
	// waits until a prefill-done or completion admits it, or, at the simulated time its longest
	// wait (MaxWait, 30 s when 0; the router's default) passes, is refused as the daemon's
	// RouteWait refuses it (Result.QueueTimedOut; it then has no TTFT). Recheck is ignored:
	// every change of a rank's load in a simulation reaches the router as a call that drains
	// the queue, and a wall-clock recheck would admit requests at no simulated time.
	Queue *router.QueueConfig
	// Priority, if set, gives request i (its index in the trace) a priority jump in seconds
	// (wire.RouteRequest.PriorityJump, Dynamo's nvext.agent_hints.priority); 0 is none.
	Priority func(i int) float64

	// PrefillWorkers, if > 0, makes the fleet disaggregated at the same worker count: workers
	// 1 to PrefillWorkers register as router.RolePrefill, the others as router.RoleDecode, and
	// every request asks for a disaggregated decision (wire.RouteRequest.Disagg). A request
	// given a prefill stage runs its prompt on the prefill worker, generating one token, with
	// its blocks held there (sim.Request.Hold); its KV then moves to the decode worker, which
	// takes Transfer.Time(prompt tokens) of simulated time, and the decode worker admits it
	// with its prompt computed (sim.Request.Remote), computes the last prompt token for the
	// first output token and decodes. Its TTFT is the decode worker's first token. The router
	// hears PrefillDone when the prefill stage ends, Complete when the decode stage does. A
	// request the router serves whole (Prefill false: a conditional bypass) runs on its decode
	// worker as in an aggregated fleet.
	PrefillWorkers int
	// Disagg is the router's disaggregation settings (router.Config.Disagg; nil: split every
	// request). Run's own router only.
	Disagg *router.DisaggConfig
	// Transfer is the cost of moving a prompt's KV from a prefill to a decode worker; its zero
	// fields take DefaultTransfer's.
	Transfer Transfer
	// EventDelay holds every batch of KV events back from the router this long after the step
	// that produced it ends, as an engine's publisher, the event bus and the router's apply
	// queue do (OnEvents sees a batch when the router gets it). Prefill-done and completion
	// calls are not delayed: they come from the request's own path.
	EventDelay time.Duration
	// PredictedTTL turns on the router's predict-on-route (router.Config.PredictedTTL) on the
	// simulated clock; 0 is off. Run's own router only.
	PredictedTTL time.Duration
	// TierCredit weighs the lower tiers' blocks in the router's cost (router.Config.TierCredit;
	// nil: the router's defaults). Run's own router only.
	TierCredit *scoring.TierCredit
	// ClosedLoop replays sessions closed-loop: a request with a Session id that an earlier
	// request of the trace shares is a later turn, and arrives only once the session's previous
	// turn has ended (completed, or refused), after a think time: the gap between the two turns'
	// arrivals in the trace (as scaled). The trace's arrivals hold for first turns and requests
	// without a session. The trace records arrivals only, so the gap also holds the answer's
	// time as it was served then: the think time is an upper bound, and a fleet slower than the
	// trace's stretches a session, as a user waiting for answers would. Off: every request
	// arrives at its trace time (open loop).
	ClosedLoop bool

	// Peer, if set, routes by another router's policy (peer.go) instead of kvrouterd's: Mode,
	// the cost settings and the router features above are then unused, and Router, Queue,
	// PrefillWorkers, PredictedTTL and TierCredit must be unset. Such a router knows what it
	// would in production: its own record of what it routed, or the KV events (llm-d), and
	// the workers' metrics scraped every ScrapeInterval (0: DefaultScrapeInterval).
	Peer           Peer
	ScrapeInterval time.Duration
}

// Transfer is the prefill-to-decode KV transfer of a disaggregated fleet: a fixed latency plus
// the prompt's KV bytes over the link. A plain value.
type Transfer struct {
	BytesPerToken float64       // KV bytes per prompt token (0: sim.KVBytesPerToken)
	Bandwidth     float64       // link bytes/s (0: DefaultTransferBandwidth)
	Latency       time.Duration // fixed cost per transfer (0: DefaultTransferLatency; negative: none)
}

const (
	// DefaultTransferBandwidth is one NVIDIA ConnectX-7 NIC's line rate, 400 Gb/s = 50 GB/s:
	// the RDMA NIC each GPU of a DGX H100 has for itself, over which NIXL moves KV blocks
	// between a prefill and a decode worker (vLLM's NixlConnector, Dynamo's disaggregated
	// serving).
	DefaultTransferBandwidth = 50e9
	// DefaultTransferLatency is the fixed cost of one transfer: the decode worker's read
	// request, the RDMA read's setup and the completion notice, each of the order of a hundred
	// microseconds, rounded up to a millisecond.
	DefaultTransferLatency = time.Millisecond
)

// DefaultTransfer is the transfer of an 8B model's KV (sim.KVBytesPerToken, 128 KiB per token)
// over one 400 Gb/s RDMA NIC with 1 ms of fixed cost: an 8,192-token prompt's 1.07 GB takes
// 1 + 21.5 ms, against its 165 ms of prefill.
func DefaultTransfer() Transfer {
	return Transfer{BytesPerToken: sim.KVBytesPerToken, Bandwidth: DefaultTransferBandwidth, Latency: DefaultTransferLatency}
}

func (t Transfer) withDefaults() Transfer {
	d := DefaultTransfer()
	if t.BytesPerToken <= 0 {
		t.BytesPerToken = d.BytesPerToken
	}
	if t.Bandwidth <= 0 {
		t.Bandwidth = d.Bandwidth
	}
	if t.Latency == 0 {
		t.Latency = d.Latency
	}
	return t
}

// Time is how long moving the KV of tokens prompt tokens takes: Latency + tokens ×
// BytesPerToken / Bandwidth, rounded to the nanosecond (zero fields: DefaultTransfer's). The
// whole prompt moves, whatever the decode worker holds (Dynamo's mocker's full-prompt timing
// mode): the decode stage is routed without regard to its cache.
func (t Transfer) Time(tokens int) time.Duration {
	t = t.withDefaults()
	return max(0, t.Latency) + time.Duration(math.Round(float64(tokens)*t.BytesPerToken/t.Bandwidth*1e9))
}

// Result is what one simulation measured; plain data.
type Result struct {
	Requests  int
	TTFT, E2E []time.Duration // per request, in the trace's order
	// PredErr holds, per request served whose route answer predicted its TTFT (a router
	// with scoring.CostTTFT), predicted / simulated TTFT − 1, in the order of first tokens;
	// Run only.
	PredErr []float64
	// Arrival is each request's arrival (from the trace's start): its trace time, or, closed
	// loop, when its session let it come.
	Arrival []time.Duration
	// LaterTurns is how many requests arrived closed-loop, after their session's previous turn.
	LaterTurns   int
	PromptTokens int64
	// CachedTokens are the prompt tokens served from a worker's prefix cache on the device (a
	// split request's: its prefill worker's).
	CachedTokens int64
	HostTokens   int64 // prompt tokens reloaded from a worker's host tier (sim.Done.Host)
	OutputTokens int64
	// Disaggregated: the requests the router split into two stages, and the simulated time
	// their KV transfers took in all.
	Split        int
	TransferTime time.Duration
	// PrefillBusy and DecodeBusy are the workers' step time spent in the timing model's prefill
	// and decode parts, summed over the fleet (sim.Stats.PrefillNs and DecodeNs).
	PrefillBusy, DecodeBusy time.Duration

	Makespan      time.Duration // first arrival to last completion
	PerWorker     []int         // requests routed to each worker (a split request: on both of its workers)
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

	// With Config.Queue: Queued counts the requests that waited in the router queue, QueueWait
	// is each request's wait from arrival to admission (0: routed at once), MaxQueued the
	// longest the queue grew, QueueTimedOut the requests refused when their longest wait passed
	// (a full queue counts as a route failure).
	Queued        int
	QueueWait     []time.Duration
	MaxQueued     int
	QueueTimedOut int
	// Booked is the requests Run's own router still counted active at the end (Stats'
	// ActiveRequests): 0 when every admitted request was completed and none leaked a booking.
	Booked int64

	// TTFTHist, E2EHist and ITLHist summarise the served requests' TTFT, E2E and mean
	// inter-token latency (the positive values of TTFT, E2E and ITL): all RunSource keeps.
	TTFTHist, E2EHist, ITLHist Hist
	// MaxInFlight is the most requests the run held at once: arrived and not over, or read
	// and waiting for their session's previous turn to end.
	MaxInFlight int
}

// LoadSample is the fleet's load at one simulated instant.
type LoadSample struct {
	At      time.Duration
	Running []int // per worker
	Waiting []int
}

// HitRate is the fraction of prompt tokens served from a device cache (host reloads not
// counted: see HostHitRate).
func (r *Result) HitRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.CachedTokens) / float64(r.PromptTokens)
}

// HostHitRate is the fraction of prompt tokens reloaded from a host tier.
func (r *Result) HostHitRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.HostTokens) / float64(r.PromptTokens)
}

// ITL returns each request's mean inter-token latency, (E2E − TTFT) / (output − 1), in
// arrival order; 0 for a request with a single output token or never served. reqs are the
// requests Run was given.
func (r *Result) ITL(reqs []trace.Request) []time.Duration {
	itl := make([]time.Duration, len(r.E2E))
	for i, e := range r.E2E {
		if n := max(reqs[i].Output, 1) - 1; n > 0 && e > 0 && r.TTFT[i] > 0 {
			itl[i] = (e - r.TTFT[i]) / time.Duration(n)
		}
	}
	return itl
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

// Run replays reqs (sorted by arrival) on cfg.Workers simulated workers. The Result holds every
// request's TTFT, E2E, arrival and queue wait, in reqs' order.
func Run(cfg Config, reqs []trace.Request) (*Result, error) {
	if !slices.IsSortedFunc(reqs, func(a, b trace.Request) int { return int(a.At - b.At) }) {
		return nil, fmt.Errorf("fleet: requests not sorted by arrival")
	}
	return run(cfg, trace.SliceSource(reqs), len(reqs))
}

// RunSource replays src's requests as Run does, reading each when it is due and holding only
// the requests in flight (closed loop: also one entry per session, and the later turns read
// before their session let them come), so a workload of any length replays in bounded memory.
// The Result keeps no per-request slices (TTFT, E2E, Arrival, QueueWait and RouteLatency are
// nil); TTFTHist, E2EHist and ITLHist summarise them. A request earlier than the one before it,
// or the source's error, ends the run with an error.
func RunSource(cfg Config, src trace.Source) (*Result, error) {
	return run(cfg, src, -1)
}

// run is Run (n ≥ 0: src yields n requests, whose per-request results are kept) and RunSource
// (n < 0).
func run(cfg Config, src trace.Source, n int) (*Result, error) {
	keep := n >= 0
	if cfg.Workers < 1 {
		return nil, fmt.Errorf("fleet: %d workers", cfg.Workers)
	}
	if cfg.PrefillWorkers < 0 || cfg.PrefillWorkers > 0 && cfg.PrefillWorkers >= cfg.Workers {
		return nil, fmt.Errorf("fleet: %d prefill workers of %d: a disaggregated fleet needs decode workers too", cfg.PrefillWorkers, cfg.Workers)
	}
	if cfg.Router != nil && (cfg.Disagg != nil || cfg.PredictedTTL != 0 || cfg.TierCredit != nil) {
		return nil, fmt.Errorf("fleet: Disagg, PredictedTTL and TierCredit configure Run's own router; a caller's router has its own")
	}
	if cfg.Peer != "" && (cfg.Router != nil || cfg.Queue != nil || cfg.PrefillWorkers > 0 || cfg.PredictedTTL != 0 || cfg.TierCredit != nil) {
		return nil, fmt.Errorf("fleet: peer %s: Router, Queue, PrefillWorkers, PredictedTTL and TierCredit are kvrouterd's", cfg.Peer)
	}
	if cfg.Peer != "" && cfg.Workers > 64 {
		return nil, fmt.Errorf("fleet: peer %s: %d workers; the simulated peers keep worker sets of 64", cfg.Peer, cfg.Workers)
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
	var own *router.Router
	var peer *peerRouter
	if cfg.Peer != "" {
		var err error
		if peer, err = newPeerRouter(cfg, wc.BlockSize, &now); err != nil {
			return nil, err
		}
		rt = peer
	}
	if rt == nil {
		var qc *router.QueueConfig
		if cfg.Queue != nil {
			q := *cfg.Queue
			q.Recheck = noRecheck
			qc = &q
		}
		own = router.New(router.Config{
			BlockSize:      wc.BlockSize,
			Mode:           cfg.Mode,
			OverlapWeight:  cfg.OverlapWeight, // 0: the router's default, 1.0
			Temperature:    cfg.Temperature,
			NoTrackPrefill: cfg.NoPrefill,
			Cost:           cfg.Cost,
			Terms:          cfg.Terms,
			NoAssumeReuse:  cfg.NoAssumeReuse,
			CacheWeight:    cfg.CacheWeight,
			RequestExpiry:  24 * time.Hour,
			Shards:         1,
			Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
			Rand:           rand.New(rand.NewPCG(cfg.Seed, 0x666c656574)),
			Now:            clock.Load,
			Queue:          qc,
			Disagg:         cfg.Disagg,
			PredictedTTL:   cfg.PredictedTTL,
			TierCredit:     cfg.TierCredit,
		})
		defer own.Close()
		rt = &local{r: own}
	}
	var qr Queuer
	maxWait := int64(0)
	if cfg.Queue != nil {
		var ok bool
		if qr, ok = rt.(Queuer); !ok {
			return nil, fmt.Errorf("fleet: Config.Queue needs a router with a queue (a Queuer); %T is not one", rt)
		}
		maxWait = int64(cfg.Queue.MaxWait)
		if maxWait <= 0 {
			maxWait = int64(30 * time.Second)
		}
	}
	ws := make([]*worker, cfg.Workers)
	for i := range ws {
		id := uint64(i + 1)
		wci := wc
		if i < len(cfg.Speeds) && cfg.Speeds[i] > 0 && cfg.Speeds[i] != 1 {
			if wci.Timing == (sim.Timing{}) {
				wci.Timing = sim.DefaultTiming()
			}
			wci.Timing = wci.Timing.Slowed(1 / cfg.Speeds[i])
		}
		ws[i] = &worker{id: id, w: sim.NewWorker(id, wci)}
		g := router.Registration{ID: id, Model: model, BlockSize: wc.BlockSize,
			Capacity: int64(ws[i].w.Config().Blocks), MaxTokens: int64(ws[i].w.Config().MaxBatchedTokens)}
		if cfg.PrefillWorkers > 0 {
			g.Role = router.RoleDecode
			if i < cfg.PrefillWorkers {
				g.Role = router.RolePrefill
			}
		}
		if err := rt.Register(g); err != nil {
			return nil, fmt.Errorf("fleet: register worker %d: %w", id, err)
		}
	}
	if peer != nil {
		peer.ws = ws
	}
	res := &Result{PerWorker: make([]int, cfg.Workers)}
	if keep {
		res.TTFT, res.E2E, res.Arrival = make([]time.Duration, n), make([]time.Duration, n), make([]time.Duration, n)
	}
	// A router of the caller's gets the simulation's settings with every request.
	req0 := wire.RouteRequest{Model: model, Disagg: cfg.PrefillWorkers > 0}
	if cfg.Router != nil {
		if keep {
			res.RouteLatency = make([]time.Duration, n)
		}
		req0.Mode = wire.Mode(cfg.Mode)
		if cfg.Mode == scoring.Default {
			req0.Mode = wire.ModeKV
		}
		if cfg.Cost != scoring.CostTTFT {
			// A weight asks the daemon for Dynamo's formula (router.Router's params): sent
			// only when the simulation routes by one.
			req0.HasWeight, req0.Weight = true, cfg.OverlapWeight
			if req0.Weight == 0 {
				req0.Weight = 1
			}
		}
		req0.HasTemperature, req0.Temperature = true, cfg.Temperature
	}
	// The requests in flight, by their index in the workload: arrived and not over.
	fls := map[int]*flight{}
	// Closed loop: each later turn's request, released when its session's previous turn ends.
	var loop *sessions
	if cfg.ClosedLoop {
		loop = newSessions()
	}
	// ended is called once per request when it is over: it forgets the request and releases its
	// session's next turn.
	ended := func(i int) {
		fl := fls[i]
		delete(fls, i)
		if loop != nil && fl.req.Session != 0 {
			loop.ended(fl.req.Session, now)
		}
	}
	xfer := cfg.Transfer.withDefaults()
	var timers timers
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
	// The router queue: the waiting requests' deadlines, and the requests a router call admitted
	// or refused, to be placed once that call has returned.
	var (
		deadlines deadlineHeap
		admitted  []admission
		depth     int
	)
	if qr != nil && keep {
		res.QueueWait = make([]time.Duration, n)
	}
	routeFailed := func(i int, err error) {
		if res.RouteFailures == 0 {
			res.RouteErr = err.Error()
		}
		res.RouteFailures++
		ended(i)
	}
	// place starts request i, routed as resp says, on its simulated worker: the prefill worker
	// first when the router chose a prefill stage.
	place := func(i int, resp *wire.RouteResponse) {
		worker := resp.Worker
		if resp.Prefill {
			worker = resp.PrefillWorker
		}
		if worker < 1 || worker > uint64(len(ws)) || resp.Prefill && (resp.Worker < 1 || resp.Worker > uint64(len(ws))) {
			routeFailed(i, fmt.Errorf("fleet: routed to workers %d and %d, not simulated ones", resp.PrefillWorker, resp.Worker))
			return
		}
		fl := fls[i]
		fl.pred = resp.PredictedTTFT
		q := &fl.req
		w := ws[worker-1]
		res.PerWorker[worker-1]++
		res.PromptTokens += int64(len(q.Tokens))
		res.OutputTokens += int64(max(q.Output, 1))
		sr := sim.Request{ID: uint64(i), Tokens: q.Tokens, Output: max(q.Output, 1)}
		if resp.Prefill {
			// The prefill stage: one token, the blocks held until the decode worker has them.
			fl.stage = stage{decode: resp.Worker, prefill: true}
			sr.Output, sr.Hold = 1, true
			res.Split++
		}
		if err := w.w.Submit(&sr, now); err != nil {
			// Larger than the worker's whole cache: no engine could serve it.
			res.Refused++
			if rt.Complete(fl.id) != nil {
				res.CallErrors++
			}
			ended(i)
			return
		}
		start(w, now)
	}
	// placeAdmitted places the requests the queue let go, in the order it did (placing one may
	// complete it at once, which admits more).
	placeAdmitted := func() {
		for k := 0; k < len(admitted); k++ {
			a := admitted[k]
			fl := fls[a.i]
			fl.ticket = nil
			depth--
			if a.err != nil {
				routeFailed(a.i, a.err)
				continue
			}
			if keep {
				res.QueueWait[a.i] = time.Duration(now - fl.arrival)
			}
			place(a.i, a.resp)
		}
		admitted = admitted[:0]
	}
	// events hands the router a batch of worker's KV events.
	events := func(worker uint64, evs []kvevent.Event) error {
		if cfg.OnEvents != nil {
			cfg.OnEvents(time.Duration(now), worker, evs)
		}
		batch = wire.EventBatch{Worker: worker, Model: model, Events: evs}
		if err := rt.Events(&batch); err != nil {
			return fmt.Errorf("worker %d events: %w", worker, err)
		}
		return nil
	}
	// deliver hands the router what worker w's finished step produced.
	deliver := func(w *worker) error {
		if len(w.out.Events) > 0 {
			if cfg.EventDelay > 0 {
				timers.push(timer{at: now + int64(cfg.EventDelay), worker: w.id, events: cloneEvents(w.out.Events)})
			} else if err := events(w.id, w.out.Events); err != nil {
				return err
			}
		}
		for _, d := range w.out.PrefillDone {
			fl := fls[int(d.ID)]
			st := &fl.stage
			if st.prefill {
				// The prefill stage's one token: the prompt's cache hit is the prefill
				// worker's; the client's first token comes from the decode worker.
				res.CachedTokens += int64(d.Cached)
				res.HostTokens += int64(d.Host)
				continue
			}
			fl.ttft = d.At - fl.arrival
			if fl.pred > 0 && keep {
				res.PredErr = append(res.PredErr, fl.pred*1e6/float64(fl.ttft)-1)
			}
			res.TTFTHist.Add(time.Duration(fl.ttft))
			if keep {
				res.TTFT[d.ID] = time.Duration(fl.ttft)
			}
			if st.decode != 0 {
				continue // a decode stage: its prefill was the prefill worker's
			}
			res.CachedTokens += int64(d.Cached)
			res.HostTokens += int64(d.Host)
			if rt.PrefillDone(fl.id) != nil {
				res.CallErrors++
			}
		}
		for _, d := range w.out.Completed {
			fl := fls[int(d.ID)]
			st := &fl.stage
			if st.prefill {
				// The prefill stage is over; its KV moves to the decode worker.
				st.prefill = false
				if rt.PrefillDone(fl.id) != nil {
					res.CallErrors++
				}
				tt := xfer.Time(len(fl.req.Tokens))
				res.TransferTime += tt
				timers.push(timer{at: now + int64(tt), worker: w.id, handoff: true, i: int(d.ID)})
				continue
			}
			e2e := d.At - fl.arrival
			res.E2EHist.Add(time.Duration(e2e))
			if k := max(fl.req.Output, 1) - 1; k > 0 && e2e > 0 && fl.ttft > 0 {
				res.ITLHist.Add(time.Duration((e2e - fl.ttft) / int64(k)))
			}
			if keep {
				res.E2E[d.ID] = time.Duration(e2e)
			}
			if rt.Complete(fl.id) != nil {
				res.CallErrors++
			}
			res.Makespan = max(res.Makespan, time.Duration(d.At))
			ended(int(d.ID))
		}
		return nil
	}
	// handoff ends request i's transfer from prefill worker pw: pw lets its blocks go and
	// the decode worker takes the request with its prompt computed.
	handoff := func(pw uint64, i int) {
		p := ws[pw-1]
		p.w.Release(uint64(i))
		start(p, now)
		fl := fls[i]
		q := &fl.req
		d := ws[fl.stage.decode-1]
		res.PerWorker[d.id-1]++
		if err := d.w.Submit(&sim.Request{ID: uint64(i), Tokens: q.Tokens, Output: max(q.Output, 1), Remote: true}, now); err != nil {
			res.Refused++
			if rt.Complete(fl.id) != nil {
				res.CallErrors++
			}
			ended(i)
			return
		}
		start(d, now)
	}
	var (
		req     wire.RouteRequest
		resp    wire.RouteResponse
		sampleT int64
		pace    = pacer{pace: cfg.Pace}
		// head is the next request read from src that arrives on its own (a first turn, or
		// one without a session), headI its index; read counts the requests read.
		head    trace.Request
		headI   int
		hasHead bool
		srcDone bool
		read    int
		first   time.Duration // the workload's first arrival
	)
	// fill reads src up to the next request that arrives on its own, handing the later turns
	// on the way to the closed loop.
	fill := func() error {
		for !hasHead && !srcDone {
			r, ok := src.Next()
			if !ok {
				srcDone = true
				if err := src.Err(); err != nil {
					return fmt.Errorf("fleet: after request %d: %w", read, err)
				}
				break
			}
			i := read
			if read++; i == 0 {
				first = r.At
				pace.origin, pace.start = int64(r.At), time.Now()
			} else if r.At < head.At {
				return fmt.Errorf("fleet: request %d arrives at %v, before request %d (%v): requests not sorted by arrival", i, r.At, headI, head.At)
			}
			if keep && i >= n {
				return fmt.Errorf("fleet: the source yields more than %d requests", n)
			}
			head, headI = r, i
			if loop != nil && r.Session != 0 && loop.add(i, r) {
				continue // a later turn: it arrives when released
			}
			hasHead = true
		}
		return nil
	}
	const never = math.MaxInt64
	// nextArrival is the next request to arrive and when: the next of the trace's order that
	// arrives on its own, or a released later turn, whichever is first (the trace's on a tie).
	nextArrival := func() (int, int64, bool) {
		i, at, fromHead := -1, int64(never), false
		if hasHead {
			i, at, fromHead = headI, int64(head.At), true
		}
		if loop != nil {
			if j, t, ok := loop.peek(); ok && t < at {
				i, at, fromHead = j, t, false
			}
		}
		return i, at, fromHead
	}
	for {
		if err := fill(); err != nil {
			return nil, err
		}
		ni, tArr, fromHead := nextArrival()
		if ni < 0 && h.Len() == 0 && deadlines.Len() == 0 && timers.Len() == 0 {
			break
		}
		// At equal times a step's end comes first (the router sees what the workers did by
		// then), then a delayed event batch or a transfer's end, then a deadline, then an
		// arrival.
		tStep, tTimer, tDead := int64(never), int64(never), int64(never)
		if h.Len() > 0 {
			tStep = h.peek().end
		}
		if timers.Len() > 0 {
			tTimer = timers.next()
		}
		if deadlines.Len() > 0 {
			tDead = deadlines[0].at
		}
		switch {
		case tStep <= tTimer && tStep <= tDead && tStep <= tArr:
			pace.wait(tStep)
			w := heap.Pop(&h).(*worker)
			now = w.end
			clock.Store(now)
			w.busy = false
			if err := deliver(w); err != nil {
				return nil, err
			}
			placeAdmitted()
			start(w, now)
			continue
		case tTimer <= tDead && tTimer <= tArr:
			pace.wait(tTimer)
			t := timers.pop()
			now = t.at
			clock.Store(now)
			if t.handoff {
				handoff(t.worker, t.i)
			} else if err := events(t.worker, t.events); err != nil {
				return nil, err
			}
			placeAdmitted()
			continue
		case tDead <= tArr:
			d := heap.Pop(&deadlines).(deadline)
			fl := fls[d.i]
			if fl == nil || fl.ticket == nil {
				continue // admitted before its deadline
			}
			pace.wait(d.at)
			now = d.at
			clock.Store(now)
			if qr.Cancel(fl.ticket) {
				fl.ticket = nil
				depth--
				res.QueueTimedOut++
				ended(d.i)
			} else {
				placeAdmitted() // decided already: its done function ran or is about to
			}
			continue
		}
		var q trace.Request
		if fromHead {
			q, hasHead = head, false
		} else {
			q = loop.pop()
		}
		pace.wait(tArr)
		now = tArr
		clock.Store(now)
		for cfg.Sample > 0 && sampleT <= now {
			s := LoadSample{At: time.Duration(sampleT), Running: make([]int, len(ws)), Waiting: make([]int, len(ws))}
			for i, w := range ws {
				s.Running[i], s.Waiting[i] = w.w.Running(), w.w.Waiting()
			}
			res.Samples = append(res.Samples, s)
			sampleT += int64(cfg.Sample)
		}
		i := ni
		fl := &flight{req: q, id: strconv.Itoa(i), arrival: now}
		fls[i] = fl
		res.MaxInFlight = max(res.MaxInFlight, len(fls)+loop.pending())
		if keep {
			res.Arrival[i] = time.Duration(now)
		}
		rq, rs := &req, &resp
		if qr != nil {
			// A request that waits keeps its own: the router holds them until admission.
			rq, rs = new(wire.RouteRequest), new(wire.RouteResponse)
		}
		*rq = req0
		rq.RequestID, rq.Tokens = fl.id, q.Tokens
		if cfg.Priority != nil {
			rq.PriorityJump = cfg.Priority(i)
		}
		t0 := time.Now()
		var err error
		if qr == nil {
			err = rt.Route(rq, rs)
		} else {
			var t *router.Ticket
			t, err = qr.Enqueue(rq, rs, func(t *router.Ticket) { admitted = append(admitted, admission{i, rs, t.Err}) })
			if t != nil {
				fl.ticket = t
				depth++
				res.Queued++
				res.MaxQueued = max(res.MaxQueued, depth)
				heap.Push(&deadlines, deadline{at: now + maxWait, i: i})
				if res.RouteLatency != nil {
					res.RouteLatency[i] = time.Since(t0)
				}
				continue
			}
		}
		if res.RouteLatency != nil {
			res.RouteLatency[i] = time.Since(t0)
		}
		if err != nil {
			routeFailed(i, err)
			continue
		}
		place(i, rs)
		placeAdmitted() // a refused placement completes at once, which may admit others
	}
	res.Requests = read
	if read > 0 {
		res.Makespan -= first
	}
	if loop != nil {
		res.LaterTurns = loop.later
	}
	if own != nil {
		res.Booked = own.Stats().ActiveRequests
	}
	res.MaxLag = pace.maxLag
	res.Blocks = make([]int, len(ws))
	for i, w := range ws {
		res.Blocks[i] = w.w.CachedBlocks()
		st := w.w.Stats()
		res.PrefillBusy += time.Duration(st.PrefillNs)
		res.DecodeBusy += time.Duration(st.DecodeNs)
	}
	return res, nil
}

// flight is a request in flight: arrived and not over.
type flight struct {
	req     trace.Request
	id      string // its request id at the router
	arrival int64
	ttft    int64   // time to its first token; 0 until then
	pred    float64 // its route answer's predicted TTFT, ms (0: none)
	stage   stage
	ticket  *router.Ticket // waiting in the router queue
}

// stage is where a request of a disaggregated fleet is: prefill while its prefill stage runs,
// decode the worker of its decode stage (0: the request is served whole).
type stage struct {
	decode  uint64
	prefill bool
}

// timer is a delayed event batch of worker, or (handoff) the end of request i's KV transfer
// from prefill worker worker; seq orders timers of equal times by their making.
type timer struct {
	at      int64
	seq     uint64
	worker  uint64
	handoff bool
	i       int
	events  []kvevent.Event
}

// timerHeap orders timers by time, then by their making.
type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any     { old := *h; t := old[len(old)-1]; *h = old[:len(old)-1]; return t }

// timers are a run's pending timers.
type timers struct {
	h   timerHeap
	seq uint64
}

func (t *timers) Len() int     { return len(t.h) }
func (t *timers) next() int64  { return t.h[0].at }
func (t *timers) pop() timer   { return heap.Pop(&t.h).(timer) }
func (t *timers) push(x timer) { t.seq++; x.seq = t.seq; heap.Push(&t.h, x) }

// cloneEvents copies evs and the slices they hold, which the worker reuses at its next step.
func cloneEvents(evs []kvevent.Event) []kvevent.Event {
	c := slices.Clone(evs)
	for i := range c {
		c[i].Hashes = slices.Clone(c[i].Hashes)
		c[i].Tokens = slices.Clone(c[i].Tokens)
		c[i].Locals = slices.Clone(c[i].Locals)
	}
	return c
}

// noRecheck is the period of the router queue's wall-clock recheck in a simulation: longer than
// any run.
const noRecheck = 1000 * time.Hour

// admission is a request the router queue let go (err nil: routed to resp.Worker) or refused.
type admission struct {
	i    int
	resp *wire.RouteResponse
	err  error
}

// deadline is when a waiting request's longest wait passes.
type deadline struct {
	at int64
	i  int
}

// deadlineHeap orders deadlines by time, then by arrival.
type deadlineHeap []deadline

func (h deadlineHeap) Len() int { return len(h) }
func (h deadlineHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].i < h[j].i
}
func (h deadlineHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)   { *h = append(*h, x.(deadline)) }
func (h *deadlineHeap) Pop() any     { old := *h; d := old[len(old)-1]; *h = old[:len(old)-1]; return d }
