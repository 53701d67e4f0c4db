package shard

import (
	"errors"
	"runtime"
	"sync"

	"github.com/kvrouterd/kvrouterd/radix"
)

var (
	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("shard: set closed")
	// ErrQueueFull is returned by TryEnqueue when the worker's shard has no room.
	ErrQueueFull = errors.New("shard: queue full")
)

// Config configures a Set.
type Config struct {
	// Shards is the number of shard goroutines; ≤ 0 means runtime.GOMAXPROCS(0).
	Shards int
	// QueueLen is how many batches a shard's queue holds before Enqueue waits; ≤ 0 means 256.
	QueueLen int
	// MaxBlocks bounds the residencies ((block, worker) pairs) held over all shards; 0 means no
	// limit. At the limit stored blocks are skipped with status OverBudget (counted, reported);
	// removals and clears still apply, and stores resume once there is room. Scores stay exact
	// lower bounds: a skipped block ends its worker's chain there, and later blocks chained onto
	// it are refused as UnknownParent.
	MaxBlocks int64
	// Evict, with MaxBlocks, makes room at the limit instead of skipping: a shard whose store
	// finds the budget spent drops residencies of its own, from the rank (and storage tier) that
	// holds the most, its least recently matched blocks first (blocks sought from random places
	// of the rank's engine map, each spared if a match marked it since the marks were last
	// cleared; the model's index must track matches, radix.Index.TrackMatches). A shard with
	// nothing of its own to drop skips as without Evict.
	Evict bool
	// Observer, if set, receives every anomalous outcome.
	Observer Observer
	// ClearOnGap sets Applier.ClearOnGap on every shard.
	ClearOnGap bool
	// KeepTree sets Applier.KeepTree on every shard.
	KeepTree bool
}

// Set is the event-application stage: N shard goroutines, each the only writer of the workers it
// owns. A worker belongs to one shard for life (by a hash of its id), so its events apply in the
// order they were enqueued. Each shard has a bounded queue: a producer that outruns it waits in
// Enqueue. All methods are safe for concurrent use.
type Set struct {
	shards []*shard
	budget *budget
	// free recycles applied batches with their arenas. A bounded channel rather than a
	// sync.Pool: the garbage collector empties pools, and a steady stream should allocate
	// nothing.
	free chan *Batch
	wg   sync.WaitGroup
	// mu is held shared by every send and exclusively by Close, so that nothing can be
	// enqueued behind a shard's stop message and be lost.
	mu     sync.RWMutex
	closed bool // REQUIRES mu
}

type shard struct {
	q chan msg
	a *Applier
	c counters
}

type msgKind uint8

const (
	msgBatch msgKind = iota
	msgBarrier
	msgRemove
	msgCall
	msgStop
)

type msg struct {
	kind   msgKind
	b      *Batch
	worker uint64
	wg     *sync.WaitGroup
	call   func(*Applier)
}

// New starts a Set.
func New(cfg Config) *Set {
	n := cfg.Shards
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	ql := cfg.QueueLen
	if ql <= 0 {
		ql = 256
	}
	s := &Set{budget: newBudget(cfg.MaxBlocks, n), free: make(chan *Batch, n*ql+64)}
	for range n {
		sh := &shard{q: make(chan msg, ql)}
		sh.a = newApplier(s.budget, cfg.Observer, &sh.c)
		sh.a.ClearOnGap = cfg.ClearOnGap
		sh.a.KeepTree = cfg.KeepTree
		sh.a.evict = cfg.Evict && cfg.MaxBlocks > 0
		s.shards = append(s.shards, sh)
	}
	s.wg.Add(n)
	for _, sh := range s.shards {
		go sh.run(s)
	}
	return s
}

// Shards returns the number of shards.
func (s *Set) Shards() int { return len(s.shards) }

