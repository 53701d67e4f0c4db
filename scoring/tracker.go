package scoring

import (
	"errors"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/internal/freelist"
	"github.com/kvrouterd/kvrouterd/internal/u64map"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/zeebo/xxh3"
)

// Errors of the Tracker.
var (
	ErrDuplicateRequest = errors.New("scoring: request id already active")
	ErrUnknownRequest   = errors.New("scoring: no active request with this id")
	ErrWorkerGone       = errors.New("scoring: worker unregistered")
	ErrRequestID        = errors.New("scoring: request id must be 1 to 1024 bytes")
)

// MaxRequestID is the longest request id the Tracker accepts, in bytes.
const MaxRequestID = 1024

const reqShards = 64

// Tracker holds the active load of every worker: the requests the router sent it that have not
// completed. All methods are safe for concurrent use. Booking a request costs one lock of a
// request shard and one of the worker; reads of a worker's load are atomic loads; Match finds the
// workers a request could share active blocks with lock-free, then takes each one's lock.
//
// Blocks are expected chained (equal hashes at position i mean equal prefixes up to i), as the
// router computes them. Unchained ones, say from a faulty peer, make the counts of shared and
// active blocks approximate, but never more blocks shared than active, and nothing is left
// active, busy or indexed once their requests complete.
type Tracker struct {
	// roots holds, per worker slot, the first blocks of its active requests: the workers a new
	// request could share active blocks with are those holding its first block, found in one
	// lock-free lookup. The other blocks are known only per worker (its requests, or refs for a
	// worker with many), which is far cheaper to change than the index: with every block in the
	// index, BenchmarkRoute (router, 8 workers) took 17.4 µs per request, 4.8 µs without.
	roots  *radix.Index
	mu     sync.Mutex              // serializes Register
	loads  atomic.Pointer[[]*Load] // slot → Load, copy-on-write
	shards [reqShards]reqShard
	pool   *freelist.List[booking]
	n      atomic.Int64
	stages atomic.Int64 // the bookings of BookStage, which n does not count
	// busy has bit s set while the worker of slot s has requests booked, so that a caller can
	// find the few busy workers of a large fleet without reading every worker's load.
	busy [(radix.MaxSlots/64 + busyWords - 1) / busyWords]atomic.Pointer[[busyWords]atomic.Uint64]

	// Now, if set, is the clock of Load.PrefillSince and of the slowness PrefillDone learns;
	// set it before the first booking.
	Now func() int64
	// slow is the median of log(measured / predicted TTFT) over every worker's requests, as
	// math.Float64bits (Load.SlownessStep's reference).
	slow     atomic.Uint64
	measured atomic.Int64 // the measurements slow has taken
	// Expiry, if set with Now, is how far past its booking a booking's deadline is (the
	// router's request expiry): a completion's lifetime is Now − (deadline − Expiry), which
	// MeanLifetime averages. life is that mean, math.Float64bits of ms.
	Expiry int64
	life   atomic.Uint64
}

// busyWords is the 64-bit words per chunk of the busy bitmap (4,096 slots).
const busyWords = 64

type reqShard struct {
	mu sync.Mutex
	m  map[uint64]*booking // by xxh3 of the id; the id is kept to tell a collision apart
	_  [40]byte
}

type booking struct {
	id          []byte
	load        *Load
	seqs        []uint64
	prefill     int64
	prefillDone bool
	stage       bool // booked by BookStage
	deadline    int64
	booked      int64 // Tracker.Now at booking, when its TTFT was predicted (0: not)
	at          int   // position in load.active while booked on a registered worker

	// Output blocks (see Generated and OutputBlock), under the worker's lock.
	output   Output
	tokBlock int64   // ⌈(isl + generated) / block size⌉ last counted
	out      int64   // output blocks booked
	disc     float64 // blocks this request's decay takes off the worker's active blocks
}

