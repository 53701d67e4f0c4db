package router

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/internal/freelist"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/puzpuzpuz/xsync/v4"
)

// Config configures a Router. Zero values take the defaults listed.
type Config struct {
	// BlockSize is the tokens per block of models registered without one (16).
	BlockSize int
	// Mode is the routing mode of requests that do not name one (kv).
	Mode scoring.Mode
	// OverlapWeight weighs prefill cost against decode load (1.0). Set NoOverlapWeight to use 0.
	OverlapWeight   float64
	NoOverlapWeight bool
	// Temperature of the softmax selection; 0 picks the cheapest worker.
	Temperature float64
	// NoTrackPrefill neither charges nor books a request's own uncached tokens as prefill,
	// Dynamo's track_prefill_tokens=false (a decode stage's routing, on load alone); by
	// default they are (see scoring.Params.TrackPrefill).
	NoTrackPrefill bool
	// Cost is the cost formula (scoring.CostV1, the default, or scoring.CostMain); Terms, if
	// set, are CostMain's weights (scoring.DefaultTerms otherwise). A request's
	// overlap_score_credit and prefill_load_scale override them; its overlap_score_weight does,
	// under CostMain, as Dynamo main reads it: the prefill load scale, and 0 also zeroes the
	// credit.
	Cost  scoring.CostModel
	Terms *scoring.Terms
	// Step is scoring.CostTTFT's prior of the workers' step times (nil:
	// scoring.DefaultStepModel); a model's workers that register their KV capacity and max
	// batched tokens set those of its model. CacheWeight is CostTTFT's cache weight
	// (scoring.Params.CacheWeight; 0: scoring.DefaultCacheWeight, negative: none).
	Step        *scoring.StepModel
	CacheWeight float64
	// DecayPrefill decays every worker's booked prefill tokens by the time its oldest prefill
	// has run (scoring.StepModel.Decayed) under the other formulas too: Dynamo's
	// --router-prefill-load-model, with the step model's rate for AIC's prediction.
	DecayPrefill bool
	// TierCredit weighs the blocks the lower storage tiers (host, disk, external) add to a
	// worker's device prefix, in both formulas (nil: Dynamo's defaults, 0.75 for host and 0.25
	// for disk and external; {0, 0} indexes the tiers without crediting them).
	TierCredit *scoring.TierCredit
	// NoAssumeReuse books each request's blocks under random hashes, so that concurrent requests
	// share no active blocks (Dynamo's router_assume_kv_reuse=false, for engines without prefix
	// caching); a request's assume_kv_reuse overrides it.
	NoAssumeReuse bool
	// TrackingKey, if set, books active blocks under keyed tracking identities
	// (radix.TrackingKey: Dynamo's --router-tracking-hash keyed-xxh3-v1) instead of the public
	// sequence hashes: the tracker's bookings, the blocks shared with requests ahead, the
	// blocks a Selection books and what replicas share. The index is still matched by the
	// public hashes. Requests given by hash keep the hashes given.
	TrackingKey *radix.TrackingKey
	// TrackOutputBlocks books an output block each time a request's prompt and output cross a
	// block boundary, as OutputTokens reports them (Dynamo's router_track_output_blocks), decayed
	// toward the request's expected output length when it gives one.
	TrackOutputBlocks bool
	// MaxCandidates caps the candidates of an answer when the request does not say (0: all).
	MaxCandidates int
	// Busy is every new model's busy thresholds (overload.go); SetBusyThresholds changes a
	// model's at run time. The zero value sets none: no worker is ever overloaded.
	Busy Thresholds
	// Approximate, if set, turns on approximate mode (for workers that publish no KV events):
	// each routed request's blocks count as cached on the chosen worker, with a TTL, a cap and
	// pruning (see package approx).
	Approximate *approx.Config
	// Endpoints, if set, learns of the KV-event endpoints workers register with, and of
	// their leaving: the daemon subscribes to them.
	Endpoints EndpointWatcher
	// Sources, if set, says the state of the ranks whose events the daemon reads from their own
	// sockets, for listings; without it every rank's events come through Ingest or ApplyEvents.
	Sources SourceStates
	// WorkerTimeout unregisters a worker that sends load reports once it has been silent this
	// long (see DropSilent); 0 never does.
	WorkerTimeout time.Duration
	// RequestExpiry frees routed requests never completed (300 s).
	RequestExpiry time.Duration
	// Share, if set, learns of every request this Router books, finishes prefilling and
	// completes, to tell the other replicas, which apply them with BookRemote and its kin (see
	// LoadSharer); nil shares nothing.
	Share LoadSharer
	// Shards, QueueLen and MaxBlocks configure event application (see shard.Config).
	Shards    int
	QueueLen  int
	MaxBlocks int64
	// MaxIndexBytes, if > 0, bounds the index's memory: the residency budget becomes at most
	// MaxIndexBytes / ResidencyBytes (or MaxBlocks, if lower), and at the budget each store
	// makes room by evicting, per shard from the (worker, rank) holding the most blocks, its
	// least recently matched ones (shard.Config.Evict) instead of being skipped.
	MaxIndexBytes int64
	// ClearOnGap drops a (worker, rank)'s blocks when its events skip ids, before applying the
	// event after the gap: the events missed may have removed blocks (see shard.Applier).
	ClearOnGap bool
	// KeepTree keeps each block's local hash and parent (shard.Applier.KeepTree), so that
	// DumpTree can list the index in Dynamo's form; it costs two map entries per block.
	KeepTree bool
	// Observer receives anomalous event outcomes (may be nil).
	Observer shard.Observer
	// Logger receives decision lines at debug level and warnings (slog.Default()).
	Logger *slog.Logger
	// Rand, if set, is the source of tie-breaks and softmax samples, for reproducible
	// simulations; such a Router must not route from several goroutines at once. nil uses the
	// runtime's source, safe for concurrent use.
	Rand *rand.Rand
	// Now is the clock for request expiry, in nanoseconds (a monotonic clock by default).
	Now func() int64
	// Queue, if set, turns on the router queue: requests wait while every worker rank they may
	// go to is busy prefilling (see queue.go); nil admits every request at once.
	Queue *QueueConfig
	// Affinity, if set, keeps each session (a request's SessionID) on the worker it was first
	// routed to (see affinity.go); nil ignores session ids.
	Affinity *AffinityConfig
	// Disagg configures disaggregated prefill/decode routing (role.go): conditional
	// disaggregation and --enforce-disagg. nil splits a request that asks for it whenever its
	// model has a prefill worker, and serves it whole otherwise.
	Disagg *DisaggConfig
	// PredictedTTL, if positive, turns on predict-on-route (predict.go, Dynamo's
	// router_predicted_ttl_secs): each routed request's blocks count as held by its worker for
	// this long on the Now clock, in a side index that matches take the larger depth from; the
	// event-fed index never holds them. Approximate mode, which has no event-fed index, does not
	// combine with it (New panics, as Dynamo refuses the pair).
	PredictedTTL time.Duration
	// HitSample: one routed or matched request in HitSample (a power of two, 64) notes which
	// workers hold some of its blocks, for the zero-hit check (misconfig.go); 1 notes every
	// one. ZeroHits (500) is how many sampled requests that found blocks on other workers of
	// its model a worker holding at least ZeroHitBlocks (64) blocks may go without one of its
	// own before it is listed as misconfigured.
	HitSample     int
	ZeroHits      int64
	ZeroHitBlocks int64
	// APIKeys, if set, is asked for the API key of each worker HTTPWorkers returns, by its id
	// and its http_endpoint: a key it has wins over the worker's registered one
	// (Registration.APIKey). The daemon's is --worker-api-keys-file. Called under the
	// registry's lock, from any goroutine: it must be safe for concurrent use and not call the
	// Router.
	APIKeys func(id uint64, endpoint string) (key string, ok bool)
	// Eject configures outlier ejection: ranks that fail the front door's requests leave
	// routing for a while (eject.go).
	Eject EjectConfig
	// PhaseSample: one routed request in PhaseSample (a power of two, 16), drawn at random, is
	// timed phase by phase for the PhaseObserver (SetPhaseObserver); 1 times every one. Reading
	// the clock at each phase boundary costs more than 2% of a route (BenchmarkRoute), hence the
	// sample.
	PhaseSample int
}

