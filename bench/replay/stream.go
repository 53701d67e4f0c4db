package replay

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/fleet"
	"github.com/kvrouterd/kvrouterd/bench/trace"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

// ErrUnsupported is wrapped by Record's error for an event a Stream cannot hold.
var ErrUnsupported = errors.New("replay: unsupported event")

// Stream is the KV event stream of a small simulated fleet, in delivery order, and the queries
// of its trace. Read-only once Record returns; safe for concurrent use.
//
// Events are held as offsets into pointer-free arenas, so that a stream of millions of events
// costs the garbage collector nothing to scan and no superseded arena stays pinned. A stored
// event's tokens are not copied when they are a run of one request's prompt blocks, which is
// how a worker stores them: the event points into the request's tokens instead, halving the
// memory of a long trace's stream.
type Stream struct {
	blockSize int
	workers   int // ids 1..workers
	batches   []batch
	events    []event
	hashes    []uint64 // engine hashes of all events
	tokens    []uint32 // tokens of the stored events not found in the requests
	stored    int64
	removed   int64
	copied    int64 // stored blocks whose tokens are in s.tokens

	// Query i is the sequence hashes qseqs[qoff[i]:qoff[i+1]] of request qreq[i], which
	// arrived at qat[i] (ascending).
	reqs  []trace.Request
	qseqs []uint64
	qoff  []int
	qreq  []int32
	qat   []time.Duration
	// bySeq finds a prompt block by sequence hash while recording.
	bySeq []blockRef

	sim *fleet.Result
}

// batch is one worker's event batch: events[ev0:ev1].
type batch struct {
	at       time.Duration
	worker   uint32
	ev0, ev1 int
	stored   int64 // stored blocks of batches [0, this one], cumulative
}

// event is a kvevent.Event of rank 0, device tier, base model: hashes[h0:h1] and, for a stored
// event, (h1-h0)·blockSize tokens from t0 in the prompt of query src, or in s.tokens when src
// is -1.
type event struct {
	kind      kvevent.Kind
	hasParent bool
	src       int32
	id        uint64
	parent    uint64
	h0, h1    int
	t0        int
}

// blockRef names block blk of query q's prompt by its sequence hash.
type blockRef struct {
	seq    uint64
	q, blk int32
}

// Record replays reqs on a simulated fleet configured by cfg (fleet.Run) and returns the
// event stream its workers published, and reqs as queries. The stream keeps reqs' tokens (which
// nobody may write, as package trace says). cfg.OnEvents, if set, is still called. Events must
// be of rank 0 and the device tier, without LoRA adapter or multimodal hashes, as bench/sim
// publishes them.
func Record(reqs []trace.Request, cfg fleet.Config) (*Stream, error) {
	if len(reqs) > 1<<31-1 {
		return nil, fmt.Errorf("replay: %d requests, at most 2^31-1", len(reqs))
	}
	bs := cfg.Worker.BlockSize
	if bs == 0 {
		bs = 64 // fleet.Run's default
	}
	s := &Stream{blockSize: bs, workers: cfg.Workers}
	s.addQueries(reqs)
	defer func() { s.bySeq = nil }()
	var bad error
	user := cfg.OnEvents
	cfg.OnEvents = func(at time.Duration, worker uint64, evs []kvevent.Event) {
		if user != nil {
			user(at, worker, evs)
		}
		if bad == nil {
			bad = s.add(at, worker, evs)
		}
	}
	res, err := fleet.Run(cfg, reqs)
	if err != nil {
		return nil, fmt.Errorf("replay: recording: %w", err)
	}
	s.sim = res
	if bad != nil {
		return nil, bad
	}
	return s, nil
}

// add appends a copy of one batch.
func (s *Stream) add(at time.Duration, worker uint64, evs []kvevent.Event) error {
	if worker < 1 || worker > uint64(s.workers) {
		return fmt.Errorf("%w: worker %d of %d", ErrUnsupported, worker, s.workers)
	}
	b := batch{at: at, worker: uint32(worker), ev0: len(s.events)}
	if n := len(s.batches); n > 0 {
		b.stored = s.batches[n-1].stored
	}
	for i := range evs {
		ev := &evs[i]
		switch {
		case ev.Rank != 0, ev.Tier != kvevent.Device, ev.LoRA != "", ev.MM != nil:
			return fmt.Errorf("%w: worker %d event %d: rank %d, tier %v, lora %q, multimodal %t",
				ErrUnsupported, worker, ev.ID, ev.Rank, ev.Tier, ev.LoRA, ev.MM != nil)
		case ev.Kind == kvevent.Stored && (ev.BlockSize != 0 && ev.BlockSize != s.blockSize || len(ev.Tokens) != len(ev.Hashes)*s.blockSize):
			return fmt.Errorf("%w: worker %d event %d: %d tokens for %d blocks of %d (stated %d)",
				ErrUnsupported, worker, ev.ID, len(ev.Tokens), len(ev.Hashes), s.blockSize, ev.BlockSize)
		}
		e := event{kind: ev.Kind, hasParent: ev.HasParent, id: ev.ID, parent: ev.Parent, h0: len(s.hashes), src: -1}
		s.hashes = append(s.hashes, ev.Hashes...)
		e.h1 = len(s.hashes)
		switch ev.Kind {
		case kvevent.Stored:
			if e.src, e.t0 = s.find(ev); e.src < 0 {
				e.t0 = len(s.tokens)
				s.tokens = append(s.tokens, ev.Tokens...)
				s.copied += int64(len(ev.Hashes))
			}
			b.stored += int64(len(ev.Hashes))
			s.stored += int64(len(ev.Hashes))
		case kvevent.Removed:
			s.removed += int64(len(ev.Hashes))
		}
		s.events = append(s.events, e)
	}
	b.ev1 = len(s.events)
	s.batches = append(s.batches, b)
	return nil
}