// Output is what Generated needs of a request to count its output blocks as it generates them
// (Dynamo's router_track_output_blocks). A zero Output counts none. A plain value.
type Output struct {
	ISL       int64 // prompt tokens
	BlockSize int32 // tokens per block; 0: the request's output blocks are not counted
	// Expected is the expected output length in tokens (Dynamo's agent_hints.osl); when known,
	// the request's blocks that no other request uses weigh 1 − generated/expected (at least
	// 0) once generation starts, Dynamo's decay.
	Expected int64
	// PredictedTTFT, if > 0, is the request's time to first token as CostTTFT's step model
	// predicted it at booking with nothing queued ahead of it, in ms: PrefillDone then learns
	// the worker's slowness from the time it actually took (Load.Slowness).
	PredictedTTFT float64
}

// Load is one worker's (id, dp rank) booked load. Its accessors are safe for concurrent use.
type Load struct {
	key  radix.WorkerKey
	slot radix.Slot

	mu     sync.Mutex
	active []*booking // the requests booked on this worker, in no order
	// refs counts, per full block, the active requests using it, and firsts the active requests
	// starting with it, while mapped: kept only for a worker with many requests (see
	// scanRequests).
	refs, firsts u64map.Map
	mapped       bool
	gone         bool

	// out is the output blocks of the active requests and discF what their decay takes off
	// the active blocks (disc, rounded); both under mu.
	out   int64
	discF float64

	blocks   atomic.Int64
	disc     atomic.Int64
	prefill  atomic.Int64
	requests atomic.Int64
	// pending counts the requests booked with prefill tokens whose prefill is not done.
	pending atomic.Int64
	// rel is the median of log(measured / predicted TTFT) of the worker's requests less
	// the fleet's (Tracker.slow) when each was measured; slowStep its quantized step
	// (SlownessStep). Both as math.Float64bits, written under mu.
	rel, slowStep atomic.Uint64
	// fleet is the tracker's slow: the fleet's median.
	fleet *atomic.Uint64
	// since is when the worker's oldest prefill not yet done started: when the booking that
	// took its prefill from none was made, or the latest prefill-done that left some.
	since atomic.Int64
}

// Slowness returns how long the worker takes to its requests' first tokens against CostTTFT's
// prediction, for requests that had nothing queued ahead of them: the fleet's median of
// measured / predicted times the worker's SlownessStep; 1 until a request is measured.
func (l *Load) Slowness() float64 {
	f := 0.0
	if l.fleet != nil {
		f = math.Float64frombits(l.fleet.Load())
	}
	return math.Exp(f) * l.SlownessStep()
}

// SlownessStep returns the worker's slowness relative to the fleet's: the median of its
// requests' measured / predicted against the fleet's, rounded to a power of √2 (1 from 0.84
// to 1.19). CostTTFT multiplies the worker's predicted time by it. It is learnt in steps of
// 2 % of its log, so that no single request moves it far, and coarse, so that workers that
// differ by noise stay alike, which lets the router price the idle ones by their cached depth
// alone. What the step model gets wrong for every worker alike is the fleet's median, learnt
// fast from every worker's requests.
func (l *Load) SlownessStep() float64 {
	if s := math.Float64frombits(l.slowStep.Load()); s > 0 {
		return s
	}
	return 1
}

const (
	slownessStep = 0.02 // how far one measurement moves a median's log, at the least
	maxSlowness  = 16   // the most one measurement may say, either way
)

// towards moves the median estimate lg a step towards r.
func towards(lg, r, step float64) float64 {
	switch {
	case r > lg:
		return lg + min(step, r-lg)
	case r < lg:
		return lg - min(step, lg-r)
	}
	return lg
}

// learnSlowness folds a request's measured time to first token, against the predicted one,
// into the fleet's slowness and l's relative one. The fleet's median moves 1/(n+1) of a log
// unit at its n-th measurement (never less than slownessStep), so that a fleet far from the
// prior is learnt within tens of requests and a change of speed is followed; a worker's
// relative median moves slownessStep a measurement. REQUIRES l.mu.
func (t *Tracker) learnSlowness(l *Load, measured, predicted float64) {
	if !(measured > 0) || !(predicted > 0) {
		return
	}
	r := math.Log(min(max(measured/predicted, 1.0/maxSlowness), maxSlowness))
	step := max(slownessStep, 1/float64(t.measured.Add(1)))
	var fleet float64
	for {
		old := t.slow.Load()
		fleet = math.Float64frombits(old)
		if t.slow.CompareAndSwap(old, math.Float64bits(towards(fleet, r, step))) {
			break
		}
	}
	rel := towards(math.Float64frombits(l.rel.Load()), r-fleet, slownessStep)
	l.rel.Store(math.Float64bits(rel))
	q := math.Exp2(math.Round(2*rel/math.Ln2) / 2)
	if l.SlownessStep() != q {
		l.slowStep.Store(math.Float64bits(q))
		t.setBusy(l.slot, len(l.active) > 0 || q != 1)
	}
}