func (c *Config) defaults() {
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	if c.Mode == scoring.Default {
		c.Mode = scoring.KV
	}
	if c.OverlapWeight == 0 && !c.NoOverlapWeight {
		c.OverlapWeight = 1
	}
	if c.Terms == nil {
		t := scoring.DefaultTerms()
		c.Terms = &t
	}
	if c.Step == nil {
		m := scoring.DefaultStepModel()
		c.Step = &m
	}
	switch {
	case c.CacheWeight == 0:
		c.CacheWeight = scoring.DefaultCacheWeight
	case c.CacheWeight < 0:
		c.CacheWeight = 0
	}
	if c.TierCredit == nil {
		t := scoring.DefaultTierCredit()
		c.TierCredit = &t
	}
	if c.RequestExpiry <= 0 {
		c.RequestExpiry = 300 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.HitSample <= 0 || c.HitSample&(c.HitSample-1) != 0 {
		c.HitSample = 64
	}
	if c.PhaseSample <= 0 || c.PhaseSample&(c.PhaseSample-1) != 0 {
		c.PhaseSample = 16
	}
	if c.ZeroHits <= 0 {
		c.ZeroHits = 500
	}
	if c.ZeroHitBlocks <= 0 {
		c.ZeroHitBlocks = 64
	}
	if c.Queue != nil {
		q := *c.Queue
		q.defaults()
		c.Queue = &q
	}
	if c.Disagg != nil {
		d := c.Disagg.withDefaults()
		c.Disagg = &d
	} else {
		c.Disagg = &DisaggConfig{}
	}
	c.Eject.defaults()
	if c.Now == nil {
		start := time.Now()
		c.Now = func() int64 { return int64(time.Since(start)) }
	}
}

// Errors. The HTTP server maps them to status codes; each names what was wrong.
var (
	ErrUnknownModel   = errors.New("router: unknown model")
	ErrUnknownWorker  = errors.New("router: unknown worker")
	ErrConflict       = errors.New("router: conflicts with the registered state")
	ErrInvalid        = errors.New("router: invalid request")
	ErrClosed         = errors.New("router: closed")
	ErrUnknownRequest = scoring.ErrUnknownRequest
	// ErrTooLong: a field over a limit of the persistent formats (a string over
	// wire.MaxString bytes, more than wire.MaxSnapshotRanks ranks for one worker).
	ErrTooLong = errors.New("router: over a limit of the snapshot format")
	// ErrUnavailable: a change that could not be made now, for a reason outside the request
	// (the event stream it must go through is unreachable, or slow to deliver it); retry.
	ErrUnavailable = errors.New("router: unavailable")
)

// FieldError is an invalid-input error naming the field at fault.
type FieldError struct {
	Field string
	Msg   string
	Err   error // ErrInvalid, ErrTooLong, ErrUnknownModel, ErrUnknownWorker or ErrConflict
}

func (e *FieldError) Error() string { return fmt.Sprintf("field %q: %s", e.Field, e.Msg) }
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(err error, field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...), Err: err}
}