// ShardOf returns the shard that owns worker id.
func (s *Set) ShardOf(id uint64) int {
	return int((id * 0x9e3779b97f4a7c15 >> 32) * uint64(len(s.shards)) >> 32)
}

// NewBatch returns an empty batch for worker id of the model whose index is ix.
func (s *Set) NewBatch(ix *radix.Index, id uint64) *Batch {
	var b *Batch
	select {
	case b = <-s.free:
	default:
		b = new(Batch)
	}
	b.Index, b.Worker = ix, id
	return b
}

// Enqueue hands b to its worker's shard, waiting while that shard's queue is full. The caller
// must not touch b afterwards.
func (s *Set) Enqueue(b *Batch) error {
	return s.send(s.ShardOf(b.Worker), msg{kind: msgBatch, b: b}, true)
}

// TryEnqueue is Enqueue without waiting: it returns ErrQueueFull (and the caller keeps b) when
// the shard has no room.
func (s *Set) TryEnqueue(b *Batch) error {
	return s.send(s.ShardOf(b.Worker), msg{kind: msgBatch, b: b}, false)
}

// RemoveWorker enqueues the removal of worker id: after its earlier events apply, all its blocks
// are dropped and its slots freed.
func (s *Set) RemoveWorker(id uint64) error {
	return s.send(s.ShardOf(id), msg{kind: msgRemove, worker: id}, true)
}

// Do runs f on the goroutine of worker id's shard, after everything enqueued for it before, and
// waits for it. f may read and change that shard's state through the Applier.
func (s *Set) Do(id uint64, f func(*Applier)) error {
	var wg sync.WaitGroup
	wg.Add(1)
	if err := s.send(s.ShardOf(id), msg{kind: msgCall, call: f, wg: &wg}, true); err != nil {
		return err
	}
	wg.Wait()
	return nil
}

// Barrier returns once every batch and removal enqueued before it, on every shard, is applied.
func (s *Set) Barrier() error {
	var wg sync.WaitGroup
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	wg.Add(len(s.shards))
	for i := range s.shards {
		s.sendLocked(i, msg{kind: msgBarrier, wg: &wg}, true)
	}
	s.mu.RUnlock()
	wg.Wait()
	return nil
}

func (s *Set) send(i int, m msg, wait bool) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	return s.sendLocked(i, m, wait)
}

// sendLocked REQUIRES s.mu held shared and the set open.
func (s *Set) sendLocked(i int, m msg, wait bool) error {
	sh := s.shards[i]
	select {
	case sh.q <- m:
		return nil
	default:
	}
	if !wait {
		return ErrQueueFull
	}
	sh.c.enqueueWaits.Add(1)
	sh.q <- m
	return nil
}

// Close lets the shards apply everything enqueued before it, stops them and waits for them.
// Later calls return ErrClosed.
func (s *Set) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for _, sh := range s.shards {
		sh.q <- msg{kind: msgStop}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Stats returns the counters summed over all shards.
func (s *Set) Stats() Stats {
	var st Stats
	for _, sh := range s.shards {
		sh.c.addTo(&st)
		st.QueueDepth += int64(len(sh.q))
	}
	return st
}

func (sh *shard) run(s *Set) {
	defer s.wg.Done()
	for m := range sh.q {
		if m.kind == msgStop {
			return
		}
		sh.handle(s, m)
	}
}

func (sh *shard) handle(s *Set, m msg) {
	switch m.kind {
	case msgBatch:
		b := m.b
		for i := range b.events {
			sh.a.Apply(b.Index, b.Worker, &b.events[i])
		}
		sh.c.batches.Add(1)
		if b.Applied != nil {
			b.Applied.Add(int64(len(b.events)))
		}
		b.reset()
		select {
		case s.free <- b:
		default:
		}
	case msgBarrier:
		m.wg.Done()
	case msgRemove:
		sh.a.RemoveWorker(m.worker)
	case msgCall:
		m.call(sh.a)
		m.wg.Done()
	}
}