// Pending returns the worker's booked requests with prompt tokens to compute whose prefill is
// not done: those waiting for their first token.
func (l *Load) Pending() int64 { return l.pending.Load() }

// PrefillSince returns when the worker's oldest prefill not yet done started (Tracker.Now's
// clock; 0 without a clock).
func (l *Load) PrefillSince() int64 { return l.since.Load() }

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker {
	ix, err := radix.New(radix.Config{BlockSize: 1})
	if err != nil {
		panic(err) // block size 1 is valid
	}
	t := &Tracker{roots: ix, pool: freelist.New[booking]()}
	t.loads.Store(&[]*Load{})
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]*booking)
	}
	return t
}

// Register adds worker k and returns its Load. Each worker is registered once; Unregister it
// before registering it again.
func (t *Tracker) Register(k radix.WorkerKey) (*Load, error) {
	ls, err := t.RegisterAll([]radix.WorkerKey{k}, nil)
	if err != nil {
		return nil, err
	}
	return ls[0], nil
}

// RegisterAll registers every worker of keys as Register does and appends their Loads to dst,
// in keys' order; on an error it registers none of them. Its cost is linear in len(keys) plus
// the slots in use: the slot → Load table is copied once, not once per worker.
func (t *Tracker) RegisterAll(keys []radix.WorkerKey, dst []*Load) ([]*Load, error) {
	if len(keys) == 0 {
		return dst, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	loads := *t.loads.Load()
	n, at := len(loads), len(dst)
	for _, k := range keys {
		s, err := t.roots.Acquire(k)
		if err != nil {
			for _, l := range dst[at:] {
				_ = t.roots.Release(l.slot) // new: it holds no blocks
			}
			return dst[:at], err
		}
		if c := &t.busy[s/(64*busyWords)]; c.Load() == nil {
			c.Store(new([busyWords]atomic.Uint64))
		}
		l := &Load{key: k, slot: s, fleet: &t.slow}
		l.slowStep.Store(math.Float64bits(1))
		dst = append(dst, l)
		n = max(n, int(s)+1)
	}
	next := make([]*Load, n)
	copy(next, loads)
	for _, l := range dst[at:] {
		next[l.slot] = l
	}
	t.loads.Store(&next)
	return dst, nil
}

// Unregister drops the worker's active blocks. Its requests stay known until they complete or
// expire, so their ids are not reused by mistake, but they no longer count.
func (t *Tracker) Unregister(l *Load) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone {
		return
	}
	l.gone = true
	t.setBusy(l.slot, false)
	for _, b := range l.active {
		if len(b.seqs) > 0 {
			t.roots.Remove(b.seqs[0], l.slot) // a first block shared by several goes at the first
		}
	}
	l.refs.Reset()
	l.firsts.Reset()
	l.mapped = false
	clear(l.active)
	l.active = l.active[:0]
	l.blocks.Store(0)
	l.out, l.discF = 0, 0
	l.disc.Store(0)
	l.prefill.Store(0)
	_ = t.roots.Release(l.slot)
}

// Key returns the worker the load belongs to.
func (l *Load) Key() radix.WorkerKey { return l.key }

// Slot returns the worker's slot in the Tracker's match results.
func (l *Load) Slot() radix.Slot { return l.slot }

// ActiveBlocks returns the blocks the worker's active requests occupy: their prompts' blocks
// (each once however many requests share it) and their output blocks, less what the decay of
// output tracking takes off (rounded to the nearest block, as Dynamo rounds its weights).
func (l *Load) ActiveBlocks() int64 { return l.blocks.Load() - l.disc.Load() }

// Decayed returns the blocks the decay of output tracking takes off ActiveBlocks: ActiveBlocks +
// Decayed is the count of blocks booked, which bounds how many of them a request can share.
func (l *Load) Decayed() int64 { return l.disc.Load() }