// Router routes requests to workers by their cached prefixes and load. Safe for concurrent use.
type Router struct {
	cfg     Config
	set     *shard.Set
	tracker *scoring.Tracker
	chooser scoring.Chooser
	log     *slog.Logger
	scratch *freelist.List[scratch]

	mu      sync.Mutex
	models  atomic.Pointer[map[string]*model] // copy-on-write; written under mu
	workers map[uint64]*registration          // REQUIRES mu

	queued   atomic.Int64 // requests waiting in every model's queue
	refusing atomic.Bool  // RefuseWaiting: the queue takes no more requests
	// The requests routed and matched, and routed requests' prompt tokens and those cached on
	// the worker chosen (noteRouted): striped, so that routes on different cores write
	// different lines.
	routed, matched, promptTokens, cachedTokens *xsync.Counter

	expired         atomic.Int64
	discovered      atomic.Int64 // workers registered by their first event or report
	timedOut        atomic.Int64 // workers dropped by DropSilent
	snapshotSkipped atomic.Int64 // workers Snapshot left out (see SnapshotStats.Skipped)

	approx *approxMode // nil unless Config.Approximate
	aff    *affinity   // nil unless Config.Affinity

	predictRaised atomic.Int64 // matches whose depths predictions raised (predict.go)

	phaseObs  atomic.Pointer[PhaseObserver] // nil: no request is timed (phases.go)
	phaseMask uint32                        // Config.PhaseSample - 1

	overloadRejected atomic.Int64 // requests refused as every eligible worker was overloaded
	disagg           [disaggOutcomes]atomic.Int64

	general bool // tests: score every request on the general path (see scorekv.go)

	health routerHealth // outlier ejection (eject.go)

	stop  chan struct{}
	done  chan struct{}
	qdone chan struct{} // closed when queueLoop has returned; nil without the queue
}

// model is one model's index and its registered workers.
type model struct {
	name      string
	ix        *radix.Index
	blockSize int
	list      atomic.Pointer[workerList]
	regs      map[uint64]*registration // its workers; REQUIRES Router.mu

	// sampledHits counts the sampled requests that found blocks on some worker;
	// seenSampledHits is its value at the last zero-hit check (the check's own).
	sampledHits     atomic.Int64
	seenSampledHits int64

	// busy is the model's busy thresholds (overload.go), nil while none is set: the route
	// path reads it lock-free.
	busy atomic.Pointer[Thresholds]

	queue *modelQueue // nil without Config.Queue
	pred  *predicted  // nil without Config.PredictedTTL

	// step is scoring.CostTTFT's model of the model's workers: Config.Step with the KV
	// capacity and max batched tokens its latest registration stating them gave. The workers
	// of a model are taken as alike.
	step atomic.Pointer[scoring.StepModel]

	hits modelHits

	health modelHealth // outlier ejection (eject.go)

	track trackSeeds // with Config.TrackingKey, the model's tracking seeds (tracking.go)
}

// workerList is a model's registered (worker, rank) pairs, immutable once published.
type workerList struct {
	ws       []*rankWorker // sorted by id, then rank
	bySlot   []int32       // index slot → position in ws, -1 for none
	byActive []int32       // tracker slot → position in ws

	// ws's fields side by side, so that scoring every worker reads three dense arrays instead
	// of following a pointer per worker.
	keys  []radix.WorkerKey
	slots []radix.Slot
	loads []*scoring.Load

	// serve is the workers that may serve aggregated requests and decode stages (the
	// RoleDecode and RoleBoth ones: the list itself while the model has no RolePrefill
	// worker), and prefill the RolePrefill ones (nil while there are none); each a list of
	// its own, with its own positions, whose serve and prefill are nil. See role.go.
	serve, prefill *workerList
}

type rankWorker struct {
	key  radix.WorkerKey
	slot radix.Slot
	load *scoring.Load
	reg  *registration
	// Where the rank publishes its KV events, if it registered an endpoint. Changed only under
	// Router.mu.
	endpoint, replay string

	report atomic.Pointer[LoadReport] // the last one, if the rank sends them

	health rankHealth // outlier ejection (eject.go)
}

// registration is one worker id: a model and the ranks it serves. Fields other than the atomics
// change only under Router.mu.
type registration struct {
	id    uint64
	model *model
	ranks []*rankWorker          // by rank, at most wire.MaxSnapshotRanks
	http  atomic.Pointer[string] // the OpenAI API's base URL; nil for none
	// apiKey is the key the front door sends the worker's API (Registration.APIKey); nil for
	// none. Never listed, logged or counted.
	apiKey atomic.Pointer[string]

	// Atomic, as the route path reads them without Router.mu for the busy thresholds
	// (overload.go); written under Router.mu.
	capacity  atomic.Int64  // KV capacity in blocks, 0 = unknown
	maxTokens atomic.Int64  // max batched tokens, 0 = unknown
	weight    atomic.Uint64 // math.Float64bits of the device-aware weight, 0 = unset (weight.go)
	role      atomic.Uint32 // a Role; the model's worker lists are published anew when it changes

	received, applied atomic.Int64 // events
	mis               misconfig

	lastSeen  atomic.Int64 // Config.Now of the last event or load report
	lastEvent atomic.Int64 // wall clock of the last event batch taken, in Unix nanoseconds (0: none)
	heartbeat atomic.Bool  // it sends load reports: subject to Config.WorkerTimeout
}

// ResidencyBytes is the memory Config.MaxIndexBytes counts per residency: the most one costs,
// every structure counted (its share of the index's table and holder sets, its engine-map
// entry, their growth slack), by the memory benchmarks of docs/performance.md: 45 to 57 bytes
// at 10^6 to 10^7 residencies, with or without lower tiers.
const ResidencyBytes = 64

// MaxIndexBytes is the index's memory bound (Config.MaxIndexBytes), 0 for none.
func (r *Router) MaxIndexBytes() int64 { return r.cfg.MaxIndexBytes }

// residencyBudget is the residency bound of MaxBlocks and MaxIndexBytes together.
func (c *Config) residencyBudget() int64 {
	b := c.MaxBlocks
	if c.MaxIndexBytes > 0 {
		if n := max(1, c.MaxIndexBytes/ResidencyBytes); b == 0 || n < b {
			b = n
		}
	}
	return b
}

