package replay

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/memstat"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/shard"
)

// Defaults of Config.
const (
	// DefaultMaxResidencies bounds a run to 10^7 stored blocks over all groups: a few hundred
	// MiB of index and shard state, and seconds of applying on two cores.
	DefaultMaxResidencies = 10_000_000
	DefaultMatchFor       = 2 * time.Second
	DefaultSizePoints     = 8
)

// queueLen is each shard's queue length (shard.New's default).
const queueLen = 256

// maxSamples bounds the latencies one measurement keeps (16 MiB); a phase ends early when it
// has that many.
const maxSamples = 1 << 21

// Config configures a Run; a plain value whose zero fields take the defaults.
type Config struct {
	// Workers is the fleet size, a multiple of the stream's workers; 0 = the stream's.
	Workers int
	// Shards is the number of shard goroutines; 0 = runtime.GOMAXPROCS(0).
	Shards int
	// MaxResidencies caps the blocks stored over all groups (0 = DefaultMaxResidencies), which
	// bounds the residencies the index can reach; each group replays the longest prefix of the
	// stream whose stored blocks fit in its share.
	MaxResidencies int64
	// MatchFor is how long the match-under-writes phase lasts (0 = DefaultMatchFor); each size
	// point measures for a tenth of it. A measurement also ends once it holds 2^21 latencies.
	MatchFor time.Duration
	// WriteRate is the blocks per second the churn writer aims at while matches are measured:
	// 0 = the recorded fleet's own average (blocks stored and removed over the stream's span)
	// times the groups, the load such a fleet would put on the index; negative = as fast as it
	// can, which on a small machine measures the reader's share of the cores as much as the
	// index.
	WriteRate float64
	// SizePoints is the number of index sizes, geometric in stored blocks, at which match latency
	// is measured while filling: 0 = DefaultSizePoints, negative = none.
	SizePoints int
	Seed       uint64 // picks the queries
	// Progress, if set, receives a line per step.
	Progress io.Writer
}

// Result is what one Run measured; plain data. Rates are per second of wall time.
type Result struct {
	Workers, Shards, Groups int
	// Batches is the number of stream batches each group replayed; Prefix the fraction of the
	// stream's stored blocks they hold (1: the whole stream).
	Batches int
	Prefix  float64

	// Filling, as the shards counted it (all groups).
	Stored, Removed int64
	ApplyTime       time.Duration // first enqueue to drained, checkpoints excluded
	ApplyRate       float64       // (Stored+Removed) / ApplyTime

	// The index once filled.
	Residencies int64 // (block, worker) pairs
	Entries     int64 // distinct blocks

	// Memory once filled, after full collections.
	HeapBytes         int64   // heap in use minus before the index and shards existed
	BytesPerResidency float64 // HeapBytes / Residencies
	PoolBytes         int64   // heap of the shards' recycled batches, not in HeapBytes

	// Match under writes.
	Queries        int // requests the queries were drawn from: those arrived by the prefix's end
	Matches        int // matches measured
	P50, P99, P999 time.Duration
	Lookups        float64 // mean query blocks a match examined
	Holders        float64 // mean workers holding a query's first block
	WriteTarget    float64 // blocks/s the writer aimed at; 0 = as fast as it could
	Written        int64   // blocks the churn writer had applied (stored + removed)
	WriteTime      time.Duration
	WriteRate      float64 // Written / WriteTime

	// Match latency while filling, without writes, at growing index sizes.
	Sizes []SizePoint
}

// SizePoint is match latency at one index size, without concurrent writes.
type SizePoint struct {
	Residencies int64
	Entries     int64
	Matches     int
	P50, P99    time.Duration
}

// run is one Run's state.
type run struct {
	s      *Stream
	cfg    Config
	groups int
	n      int // stream batches each group replays
	ix     *radix.Index
	set    *shard.Set
	ev     kvevent.Event
	rng    *rand.Rand
	lat    []time.Duration
}

func (r *run) logf(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "replay: "+format+"\n", args...)
	}
}