// Blocks returns ActiveBlocks and the blocks booked (ActiveBlocks + Decayed) from one read of
// each counter.
func (l *Load) Blocks() (active, booked int64) {
	b := l.blocks.Load()
	return b - l.disc.Load(), b
}

// ActivePrefill returns the prompt tokens the worker still has to prefill.
func (l *Load) ActivePrefill() int64 { return l.prefill.Load() }

// Requests returns the number of active requests on the worker.
func (l *Load) Requests() int64 { return l.requests.Load() }

// Match fills m with, for every registered worker that has seqs[0] active, how many leading
// blocks of seqs its active requests already use (m.Slots are Load.Slot values). seqs are
// chained block hashes, as Book's are. It finds those workers lock-free, then takes each one's
// lock to compare seqs with its requests (see Load.shared).
func (t *Tracker) Match(seqs []uint64, m *radix.Match) {
	if len(seqs) == 0 {
		t.roots.Match(nil, m)
		return
	}
	t.roots.Match(seqs[:1], m)
	loads := *t.loads.Load()
	for i, s := range m.Slots {
		if int(s) < len(loads) && loads[s] != nil {
			m.Depth[i] = int32(loads[s].shared(seqs))
		}
	}
}

// scanRequests is the most active requests on a worker for which it works from the requests'
// blocks alone; above it the worker keeps a map of its active blocks (refs), dropped again when
// its requests fall to half as many. Blocks are chained, so two sequences that agree at block i
// agree on every block before it, and the blocks active on a worker are the union of its
// requests' prefixes, a trie: a request adds to it, or frees, its blocks beyond the longest
// prefix it shares with another request, and the query's shared prefix is the longest it shares
// with one. With few requests, finding that prefix is a binary search per request over two
// arrays, most requests ruled out by one comparison at the best length so far; that is far
// cheaper than a map operation per block (a hash and a likely cache miss), but grows with the
// requests.
const scanRequests = 16

// longestShared returns the longest prefix seqs shares with one of l's active requests other
// than skip. REQUIRES l.mu.
func (l *Load) longestShared(seqs []uint64, skip *booking) int {
	best := 0
	for _, b := range l.active {
		if best == len(seqs) {
			break
		}
		if b != skip {
			best = longerPrefix(seqs, b.seqs, best)
		}
	}
	return best
}

// own returns how many of b's blocks no other request active on l uses: those its booking adds
// (book) or its completion frees. With refs it counts b in or out of them; if b's first block is
// its own, it enters or leaves the roots index. b must not be in l.active yet when booked.
// REQUIRES l.mu.
func (t *Tracker) own(l *Load, b *booking, book bool) int64 {
	if len(b.seqs) == 0 {
		return 0
	}
	var n int64
	var first bool // no other active request starts with b's first block
	if l.mapped {
		l.refs.Prefetch(b.seqs)
		for _, s := range b.seqs {
			if book && l.refs.Ref(s) || !book && l.refs.Unref(s) {
				n++
			}
		}
		if book {
			first = l.firsts.Ref(b.seqs[0])
		} else {
			first = l.firsts.Unref(b.seqs[0])
		}
	} else {
		n = int64(len(b.seqs) - l.longestShared(b.seqs, b))
		first = n == int64(len(b.seqs))
	}
	// The roots index holds the first blocks of a worker's requests: counted apart from refs,
	// so that it stays exact even if a peer sent blocks that are not chained.
	if first {
		if book {
			t.roots.Add(b.seqs[0], l.slot)
		} else {
			t.roots.Remove(b.seqs[0], l.slot)
		}
	}
	return n
}

// mapRefs builds refs and firsts from the active requests, and restates the active blocks as
// refs counts them. REQUIRES l.mu.
func (l *Load) mapRefs() {
	l.refs.Reset()
	l.firsts.Reset()
	for _, b := range l.active {
		l.refs.Prefetch(b.seqs)
		for _, s := range b.seqs {
			l.refs.Ref(s)
		}
		if len(b.seqs) > 0 {
			l.firsts.Ref(b.seqs[0])
		}
	}
	l.mapped = true
	l.blocks.Store(int64(l.refs.Len()) + l.out)
}