// New starts a Router: its shard goroutines and the request expiry loop. Close stops them.
// It panics on a Config.Approximate that approx.New refuses, on one given with
// Config.PredictedTTL, and on a Config.Disagg that DisaggConfig.Check refuses.
func New(cfg Config) *Router {
	cfg.defaults()
	if err := cfg.Disagg.Check(); err != nil {
		panic("router: Config.Disagg: " + err.Error())
	}
	r := &Router{
		cfg:          cfg,
		set:          shard.New(shard.Config{Shards: cfg.Shards, QueueLen: cfg.QueueLen, MaxBlocks: cfg.residencyBudget(), Evict: cfg.MaxIndexBytes > 0, Observer: cfg.Observer, ClearOnGap: cfg.ClearOnGap, KeepTree: cfg.KeepTree}),
		tracker:      newTracker(cfg.Now, cfg.RequestExpiry),
		routed:       xsync.NewCounter(),
		matched:      xsync.NewCounter(),
		promptTokens: xsync.NewCounter(),
		cachedTokens: xsync.NewCounter(),
		scratch:      freelist.New[scratch](),
		log:          cfg.Logger,
		workers:      make(map[uint64]*registration),
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
	}
	r.phaseMask = uint32(cfg.PhaseSample - 1)
	r.models.Store(&map[string]*model{})
	if cfg.Approximate != nil {
		c, err := approx.New(*cfg.Approximate)
		if err != nil {
			panic("router: Config.Approximate: " + err.Error())
		}
		r.approx = &approxMode{c: c}
		if cfg.Approximate.LRU {
			r.approx.lru = approx.NewLRU()
		}
	}
	if cfg.Affinity != nil {
		r.aff = newAffinity(*cfg.Affinity)
	}
	if cfg.PredictedTTL > 0 && cfg.Approximate != nil {
		panic("router: Config.PredictedTTL needs the KV events that approximate mode goes without")
	}
	go r.expireLoop()
	if cfg.Queue != nil {
		r.qdone = make(chan struct{})
		go func() {
			defer close(r.qdone)
			r.queueLoop()
		}()
	}
	return r
}

// Close stops expiry and drains the shards: every event accepted before is applied.
func (r *Router) Close() {
	select {
	case <-r.stop:
		return
	default:
	}
	close(r.stop)
	<-r.done
	if r.qdone != nil {
		<-r.qdone
	}
	r.set.Close()
}

func (r *Router) expireLoop() {
	defer close(r.done)
	every := min(r.cfg.RequestExpiry/4, time.Second)
	if r.cfg.WorkerTimeout > 0 {
		every = min(every, r.cfg.WorkerTimeout/4)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.ExpireRequests()
			r.checkHits()
			if r.aff != nil {
				r.expireAffinity()
			}
			if r.approx != nil {
				r.expireApprox()
			}
			r.expirePredicted()
			if r.cfg.WorkerTimeout > 0 {
				r.DropSilent(r.cfg.WorkerTimeout)
			}
		}
	}
}

// ExpireRequests frees every request routed more than RequestExpiry ago and not completed, and
// returns how many. The Router calls it periodically; tests and simulations may call it.
func (r *Router) ExpireRequests() int {
	n := r.tracker.Expire(r.cfg.Now())
	if n > 0 {
		r.drain()
		r.expired.Add(int64(n))
		r.log.Warn("expired requests never completed", "count", n, "expiry", r.cfg.RequestExpiry)
	}
	return n
}

func (r *Router) model(name string) *model { return (*r.models.Load())[name] }

// EndpointWatcher learns of workers' KV-event endpoints, each data-parallel rank's its own.
// Check is called before a registration that names one, Registered after it, with the endpoints of the ranks it
// registered (the worker is registered whatever it returns); Unregistered after the worker left.
// Calls may come from many goroutines.
type EndpointWatcher interface {
	// Check says whether Registered would take these endpoints; a registration whose
	// endpoints it refuses is refused whole, and leaves nothing registered.
	Check(worker uint64, model string, ranks []RankEndpoint) error
	Registered(worker uint64, model string, ranks []RankEndpoint) error
	Unregistered(id uint64)
	// UnregisteredRank is called after one rank of a worker that keeps others left.
	UnregisteredRank(id uint64, rank uint32)
}

// Registration describes a worker joining: POST /v1/workers, /register.
type Registration struct {
	ID        uint64
	Model     string
	BlockSize int      // 0: the model's, or the default for a new model
	Ranks     []uint32 // data-parallel ranks to add; empty means rank 0
	Capacity  int64    // KV capacity in blocks, 0 = unknown
	MaxTokens int64    // max batched tokens, 0 = unknown
	// Endpoint and Replay are the first rank's KV-event and replay sockets, if any; a later
	// rank r ranks after it publishes on their port + r. A registration naming an endpoint sets
	// its ranks' endpoints, and leaves the worker's other ranks' as they were.
	Endpoint string
	Replay   string
	// HTTPEndpoint is the worker's OpenAI-compatible HTTP API (http://host:port), where the
	// front door forwards the requests routed to it; "" leaves the worker's as it was.
	HTTPEndpoint string
	// APIKey is the worker's own API key, which the front door sends its HTTP API as
	// Authorization: Bearer APIKEY (an engine started with --api-key requires it); "" leaves
	// the worker's as it was. Printable ASCII, at most wire.MaxString bytes. It is never listed
	// or logged (WorkerInfo.APIKeySet says whether there is one); it goes, as the rest of the
	// registration, through the event stream and into snapshots, so that every replica, and a
	// restarted one, forwards with it (docs/security.md).
	APIKey string
	// Weight is the worker's capacity relative to the others' for mode
	// device_aware_weighted (weight.go): a finite number > 0; 0 leaves the worker's as it was
	// (1 for a new worker).
	Weight float64
	// Role is the worker's part in serving its model (role.go). A registration sets it, on a
	// registered worker too (a worker may change roles), unless KeepRole: then it applies to
	// a new worker only, and a registered one keeps its own (a rank discovered by its events,
	// an API client that names no role).
	Role     Role
	KeepRole bool
}