// Run replays s on cfg.Workers workers and measures the index (see the package doc).
func Run(s *Stream, cfg Config) (*Result, error) {
	if cfg.Workers == 0 {
		cfg.Workers = s.workers
	}
	if s.workers < 1 || cfg.Workers < 1 || cfg.Workers%s.workers != 0 {
		return nil, fmt.Errorf("replay: %d workers is not a multiple of the stream's %d", cfg.Workers, s.workers)
	}
	if cfg.Workers > radix.MaxSlots {
		return nil, fmt.Errorf("replay: %d workers, an index holds at most %d", cfg.Workers, radix.MaxSlots)
	}
	if cfg.Shards <= 0 {
		cfg.Shards = runtime.GOMAXPROCS(0)
	}
	if cfg.MaxResidencies <= 0 {
		cfg.MaxResidencies = DefaultMaxResidencies
	}
	if cfg.MatchFor <= 0 {
		cfg.MatchFor = DefaultMatchFor
	}
	if cfg.SizePoints == 0 {
		cfg.SizePoints = DefaultSizePoints
	}
	if len(s.batches) == 0 || len(s.qat) == 0 {
		return nil, fmt.Errorf("replay: the stream has %d event batches and %d queries: nothing to measure", len(s.batches), len(s.qat))
	}
	r := &run{s: s, cfg: cfg, groups: cfg.Workers / s.workers, rng: rand.New(rand.NewPCG(cfg.Seed, 0x7265706c6179))}
	res := &Result{Workers: cfg.Workers, Shards: cfg.Shards, Groups: r.groups}

	per := cfg.MaxResidencies / int64(r.groups)
	n := sort.Search(len(s.batches), func(i int) bool { return s.batches[i].stored > per })
	if n == 0 {
		return nil, fmt.Errorf("replay: %d stored blocks per group (MaxResidencies %d over %d groups) do not hold the stream's first batch",
			per, cfg.MaxResidencies, r.groups)
	}
	res.Batches, r.n = n, n
	res.Prefix = float64(s.batches[n-1].stored) / float64(max(s.stored, 1))
	r.logf("%d workers (%d × the stream's %d), %d shards: each group replays %d of %d batches, %.1f %% of the stream's %d stored blocks (at most %d stored over all groups)",
		cfg.Workers, r.groups, s.workers, cfg.Shards, n, len(s.batches), 100*res.Prefix, s.stored, cfg.MaxResidencies)

	// Allocated before the heap is measured: not the index's memory.
	r.lat = make([]time.Duration, 0, maxSamples)
	before := memstat.HeapInUse()
	ix, err := radix.New(radix.Config{BlockSize: s.blockSize})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	r.ix = ix
	r.set = shard.New(shard.Config{Shards: cfg.Shards, QueueLen: queueLen})
	defer r.set.Close()

	if err := r.fill(res); err != nil {
		return nil, err
	}
	if err := anomalies(r.set.Stats()); err != nil {
		return nil, err
	}
	st := ix.Stats()
	res.Residencies, res.Entries = st.Residencies, st.Entries
	if got := r.set.Stats().Residencies; got != res.Residencies {
		return nil, fmt.Errorf("replay: the shards count %d residencies, the index %d", got, res.Residencies)
	}
	res.ApplyRate = float64(res.Stored+res.Removed) / res.ApplyTime.Seconds()
	r.logf("filled: %d residencies (%d blocks): %d stored + %d removed blocks applied in %v, %.3g blocks/s",
		res.Residencies, res.Entries, res.Stored, res.Removed, res.ApplyTime.Round(time.Millisecond), res.ApplyRate)

	withPool := memstat.HeapInUse()
	r.emptyPool()
	after := memstat.HeapInUse()
	res.HeapBytes, res.PoolBytes = int64(after)-int64(before), int64(withPool)-int64(after)
	if res.Residencies > 0 {
		res.BytesPerResidency = float64(res.HeapBytes) / float64(res.Residencies)
	}
	r.logf("memory: %.1f MiB in use, %.1f B/residency (recycled batches: %.1f MiB more)",
		float64(res.HeapBytes)/(1<<20), res.BytesPerResidency, float64(res.PoolBytes)/(1<<20))

	if err := r.matchUnderWrites(res, n); err != nil {
		return nil, err
	}
	r.logf("match under writes: %d matches of %d requests, p50 %v p99 %v p99.9 %v (%.1f lookups, %.0f holders); writer %.3g blocks/s (aimed at %.3g)",
		res.Matches, res.Queries, res.P50, res.P99, res.P999, res.Lookups, res.Holders, res.WriteRate, res.WriteTarget)

	if err := anomalies(r.set.Stats()); err != nil {
		return nil, err
	}
	return res, nil
}