// unmapRefs drops refs and firsts, and restates the active blocks as the requests' prefixes count
// them. For chained blocks the two counts agree; restating them at each switch keeps a peer's
// unchained blocks from making them drift. REQUIRES l.mu.
func (l *Load) unmapRefs() {
	l.refs.Reset()
	l.firsts.Reset()
	l.mapped = false
	var n int64
	for i, b := range l.active {
		best := 0
		for _, o := range l.active[:i] {
			best = longerPrefix(b.seqs, o.seqs, best)
		}
		n += int64(len(b.seqs) - best)
	}
	l.blocks.Store(n + l.out)
}

// Shared returns how many leading blocks of seqs (chained hashes, as Book's) are active on l: the
// depth Match reports for l, for one worker.
func (t *Tracker) Shared(l *Load, seqs []uint64) int {
	if len(seqs) == 0 {
		return 0
	}
	return l.shared(seqs)
}

// shared returns how many leading blocks of seqs are active on l: without refs, the longest
// prefix seqs shares with a request; with refs, a binary search for the longest prefix in refs,
// whose blocks are closed under prefixes.
func (l *Load) shared(seqs []uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.mapped {
		// Unchained blocks from a peer could make the searches overshoot what is active.
		return min(l.longestShared(seqs, nil), int(l.blocks.Load()))
	}
	if _, ok := l.firsts.Get(seqs[0]); !ok {
		return 0 // as Match finds: no request starts where seqs does
	}
	lo, hi := 0, len(seqs) // seqs[:lo] active; seqs[hi] not (or hi = len)
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if _, ok := l.refs.Get(seqs[mid-1]); ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return min(lo, int(l.blocks.Load()))
}