// Changer makes the changes the HTTP API is asked for: registrations, their removal, and event
// batches from clients. A Router makes them at once; ingest.Journal sends them through the event
// stream, so that every replica makes them in the stream's order. Implementations are safe for
// concurrent use.
type Changer interface {
	Register(Registration) error
	Unregister(id uint64) error
	UnregisterRank(id uint64, rank uint32) error
	ApplyEvents(b *wire.EventBatch, dst []shard.Outcome) ([]shard.Outcome, error)
}

var _ Changer = (*Router)(nil)

// Register adds a worker, or ranks to a registered one. A model is created by its first worker;
// a later worker stating another block size is refused, as is a worker id moving to another
// model. Every field is held to the limits of the snapshot format (wire.SnapshotWorker), so that
// whatever Register accepts can be persisted: a string over wire.MaxString bytes, or a worker
// with more than wire.MaxSnapshotRanks ranks, is refused with a FieldError wrapping ErrTooLong.
// A refused registration changes nothing. Its cost is linear in its ranks.
func (r *Router) Register(g Registration) error {
	eps, err := r.register(g)
	if err != nil {
		return err
	}
	if len(eps) > 0 && r.cfg.Endpoints != nil {
		if err := r.cfg.Endpoints.Registered(g.ID, g.Model, eps); err != nil {
			return fieldErr(ErrInvalid, "endpoint", "the worker is registered but its event endpoint is refused: %v", err)
		}
	}
	return nil
}

// register is Register without telling Config.Endpoints; it returns the endpoints of g's ranks
// (none if g names no endpoint).
func (r *Router) register(g Registration) ([]RankEndpoint, error) {
	ranks, err := g.check()
	if err != nil {
		return nil, err
	}
	eps, err := g.rankEndpoints(ranks)
	if err != nil {
		return nil, err
	}
	if len(eps) > 0 && r.cfg.Endpoints != nil {
		if err := r.cfg.Endpoints.Check(g.ID, g.Model, eps); err != nil {
			return nil, fieldErr(ErrInvalid, "endpoint", "%v", err)
		}
	}
	g.Ranks = ranks
	r.mu.Lock()
	added, err := r.registerLocked(g, eps, true)
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if len(added) > 0 {
		r.log.Info("worker registered", "worker", g.ID, "model", g.Model, "dp_ranks", rankList(added))
	}
	r.drain() // a new rank, or a rank's max batched tokens, may admit waiting requests
	return eps, nil
}

// Checked checks g on its own, as Register does before it looks at what is registered, and
// returns g with its ranks distinct and ascending: a registration Checked refuses, Register
// refuses with the same error whatever the router holds. Its cost is linear in g's ranks.
func (g Registration) Checked() (Registration, error) {
	ranks, err := g.check()
	if err == nil {
		_, err = g.rankEndpoints(ranks)
	}
	g.Ranks = ranks
	return g, err
}

// check checks g's fields against the API's and the snapshot format's limits, and returns its
// ranks distinct and ascending ([0] for none). Its cost is linear in len(g.Ranks), whose
// duplicates are dropped: the format stores a rank once per worker.
func (g *Registration) check() ([]uint32, error) {
	if g.Model == "" {
		return nil, fieldErr(ErrInvalid, "model", "required: the name of the model the worker serves, e.g. \"llama\"")
	}
	for _, f := range [...]struct{ name, v string }{{"model", g.Model}, {"endpoint", g.Endpoint}, {"replay_endpoint", g.Replay}, {"http_endpoint", g.HTTPEndpoint}} {
		if len(f.v) > wire.MaxString {
			return nil, fieldErr(ErrTooLong, f.name, "%d bytes, at most %d", len(f.v), wire.MaxString)
		}
	}
	if g.HTTPEndpoint != "" {
		if err := checkHTTPEndpoint(g.HTTPEndpoint); err != nil {
			return nil, err
		}
	}
	if err := checkAPIKey(g.APIKey); err != nil {
		return nil, err
	}
	if g.BlockSize < 0 || g.BlockSize > wire.MaxBlockSize {
		return nil, fieldErr(ErrInvalid, "block_size", "%d is out of range 1..%d", g.BlockSize, wire.MaxBlockSize)
	}
	if g.Capacity < 0 {
		return nil, fieldErr(ErrInvalid, "capacity_blocks", "%d: must not be negative", g.Capacity)
	}
	if g.MaxTokens < 0 {
		return nil, fieldErr(ErrInvalid, "max_batched_tokens", "%d: must not be negative", g.MaxTokens)
	}
	if err := checkWeight(g.Weight); err != nil {
		return nil, err
	}
	if !g.Role.valid() {
		return nil, fieldErr(ErrInvalid, "role", "role %d: want prefill, decode or both", g.Role)
	}
	if len(g.Ranks) == 0 {
		return []uint32{0}, nil
	}
	seen := make(map[uint32]struct{}, min(len(g.Ranks), wire.MaxSnapshotRanks))
	ranks := make([]uint32, 0, min(len(g.Ranks), wire.MaxSnapshotRanks))
	for _, rank := range g.Ranks {
		if _, dup := seen[rank]; dup {
			continue
		}
		if len(ranks) == wire.MaxSnapshotRanks {
			return nil, fieldErr(ErrTooLong, "dp_ranks", "more than %d distinct ranks, at most %d per worker", wire.MaxSnapshotRanks, wire.MaxSnapshotRanks)
		}
		seen[rank] = struct{}{}
		ranks = append(ranks, rank)
	}
	slices.Sort(ranks)
	return ranks, nil
}