// fill replays the first r.n batches of the stream in every group, the clock running from the
// first enqueue to drained, stopped at the size points to measure matches.
func (r *run) fill(res *Result) error {
	s, n, rounds := r.s, r.n, r.rounds()
	// stored[t]: blocks stored over all groups by the end of round t.
	stored := make([]int64, rounds)
	var sum int64
	for t := range rounds {
		for g := range r.groups {
			if i := t - r.start(g); i >= 0 && i < n {
				sum += s.batches[i].stored
				if i > 0 {
					sum -= s.batches[i-1].stored
				}
			}
		}
		stored[t] = sum
	}
	var ends []int // rounds after which a size point is measured
	if k := r.cfg.SizePoints; k > 0 {
		for i := k - 1; i >= 0; i-- {
			end := rounds // the last point: everything, removals after the last store included
			if i > 0 {
				target := max(1, sum>>min(i, 62))
				end = min(rounds, 1+sort.Search(rounds, func(t int) bool { return stored[t] >= target }))
			}
			if len(ends) == 0 || end > ends[len(ends)-1] {
				ends = append(ends, end)
			}
		}
	}
	if len(ends) == 0 || ends[len(ends)-1] != rounds {
		ends = append(ends, rounds)
	}
	before := r.set.Stats()
	lo := 0
	for _, hi := range ends {
		t0 := time.Now()
		if err := r.enqueue(lo, hi); err != nil {
			return err
		}
		if err := r.set.Barrier(); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		res.ApplyTime += time.Since(t0)
		lo = hi
		if r.cfg.SizePoints < 0 {
			continue
		}
		st := r.ix.Stats()
		p := SizePoint{Residencies: st.Residencies, Entries: st.Entries}
		// Matching allocates nothing, nor does a daemon's steady state much: a collection of
		// what the filling left behind would run during the measurement and lengthen its tail.
		runtime.GC()
		lead := min(hi, n) - 1 // group 0's last batch, the furthest any group is
		r.measure(r.queriesBy(s.batches[lead].at), r.cfg.MatchFor/10)
		p.Matches = len(r.lat)
		p.P50, p.P99 = quantile(r.lat, 0.5), quantile(r.lat, 0.99)
		res.Sizes = append(res.Sizes, p)
		r.logf("filling: %d residencies (round %d of %d): %d matches, p50 %v p99 %v", p.Residencies, hi, rounds, p.Matches, p.P50, p.P99)
	}
	after := r.set.Stats()
	res.Stored = after.StoredBlocks - before.StoredBlocks
	res.Removed = after.RemovedBlocks - before.RemovedBlocks
	return nil
}

// start returns the round in which group g replays its first batch: the groups start evenly
// spread over the first r.n rounds, so that at any moment they replay different parts of the
// stream, as the replicas of a fleet serve the same traffic at different times.
func (r *run) start(g int) int { return int(int64(g) * int64(r.n) / int64(r.groups)) }

// rounds returns the number of rounds until every group has replayed its r.n batches.
func (r *run) rounds() int { return r.start(r.groups-1) + r.n }