// longerPrefix returns the length of the common prefix of the chained sequences a and b if it
// is longer than best, else best.
func longerPrefix(a, b []uint64, best int) int {
	n := min(len(a), len(b))
	if n <= best || a[best] != b[best] {
		return best
	}
	lo, hi := best+1, n // a[:lo] == b[:lo]; a[hi-1] != b[hi-1] unless hi == n
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if a[mid-1] == b[mid-1] {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// setBusy sets or clears slot's bit in the busy bitmap. REQUIRES the slot's Load.mu.
func (t *Tracker) setBusy(s radix.Slot, busy bool) {
	w, bit := &t.busy[s/(64*busyWords)].Load()[s/64%busyWords], uint64(1)<<(s%64)
	if busy {
		w.Or(bit)
	} else {
		w.And(^bit)
	}
}

// AppendBusy appends to dst, ascending, the slots of the registered workers that have requests
// booked, or a SlownessStep other than 1: the workers whose ActiveBlocks, ActivePrefill and
// Requests may be other than 0, or whose speed differs from the others'. It reads
// a bitmap, 64 workers per word, lock-free; a request booked or completed meanwhile may or may not
// be seen, as with those accessors.
func (t *Tracker) AppendBusy(dst []radix.Slot) []radix.Slot {
	high := len(*t.loads.Load())
	for c := 0; c*64*busyWords < high; c++ {
		words := t.busy[c].Load()
		if words == nil {
			break
		}
		for i := range words {
			for b := words[i].Load(); b != 0; b &= b - 1 {
				dst = append(dst, radix.Slot((c*busyWords+i)*64+bits.TrailingZeros64(b)))
			}
		}
	}
	return dst
}

// Active returns the number of requests booked and not completed or expired.
func (t *Tracker) Active() int64 { return t.n.Load() }

func (t *Tracker) shard(id string) (*reqShard, uint64) {
	h := xxh3.HashString(id)
	return &t.shards[h%reqShards], h
}

// Book records request id as routed to l: blocks seqs (its full blocks as chained hashes, first
// block first) and prefill uncached prompt tokens. The request expires at deadline (any monotonic
// clock in nanoseconds, as passed to Expire). It allocates nothing in steady state.
func (t *Tracker) Book(id string, l *Load, seqs []uint64, prefill int64, deadline int64) error {
	return t.BookOutput(id, l, seqs, prefill, deadline, Output{})
}

// BookOutput is Book for a request whose output blocks Generated counts as described by o.
func (t *Tracker) BookOutput(id string, l *Load, seqs []uint64, prefill int64, deadline int64, o Output) error {
	return t.book(id, l, seqs, prefill, deadline, o, false)
}

// BookStage books one stage of a request that holds no blocks on l, under a key of the
// caller's (id): prefill prompt tokens until it completes or expires, as a request, but counted
// in Stages, not Active. A disaggregated request's prefill stage is one: its worker prefills
// the prompt and generates one token, and the blocks it computes go to the decode stage.
func (t *Tracker) BookStage(id string, l *Load, prefill int64, deadline int64) error {
	return t.book(id, l, nil, prefill, deadline, Output{}, true)
}

// Stages returns the number of BookStage bookings neither completed nor expired.
func (t *Tracker) Stages() int64 { return t.stages.Load() }

func (t *Tracker) book(id string, l *Load, seqs []uint64, prefill int64, deadline int64, o Output, stage bool) error {
	if len(id) == 0 || len(id) > MaxRequestID {
		return ErrRequestID
	}
	sh, h := t.shard(id)
	b := t.pool.Get()
	b.id = append(b.id[:0], id...)
	b.load, b.prefill, b.prefillDone, b.deadline, b.stage = l, prefill, false, deadline, stage
	b.output, b.out, b.disc, b.tokBlock = o, 0, 0, 0
	b.booked = 0
	if t.Now != nil && o.PredictedTTFT > 0 {
		b.booked = t.Now()
	}
	if o.BlockSize > 0 {
		b.tokBlock = ceilDiv(max(o.ISL, 0), int64(o.BlockSize))
	}
	b.seqs = append(b.seqs[:0], seqs...)
	// The worker's lock is held until the blocks are booked, so a Complete or Expire that finds
	// the booking as soon as it is visible waits for it to take effect. Lock order: worker, then
	// request shard; no path takes them the other way round.
	l.mu.Lock()
	if l.gone {
		l.mu.Unlock()
		b.load = nil // a spare keeps no worker reachable
		t.pool.Put(b)
		return ErrWorkerGone
	}
	sh.mu.Lock()
	if _, dup := sh.m[h]; dup {
		sh.mu.Unlock()
		l.mu.Unlock()
		b.load = nil
		t.pool.Put(b)
		return ErrDuplicateRequest
	}
	sh.m[h] = b
	sh.mu.Unlock()
	if !l.mapped && len(l.active) >= scanRequests {
		l.mapRefs()
	}
	added := t.own(l, b, true)
	b.at = len(l.active)
	l.active = append(l.active, b)
	if b.at == 0 {
		t.setBusy(l.slot, true)
	}
	l.blocks.Add(added)
	if prefill > 0 {
		l.pending.Add(1)
		if l.prefill.Add(prefill) == prefill && t.Now != nil {
			l.since.Store(t.Now())
		}
	}
	l.requests.Add(1)
	if stage {
		t.stages.Add(1)
	} else {
		t.n.Add(1)
	}
	l.mu.Unlock()
	return nil
}

// findLocked returns the booking of id in sh, or nil. REQUIRES sh.mu.
func findLocked(sh *reqShard, h uint64, id string) *booking {
	if b := sh.m[h]; b != nil && string(b.id) == id {
		return b
	}
	return nil
}

// PrefillDone records that request id has finished its prefill: its prompt tokens no longer
// count. A second call does nothing.
func (t *Tracker) PrefillDone(id string) error {
	sh, h := t.shard(id)
	sh.mu.Lock()
	b := findLocked(sh, h, id)
	if b == nil {
		sh.mu.Unlock()
		return ErrUnknownRequest
	}
	done := b.prefillDone
	b.prefillDone = true
	l, p := b.load, b.prefill
	booked, predicted := b.booked, b.output.PredictedTTFT
	sh.mu.Unlock()
	if !done {
		var now int64
		if t.Now != nil {
			now = t.Now()
		}
		l.mu.Lock()
		if !l.gone {
			if p > 0 {
				l.pending.Add(-1)
			}
			if l.prefill.Add(-p) > 0 && t.Now != nil {
				l.since.Store(now)
			}
			if booked > 0 {
				t.learnSlowness(l, float64(now-booked)/1e6, predicted)
			}
		}
		l.mu.Unlock()
	}
	return nil
}

// Booked reports whether request id is booked: neither completed nor expired.
func (t *Tracker) Booked(id string) bool {
	sh, h := t.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return findLocked(sh, h, id) != nil
}

// Complete frees request id's blocks and any prefill tokens still counted.
func (t *Tracker) Complete(id string) error {
	sh, h := t.shard(id)
	sh.mu.Lock()
	b := findLocked(sh, h, id)
	if b != nil {
		delete(sh.m, h)
	}
	sh.mu.Unlock()
	if b == nil {
		return ErrUnknownRequest
	}
	if t.Now != nil && t.Expiry > 0 && !b.stage {
		t.noteLifetime(t.Now() - (b.deadline - t.Expiry))
	}
	t.release(b)
	return nil
}

// noteLifetime folds a completed request's time on its worker, in ns, into MeanLifetime.
// Concurrent completions may each miss the other's update: a sample lost, never a wrong mean.
func (t *Tracker) noteLifetime(ns int64) {
	if ns <= 0 || ns > t.Expiry {
		return // a booking whose deadline was not Now + Expiry (a replica's, a stage's)
	}
	x := float64(ns) / 1e6
	old := math.Float64frombits(t.life.Load())
	if old == 0 {
		t.life.Store(math.Float64bits(x))
		return
	}
	t.life.Store(math.Float64bits(old + (x-old)/64))
}

// FleetSlowness returns how long the fleet's workers take to their requests' first tokens
// against CostTTFT's step model: the median of measured / predicted over every worker's
// requests that had nothing queued ahead (Load.Slowness without the worker's own step); 1
// until one is measured. Times the router measures (MeanLifetime) divided by it are in the
// step model's units.
func (t *Tracker) FleetSlowness() float64 { return math.Exp(math.Float64frombits(t.slow.Load())) }

// MeanLifetime returns the mean time, in ms, from a request's booking to its completion, over
// recent completions (an exponentially weighted mean, weight 1/64); 0 before the first, or
// without Now and Expiry. CostTTFT predicts a wait for KV capacity with it.
func (t *Tracker) MeanLifetime() float64 { return math.Float64frombits(t.life.Load()) }

func (t *Tracker) release(b *booking) {
	l := b.load
	l.mu.Lock()
	if !l.gone {
		freed := t.own(l, b, false) + b.out
		l.out -= b.out
		if b.disc != 0 {
			l.discF -= b.disc
			l.storeDisc()
		}
		l.blocks.Add(-freed)
		if !b.prefillDone {
			l.prefill.Add(-b.prefill)
			if b.prefill > 0 {
				l.pending.Add(-1)
			}
		}
		last := len(l.active) - 1
		l.active[b.at], l.active[last].at = l.active[last], b.at
		l.active[last] = nil
		l.active = l.active[:last]
		if last == 0 {
			t.setBusy(l.slot, l.SlownessStep() != 1)
			// Nothing is active, whatever blocks a replica sent that were not chained.
			l.blocks.Store(0)
			l.out, l.discF = 0, 0
			l.disc.Store(0)
		}
		if l.mapped && len(l.active) <= scanRequests/2 {
			l.unmapRefs()
		}
	}
	l.requests.Add(-1)
	l.mu.Unlock()
	if b.stage {
		t.stages.Add(-1)
	} else {
		t.n.Add(-1)
	}
	b.load = nil
	t.pool.Put(b)
}

// Expire completes every request whose deadline is before now and returns how many it freed.
// Call it periodically; it walks all active requests.
func (t *Tracker) Expire(now int64) int {
	var old []*booking
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		old = old[:0]
		sh.mu.Lock()
		for h, b := range sh.m {
			if b.deadline < now {
				delete(sh.m, h)
				old = append(old, b)
			}
		}
		sh.mu.Unlock()
		for _, b := range old {
			t.release(b)
		}
		n += len(old)
	}
	return n
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// lockBooking returns the booking of id with its worker's lock and its request shard's lock
// held, in that order (the order Book takes them); nil with neither held if id is not booked.
// The caller unlocks both.
func (t *Tracker) lockBooking(id string) (*booking, *reqShard) {
	sh, h := t.shard(id)
	for {
		sh.mu.Lock()
		b := findLocked(sh, h, id)
		if b == nil {
			sh.mu.Unlock()
			return nil, nil
		}
		l := b.load
		sh.mu.Unlock()
		// The booking may complete, and its value be reused, while no lock is held: look again
		// with both held.
		l.mu.Lock()
		sh.mu.Lock()
		if b2 := findLocked(sh, h, id); b2 == b && b.load == l {
			return b, sh
		}
		sh.mu.Unlock()
		l.mu.Unlock()
	}
}

// Generated records that request id has generated n output tokens in all, and returns how many
// output blocks that added: one each time ⌈(prompt + n) / block size⌉ passes the count already
// booked (Dynamo's router_track_output_blocks, which counts a block at each boundary a stream
// crosses). With an expected output length each call also weighs the request's own blocks by
// max(0, 1 − n/expected), as OutputBlock does. A request booked without output tracking, or a
// count that does not pass a boundary, changes nothing. It allocates nothing.
func (t *Tracker) Generated(id string, n int64) (int, error) {
	b, sh := t.lockBooking(id)
	if b == nil {
		return 0, ErrUnknownRequest
	}
	l := b.load
	defer l.mu.Unlock()
	defer sh.mu.Unlock()
	o := b.output
	if o.BlockSize <= 0 || n <= 0 {
		return 0, nil
	}
	total := ceilDiv(max(o.ISL, 0)+n, int64(o.BlockSize))
	grown := total - b.tokBlock
	if grown <= 0 {
		return 0, nil
	}
	b.tokBlock = total
	t.addOutputLocked(l, b, grown)
	if o.Expected > 0 {
		t.decayLocked(l, b, max(0, 1-float64(n)/float64(o.Expected)))
	}
	return int(grown), nil
}

// OutputBlock adds one output block to request id, and with hasDecay weighs the blocks of the
// request no other active request uses (its output blocks and the end of its prompt that is
// its own) by decay, a fraction in [0, 1]: Dynamo's add_output_block(decay_fraction), for a
// caller that counts blocks itself (the selection service's /reservations/{id}/output_block).
func (t *Tracker) OutputBlock(id string, decay float64, hasDecay bool) error {
	if hasDecay && !(decay >= 0 && decay <= 1) {
		return errors.New("scoring: decay fraction must be between 0.0 and 1.0")
	}
	b, sh := t.lockBooking(id)
	if b == nil {
		return ErrUnknownRequest
	}
	l := b.load
	defer l.mu.Unlock()
	defer sh.mu.Unlock()
	t.addOutputLocked(l, b, 1)
	if hasDecay {
		t.decayLocked(l, b, decay)
	}
	return nil
}

// addOutputLocked books n output blocks of b on l. Output blocks are the request's own: no
// other request shares them. REQUIRES l.mu.
func (t *Tracker) addOutputLocked(l *Load, b *booking, n int64) {
	b.out += n
	if l.gone {
		return
	}
	l.out += n
	l.blocks.Add(n)
}

// decayLocked weighs b's own blocks by frac: its output blocks and the prompt blocks no other
// active request uses, counted now. Dynamo marks the same blocks fractional in its block
// tracker; a block that another request starts to share afterwards keeps its weight there and
// here alike, until the request that set it completes. REQUIRES l.mu.
func (t *Tracker) decayLocked(l *Load, b *booking, frac float64) {
	if l.gone {
		return
	}
	own := b.out
	if len(b.seqs) > 0 {
		if l.mapped {
			for _, s := range b.seqs {
				if c, ok := l.refs.Get(s); ok && c == 1 {
					own++
				}
			}
		} else {
			own += int64(len(b.seqs) - l.longestShared(b.seqs, b))
		}
	}
	d := (1 - frac) * float64(own)
	l.discF += d - b.disc
	b.disc = d
	l.storeDisc()
}

// storeDisc publishes discF rounded so that ActiveBlocks, blocks − disc, is the active weight
// rounded half away from zero, as Dynamo's round(): for an integer x, round(x − d) =
// x − ⌈d − ½⌉. REQUIRES l.mu.
func (l *Load) storeDisc() {
	if l.discF < 1e-9 {
		l.discF = 0 // what floating point leaves of sums that cancel
	}
	l.disc.Store(int64(math.Ceil(l.discF - 0.5)))
}