// checkHTTPEndpoint accepts the base URL of a worker's HTTP API: http or https, a host, and
// nothing after the path.
func checkHTTPEndpoint(e string) error {
	u, err := url.Parse(e)
	switch {
	case err != nil:
		return fieldErr(ErrInvalid, "http_endpoint", "%q: %v", e, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fieldErr(ErrInvalid, "http_endpoint", "%q: want an http:// or https:// URL", e)
	case u.Host == "":
		return fieldErr(ErrInvalid, "http_endpoint", "%q: no host", e)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return fieldErr(ErrInvalid, "http_endpoint", "%q: want a base URL, without user, query or fragment", e)
	}
	return nil
}

// checkAPIKey accepts an API key that fits an Authorization header: printable ASCII without
// spaces, at most wire.MaxString bytes. Its errors never quote the key.
func checkAPIKey(k string) error {
	if len(k) > wire.MaxString {
		return fieldErr(ErrTooLong, "api_key", "%d bytes, at most %d", len(k), wire.MaxString)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return fieldErr(ErrInvalid, "api_key", "byte %d is not printable ASCII: a key goes in an Authorization header as it is", i)
		}
	}
	return nil
}

// HTTPEndpoint returns the base URL of worker id's HTTP API, "" if it has none or is not
// registered. Safe for concurrent use; it takes no lock the route path takes.
func (r *Router) HTTPEndpoint(id uint64) string {
	r.mu.Lock()
	reg := r.workers[id]
	r.mu.Unlock()
	if reg == nil {
		return ""
	}
	if u := reg.http.Load(); u != nil {
		return *u
	}
	return ""
}

// HTTPWorker is a worker with an HTTP API: its id and base URL, and the API key the front door
// sends it ("" when it has none).
type HTTPWorker struct {
	ID       uint64
	Endpoint string
	APIKey   string
}

// HTTPWorkers appends to dst the workers of model that have an HTTP endpoint, by id, and
// returns it, each with the API key the front door sends it: Config.APIKeys' for the worker if
// it has one, else the worker's registered one. Safe for concurrent use; it holds the
// registry's lock for one pass over the model's workers.
func (r *Router) HTTPWorkers(model string, dst []HTTPWorker) []HTTPWorker {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.model(model)
	if m == nil {
		return dst
	}
	start := len(dst)
	for id, reg := range m.regs {
		if u := reg.http.Load(); u != nil {
			dst = append(dst, HTTPWorker{ID: id, Endpoint: *u, APIKey: r.apiKeyLocked(reg, *u)})
		}
	}
	slices.SortFunc(dst[start:], func(a, b HTTPWorker) int { return cmp.Compare(a.ID, b.ID) })
	return dst
}

// apiKeyLocked is the API key of reg, whose HTTP endpoint is endpoint: Config.APIKeys' if it
// has one, else the registered one ("" for none). REQUIRES r.mu.
func (r *Router) apiKeyLocked(reg *registration, endpoint string) string {
	if r.cfg.APIKeys != nil {
		if k, ok := r.cfg.APIKeys(reg.id, endpoint); ok {
			return k
		}
	}
	if k := reg.apiKey.Load(); k != nil {
		return *k
	}
	return ""
}

// rankList is what a log line says of ranks: all of them when few.
func rankList(ranks []uint32) any {
	if len(ranks) <= 8 {
		return ranks
	}
	return fmt.Sprintf("%d ranks from %d to %d", len(ranks), slices.Min(ranks), slices.Max(ranks))
}