// addQueries hashes the requests' prompts into queries and indexes their blocks in s.bySeq.
func (s *Stream) addQueries(reqs []trace.Request) {
	var h radix.Hasher
	s.reqs = reqs
	s.qoff = append(s.qoff, 0)
	for i := range reqs {
		if len(reqs[i].Tokens) < s.blockSize {
			continue // no full block: nothing to match
		}
		s.qseqs = h.AppendSequence(s.qseqs, reqs[i].Tokens, s.blockSize, radix.BaseSeed)
		s.qoff = append(s.qoff, len(s.qseqs))
		s.qreq = append(s.qreq, int32(i))
		s.qat = append(s.qat, reqs[i].At)
	}
	s.bySeq = make([]blockRef, 0, len(s.qseqs))
	for q := range s.qat {
		for blk, seq := range s.query(q) {
			s.bySeq = append(s.bySeq, blockRef{seq: seq, q: int32(q), blk: int32(blk)})
		}
	}
	slices.SortFunc(s.bySeq, func(a, b blockRef) int { return cmp.Compare(a.seq, b.seq) })
}

// find returns where a stored event's tokens are in a request's prompt: the query and the
// token offset, or -1. bench/sim names a block by the sequence hash of the prompt prefix it
// ends, so the event's last engine hash names a request whose prompt holds the event's blocks
// right before it; the tokens are compared all the same.
func (s *Stream) find(ev *kvevent.Event) (int32, int) {
	n := len(ev.Hashes)
	last := ev.Hashes[n-1]
	i, ok := slices.BinarySearchFunc(s.bySeq, last, func(r blockRef, seq uint64) int { return cmp.Compare(r.seq, seq) })
	if !ok {
		return -1, 0
	}
	r := s.bySeq[i]
	t0 := (int(r.blk) + 1 - n) * s.blockSize
	if t0 < 0 {
		return -1, 0
	}
	if !slices.Equal(s.reqs[s.qreq[r.q]].Tokens[t0:t0+n*s.blockSize], ev.Tokens) {
		return -1, 0
	}
	return r.q, t0
}

// fill sets ev to event i of the stream, its slices aliasing the stream's arenas (shard.Batch.Add
// copies them).
func (s *Stream) fill(ev *kvevent.Event, i int) {
	e := &s.events[i]
	*ev = kvevent.Event{Kind: e.kind, ID: e.id, Hashes: s.hashes[e.h0:e.h1:e.h1]}
	if e.kind == kvevent.Stored {
		ev.Parent, ev.HasParent, ev.BlockSize = e.parent, e.hasParent, s.blockSize
		src := s.tokens
		if e.src >= 0 {
			src = s.reqs[s.qreq[e.src]].Tokens
		}
		t1 := e.t0 + (e.h1-e.h0)*s.blockSize
		ev.Tokens = src[e.t0:t1:t1]
	}
}

// query returns query i's sequence hashes.
func (s *Stream) query(i int) []uint64 { return s.qseqs[s.qoff[i]:s.qoff[i+1]] }

// StreamStats describes a Stream; plain data.
type StreamStats struct {
	Workers   int   // workers of the recorded fleet
	BlockSize int   // tokens per block
	Batches   int   // event batches
	Events    int   // events
	Stored    int64 // blocks stored, over all events
	Removed   int64 // blocks removed
	Copied    int64 // stored blocks whose tokens the stream holds (others point into the requests)
	Queries   int   // requests with at least one full block
	Span      time.Duration
}

// Stats describes s.
func (s *Stream) Stats() StreamStats {
	st := StreamStats{Workers: s.workers, BlockSize: s.blockSize, Batches: len(s.batches), Events: len(s.events),
		Stored: s.stored, Removed: s.removed, Copied: s.copied, Queries: len(s.qat)}
	if n := len(s.batches); n > 0 {
		st.Span = s.batches[n-1].at
	}
	return st
}

// Fleet returns what the recording simulation measured (its hit rate, the blocks each worker
// held at the end).
func (s *Stream) Fleet() *fleet.Result { return s.sim }

// Blocks returns the number of blocks stored over the whole stream.
func (s *Stream) Blocks() int64 { return s.stored }