// enqueue hands the batches of rounds [lo, hi) to the shards: in round t, batch t − start(g)
// of every group g that has started and not finished, each copied into a shard batch as
// router.Ingest copies events.
func (r *run) enqueue(lo, hi int) error {
	s := r.s
	for t := lo; t < hi; t++ {
		for g := range r.groups {
			i := t - r.start(g)
			if i < 0 {
				break // neither this group nor later ones have started
			}
			if i >= r.n {
				continue
			}
			b := &s.batches[i]
			sb := r.set.NewBatch(r.ix, uint64(g*s.workers)+uint64(b.worker))
			for e := b.ev0; e < b.ev1; e++ {
				s.fill(&r.ev, e)
				sb.Add(&r.ev)
			}
			if err := r.set.Enqueue(sb); err != nil {
				return fmt.Errorf("replay: %w", err)
			}
		}
	}
	return nil
}

// emptyPool drops the batches the shards keep for reuse (at most Shards × queueLen + 64,
// shard.New's bound): their arenas are queue memory, not the index's.
func (r *run) emptyPool() {
	for range r.cfg.Shards*queueLen + 64 {
		r.set.NewBatch(r.ix, 0)
	}
}

// queriesBy returns how many queries had arrived by at (at least one).
func (r *run) queriesBy(at time.Duration) int {
	return max(1, sort.Search(len(r.s.qat), func(i int) bool { return r.s.qat[i] > at }))
}

// measure matches random queries among the first n for d (or until r.lat is full) and leaves
// the latencies in r.lat, sorted. It returns the lookups and first-block holders summed over the
// matches.
func (r *run) measure(n int, d time.Duration) (lookups, holders int64) {
	var m radix.Match
	for range 100 { // grows m's scratch to the index's size
		r.ix.Match(r.s.query(r.rng.IntN(n)), &m)
	}
	lat := r.lat[:0]
	start := time.Now()
	for len(lat) < cap(lat) {
		q := r.s.query(r.rng.IntN(n))
		t0 := time.Now()
		r.ix.Match(q, &m)
		t1 := time.Now()
		lat = append(lat, t1.Sub(t0))
		lookups += int64(m.Lookups)
		holders += int64(len(m.Slots))
		if t1.Sub(start) >= d {
			break
		}
	}
	slices.Sort(lat)
	r.lat = lat
	return lookups, holders
}

// quantile returns the nearest-rank p-quantile of sorted.
func quantile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted))-1e-9)) - 1 // the epsilon absorbs p's rounding
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// matchUnderWrites measures matches for MatchFor while a writer churns the first n batches'
// blocks that are still held: every churn removes one stored event's blocks and stores them
// again, so the index ends as it began.
func (r *run) matchUnderWrites(res *Result, n int) error {
	s := r.s
	cands, last := s.churnable(n)
	if len(cands) == 0 {
		return errors.New("replay: no stored event of the replayed prefix is still held whole: nothing to churn")
	}
	next := make([]uint64, r.cfg.Workers)
	for i := range next {
		next[i] = last[i%s.workers]
	}
	res.WriteTarget = r.cfg.WriteRate
	if span := s.batches[len(s.batches)-1].at; res.WriteTarget == 0 && span > 0 {
		res.WriteTarget = float64(s.stored+s.removed) / span.Seconds() * float64(r.groups)
	}
	res.WriteTarget = max(res.WriteTarget, 0)
	res.Queries = r.queriesBy(s.batches[n-1].at)
	var stop atomic.Bool
	done := make(chan error, 1)
	runtime.GC() // as before the size points
	before := r.set.Stats()
	start := time.Now()
	go func() {
		var rm, st kvevent.Event
		sent := 0.0
		for k := 0; !stop.Load(); {
			if res.WriteTarget > 0 {
				due := start.Add(time.Duration(sent / res.WriteTarget * 1e9))
				if d := time.Until(due); d > 0 {
					time.Sleep(min(d, 10*time.Millisecond)) // short enough to see stop soon
					continue
				}
			}
			// Round robin over the groups, each at its own place in the list, as in the fill.
			g := k % r.groups
			e := cands[(k/r.groups+g*len(cands)/r.groups)%len(cands)]
			w := uint64(g*s.workers) + uint64(e.worker)
			s.fill(&st, e.event)
			rm = kvevent.Event{Kind: kvevent.Removed, Hashes: st.Hashes}
			next[w-1]++
			rm.ID = next[w-1]
			next[w-1]++
			st.ID = next[w-1]
			b := r.set.NewBatch(r.ix, w)
			b.Add(&rm)
			b.Add(&st)
			if err := r.set.Enqueue(b); err != nil {
				done <- fmt.Errorf("replay: %w", err)
				return
			}
			sent += float64(2 * len(st.Hashes))
			k++
		}
		done <- nil
	}()
	lookups, holders := r.measure(res.Queries, r.cfg.MatchFor)
	stop.Store(true)
	if err := <-done; err != nil {
		return err
	}
	if err := r.set.Barrier(); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	res.WriteTime = time.Since(start)
	after := r.set.Stats()
	res.Written = after.StoredBlocks - before.StoredBlocks + after.RemovedBlocks - before.RemovedBlocks
	res.WriteRate = float64(res.Written) / res.WriteTime.Seconds()
	res.Matches = len(r.lat)
	res.P50, res.P99, res.P999 = quantile(r.lat, 0.5), quantile(r.lat, 0.99), quantile(r.lat, 0.999)
	res.Lookups = float64(lookups) / float64(res.Matches)
	res.Holders = float64(holders) / float64(res.Matches)
	if got := r.ix.Stats().Residencies; got != res.Residencies {
		return fmt.Errorf("replay: %d residencies after churning, %d before", got, res.Residencies)
	}
	return nil
}