// registerLocked is register once check passed: g.Ranks are distinct, ascending and not empty,
// and eps, if any, their endpoints in the same order. It returns the ranks it added. Every
// refusal comes before any change; publish false leaves the model's worker list to the caller
// (a bulk restore publishes once). Its cost is linear in g's and the worker's ranks (at most
// wire.MaxSnapshotRanks each), plus publishing. REQUIRES r.mu.
func (r *Router) registerLocked(g Registration, eps []RankEndpoint, publish bool) ([]uint32, error) {
	m := r.model(g.Model)
	if m != nil && g.BlockSize != 0 && g.BlockSize != m.blockSize {
		return nil, fieldErr(ErrConflict, "block_size", "model %q has block size %d, not %d", g.Model, m.blockSize, g.BlockSize)
	}
	reg := r.workers[g.ID]
	if reg != nil && reg.model.name != g.Model {
		return nil, fieldErr(ErrConflict, "model", "worker %d is registered for model %q", g.ID, reg.model.name)
	}
	add := g.Ranks
	if reg != nil && len(reg.ranks) > 0 {
		have := make(map[uint32]struct{}, len(reg.ranks))
		for _, w := range reg.ranks {
			have[w.key.Rank] = struct{}{}
		}
		add = make([]uint32, 0, len(g.Ranks))
		for _, rank := range g.Ranks {
			if _, ok := have[rank]; !ok {
				add = append(add, rank)
			}
		}
	}
	if n := len(add); reg != nil && len(reg.ranks)+n > wire.MaxSnapshotRanks {
		return nil, fieldErr(ErrTooLong, "dp_ranks", "worker %d has %d ranks; %d more would exceed %d per worker",
			g.ID, len(reg.ranks), n, wire.MaxSnapshotRanks)
	}
	bs := g.BlockSize
	if m != nil {
		bs = m.blockSize
	} else if bs == 0 {
		bs = r.cfg.BlockSize
	}
	if bs > wire.MaxBlockSize {
		return nil, fieldErr(ErrInvalid, "block_size", "%d is out of range 1..%d", bs, wire.MaxBlockSize)
	}
	if m == nil {
		ix, err := radix.New(radix.Config{BlockSize: bs})
		if err != nil {
			return nil, fieldErr(ErrInvalid, "block_size", "%v", err)
		}
		if r.cfg.MaxIndexBytes > 0 {
			ix.TrackMatches() // eviction spares what matches use
		}
		m = &model{name: g.Model, ix: ix, blockSize: bs, regs: make(map[uint64]*registration), pred: r.newPredicted(bs)}
		st := *r.cfg.Step
		m.step.Store(&st)
		m.hits = modelHits{xsync.NewCounter(), xsync.NewCounter(), xsync.NewCounter()}
		if r.cfg.Queue != nil {
			m.queue = newModelQueue(r.cfg.Queue.Classes.Profile(g.Model))
		}
		r.initTracking(m)
		storeList(m, nil)
		r.initBusy(m)
	}
	// Slots, then loads; on a failure the slots taken here go back, and nothing else changed.
	keys := make([]radix.WorkerKey, len(add))
	slots := make([]radix.Slot, 0, len(add))
	for i, rank := range add {
		keys[i] = radix.WorkerKey{ID: g.ID, Rank: rank}
		slot, err := m.ix.Acquire(keys[i])
		if err == nil {
			slots = append(slots, slot)
			continue
		}
		for _, s := range slots {
			_ = m.ix.Release(s)
		}
		return nil, fmt.Errorf("router: worker %d rank %d: %w", g.ID, rank, err)
	}
	loads, err := r.tracker.RegisterAll(keys, make([]*scoring.Load, 0, len(keys)))
	if err != nil {
		for _, s := range slots {
			_ = m.ix.Release(s)
		}
		return nil, fmt.Errorf("router: worker %d: %w", g.ID, err)
	}
	if r.model(g.Model) == nil {
		next := make(map[string]*model, len(*r.models.Load())+1)
		for k, v := range *r.models.Load() {
			next[k] = v
		}
		next[g.Model] = m
		r.models.Store(&next)
		r.log.Info("model created", "model", g.Model, "block_size", bs)
	}
	if reg == nil {
		reg = &registration{id: g.ID, model: m}
		reg.role.Store(uint32(g.Role))
		r.workers[g.ID] = reg
		m.regs[g.ID] = reg
	} else if !g.KeepRole && reg.getRole() != g.Role {
		r.log.Info("worker role changed", "worker", g.ID, "model", g.Model, "from", reg.getRole(), "to", g.Role)
		reg.role.Store(uint32(g.Role))
	}
	if g.Capacity != 0 {
		reg.capacity.Store(g.Capacity)
	}
	if g.MaxTokens != 0 {
		reg.maxTokens.Store(g.MaxTokens)
	}
	if g.Capacity != 0 || g.MaxTokens != 0 {
		st := *m.step.Load()
		if g.Capacity != 0 {
			st.Capacity = g.Capacity
		}
		if g.MaxTokens != 0 {
			st.MaxBatched = g.MaxTokens
		}
		m.step.Store(&st)
	}
	if g.Weight != 0 {
		reg.setWeight(g.Weight)
	}
	if g.HTTPEndpoint != "" {
		u := g.HTTPEndpoint
		reg.http.Store(&u)
	}
	if g.APIKey != "" {
		k := g.APIKey
		reg.apiKey.Store(&k)
	}
	reg.ranks = slices.Grow(reg.ranks, len(add))
	for i, key := range keys {
		reg.ranks = append(reg.ranks, &rankWorker{key: key, slot: slots[i], load: loads[i], reg: reg})
	}
	slices.SortFunc(reg.ranks, func(a, b *rankWorker) int { return cmp.Compare(a.key.Rank, b.key.Rank) })
	// Each rank named keeps its own endpoints: registering ranks one at a time, each with its
	// own, leaves every rank with its own.
	for _, ep := range eps {
		if i, ok := slices.BinarySearchFunc(reg.ranks, ep.Rank, func(w *rankWorker, rank uint32) int {
			return cmp.Compare(w.key.Rank, rank)
		}); ok {
			reg.ranks[i].endpoint, reg.ranks[i].replay = ep.Endpoint, ep.Replay
		}
	}
	if publish {
		r.publishWorkerLocked(m, g.ID)
	}
	return add, nil
}

// publishLocked rebuilds m's worker list from its registrations: for a bulk restore, which
// publishes once. REQUIRES r.mu.
func (r *Router) publishLocked(m *model) {
	var n int
	for _, reg := range m.regs {
		n += len(reg.ranks)
	}
	ws := make([]*rankWorker, 0, n)
	for _, reg := range m.regs {
		ws = append(ws, reg.ranks...)
	}
	slices.SortFunc(ws, func(a, b *rankWorker) int {
		if c := cmp.Compare(a.key.ID, b.key.ID); c != 0 {
			return c
		}
		return cmp.Compare(a.key.Rank, b.key.Rank)
	})
	storeList(m, ws)
}

// publishWorkerLocked publishes m's worker list with worker id's ranks as registered now (none
// if it is not): the current list with id's run of ranks replaced, so that a registration
// costs a copy of the list, not a sort of it. REQUIRES r.mu.
func (r *Router) publishWorkerLocked(m *model, id uint64) {
	old := m.list.Load().ws
	lo, _ := slices.BinarySearchFunc(old, id, func(w *rankWorker, id uint64) int { return cmp.Compare(w.key.ID, id) })
	hi := lo
	for hi < len(old) && old[hi].key.ID == id {
		hi++
	}
	var now []*rankWorker // by rank, as registration.ranks
	if reg := m.regs[id]; reg != nil {
		now = reg.ranks
	}
	ws := make([]*rankWorker, 0, len(old)-(hi-lo)+len(now))
	ws = append(append(append(ws, old[:lo]...), now...), old[hi:]...)
	storeList(m, ws)
}

// storeList publishes ws, sorted by id then rank, as m's worker list, with its serve and
// prefill pools; linear in len(ws) and in the highest slot.
func storeList(m *model, ws []*rankWorker) {
	l := newWorkerList(ws)
	l.serve = l
	if i := slices.IndexFunc(ws, func(w *rankWorker) bool { return !w.reg.getRole().decodes() }); i >= 0 {
		var serve, pre []*rankWorker
		for _, w := range ws {
			if w.reg.getRole().decodes() {
				serve = append(serve, w)
			} else {
				pre = append(pre, w)
			}
		}
		l.serve, l.prefill = newWorkerList(serve), newWorkerList(pre)
	}
	m.list.Store(l)
}