// churn is a stored event of the stream (by index) whose blocks and parent a worker still
// holds at the end of the replayed prefix.
type churn struct {
	event  int
	worker uint32
}

// churnable returns the stored events of the first n batches whose blocks are all still held
// after them, with their parent, and the last event id of every stream worker there.
func (s *Stream) churnable(n int) ([]churn, []uint64) {
	owner := make([]map[uint64]int, s.workers) // per worker: engine hash → event that stored it
	for i := range owner {
		owner[i] = make(map[uint64]int)
	}
	evEnd := s.batches[n-1].ev1
	held := make([]int32, evEnd)
	last := make([]uint64, s.workers)
	for _, b := range s.batches[:n] {
		own := owner[b.worker-1]
		for i := b.ev0; i < b.ev1; i++ {
			e := &s.events[i]
			if e.id != 0 {
				last[b.worker-1] = e.id
			}
			switch e.kind {
			case kvevent.Stored:
				for _, h := range s.hashes[e.h0:e.h1] {
					if o, ok := own[h]; ok {
						held[o]--
					}
					own[h] = i
					held[i]++
				}
			case kvevent.Removed:
				for _, h := range s.hashes[e.h0:e.h1] {
					if o, ok := own[h]; ok {
						held[o]--
						delete(own, h)
					}
				}
			case kvevent.Cleared:
				for _, o := range own {
					held[o]--
				}
				clear(own)
			}
		}
	}
	var cands []churn
	for _, b := range s.batches[:n] {
		own := owner[b.worker-1]
		for i := b.ev0; i < b.ev1; i++ {
			e := &s.events[i]
			if e.kind != kvevent.Stored || int(held[i]) != e.h1-e.h0 {
				continue
			}
			if _, ok := own[e.parent]; e.hasParent && !ok {
				continue
			}
			cands = append(cands, churn{event: i, worker: b.worker})
		}
	}
	return cands, last
}

// anomalies returns an error if any event was not applied in full: a faithful replay has none,
// and a number measured on a partly refused stream would mislead.
func anomalies(st shard.Stats) error {
	bad := st.Gaps
	for i, n := range st.ByStatus {
		if shard.Status(i) != shard.OK {
			bad += n
		}
	}
	if bad != 0 {
		return fmt.Errorf("replay: %d events not applied in full or out of order: %+v", bad, st)
	}
	return nil
}

// Quick returns cfg with the quick settings in the fields it leaves at their defaults: a
// half-second match phase and at most 2·10^6 stored blocks.
func Quick(cfg Config) Config {
	if cfg.MatchFor == 0 {
		cfg.MatchFor = 500 * time.Millisecond
	}
	if cfg.MaxResidencies == 0 {
		cfg.MaxResidencies = 2_000_000
	}
	return cfg
}