// newWorkerList returns the list of ws, sorted by id then rank, without pools.
func newWorkerList(ws []*rankWorker) *workerList {
	l := &workerList{
		ws:    ws,
		keys:  make([]radix.WorkerKey, len(ws)),
		slots: make([]radix.Slot, len(ws)),
		loads: make([]*scoring.Load, len(ws)),
	}
	var maxSlot, maxActive radix.Slot
	for _, w := range ws {
		maxSlot, maxActive = max(maxSlot, w.slot), max(maxActive, w.load.Slot())
	}
	if len(ws) > 0 {
		l.bySlot, l.byActive = newPos(int(maxSlot)+1), newPos(int(maxActive)+1)
	}
	for i, w := range ws {
		l.bySlot[w.slot], l.byActive[w.load.Slot()] = int32(i), int32(i)
		l.keys[i], l.slots[i], l.loads[i] = w.key, w.slot, w.load
	}
	return l
}

// newPos returns n positions, each -1 (none).
func newPos(n int) []int32 {
	a := make([]int32, n)
	for i := range a {
		a[i] = -1
	}
	return a
}

// Unregister removes worker id: it leaves routing at once, and its blocks leave the index after
// its earlier events apply. Its active requests stop counting. Config.Endpoints learns of it.
func (r *Router) Unregister(id uint64) error {
	if err := r.unregister(id); err != nil {
		return err
	}
	if r.cfg.Endpoints != nil {
		r.cfg.Endpoints.Unregistered(id)
	}
	return nil
}

// unregister is Unregister without telling Config.Endpoints: a worker dropped for silence
// keeps its subscription, whose next event brings it back.
// UnregisterRank removes one data-parallel rank of worker id: it leaves routing now, its blocks
// leave the index, and the worker's other ranks stay. Removing its last rank removes the worker.
func (r *Router) UnregisterRank(id uint64, rank uint32) error {
	r.mu.Lock()
	reg := r.workers[id]
	if reg == nil {
		r.mu.Unlock()
		return fieldErr(ErrUnknownWorker, "worker_id", "worker %d is not registered", id)
	}
	i := slices.IndexFunc(reg.ranks, func(w *rankWorker) bool { return w.key.Rank == rank })
	if i < 0 {
		r.mu.Unlock()
		return fieldErr(ErrUnknownWorker, "dp_rank", "worker %d has no rank %d", id, rank)
	}
	if len(reg.ranks) == 1 {
		r.mu.Unlock()
		return r.Unregister(id)
	}
	w := reg.ranks[i]
	reg.ranks = slices.Delete(slices.Clone(reg.ranks), i, i+1)
	r.publishWorkerLocked(reg.model, id)
	r.mu.Unlock()
	if err := r.drop(reg, []*rankWorker{w}, func(a *shard.Applier) { a.RemoveRank(id, rank) }); err != nil {
		return err
	}
	if r.cfg.Endpoints != nil {
		r.cfg.Endpoints.UnregisteredRank(id, rank)
	}
	r.log.Info("worker rank unregistered", "worker", id, "model", reg.model.name, "dp_rank", rank)
	r.drain()
	return nil
}

func (r *Router) unregister(id uint64) error {
	r.mu.Lock()
	reg := r.workers[id]
	if reg == nil {
		r.mu.Unlock()
		return fieldErr(ErrUnknownWorker, "worker_id", "worker %d is not registered", id)
	}
	delete(r.workers, id)
	delete(reg.model.regs, id)
	r.publishWorkerLocked(reg.model, id)
	r.mu.Unlock()
	if err := r.drop(reg, reg.ranks, func(a *shard.Applier) { a.RemoveWorker(id) }); err != nil {
		return err
	}
	r.log.Info("worker unregistered", "worker", id, "model", reg.model.name)
	r.drain() // requests pinned to it are refused now
	return nil
}

// drop forgets ranks ws of reg, taken out of routing already: their bookings, their
// approximate blocks, and, on reg's shard, what remove drops of their blocks and state, then the
// slots of ranks that never sent an event (Register took one for each).
func (r *Router) drop(reg *registration, ws []*rankWorker, remove func(*shard.Applier)) error {
	ix := reg.model.ix
	for _, w := range ws {
		r.forgetHealth(w)
		r.tracker.Unregister(w.load)
		if r.approx != nil {
			r.forgetApprox(ix, w)
		}
		if p := reg.model.pred; p != nil {
			p.forget(w.key)
		}
	}
	err := r.set.Do(reg.id, func(a *shard.Applier) {
		remove(a)
		for _, w := range ws {
			if s, ok := ix.Lookup(w.key); ok {
				_ = ix.Release(s)
			}
		}
	})
	if err != nil {
		return ErrClosed
	}
	return nil
}

// newTracker returns a Tracker on clock now, which CostTTFT's decay reads, for bookings that
// expire expiry after they are made.
func newTracker(now func() int64, expiry time.Duration) *scoring.Tracker {
	t := scoring.NewTracker()
	t.Now, t.Expiry = now, int64(expiry)
	return t
}

// modelHits counts a model's routed prompt tokens, and of them the tokens of the longest prefix
// cached anywhere in its fleet (available) and on the worker chosen (achieved).
// Striped counters, as the router's own: every route of the model adds to them.
type modelHits struct {
	prompt, available, achieved *xsync.Counter
}

// ModelHit is one model's hit counters (Router.ModelHits): its routed requests' prompt tokens,
// the tokens of the longest prefix of each cached on any of the model's workers (Available,
// the best any routing could have done), and on the worker chosen (Achieved). A plain value.
type ModelHit struct {
	Model                       string
	Prompt, Available, Achieved int64
}

// ModelHits appends every model's hit counters to dst, by model name. Safe for concurrent use.
func (r *Router) ModelHits(dst []ModelHit) []ModelHit {
	start := len(dst)
	for name, m := range *r.models.Load() {
		dst = append(dst, ModelHit{Model: name, Prompt: m.hits.prompt.Value(), Available: m.hits.available.Value(), Achieved: m.hits.achieved.Value()})
	}
	slices.SortFunc(dst[start:], func(a, b ModelHit) int { return cmp.Compare(a.Model, b.Model) })
	return dst
}
