package loadgen

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
)

// maxStreamLag is how far behind its schedule the event stream may fall before it gives up the
// batches it missed instead of sending them in a burst: a stream that cannot keep its rate
// reports the rate it kept (Result.EventsApplied), not a burst that measured the catching up.
const maxStreamLag = 2 * time.Millisecond

// filler is the prompts that pad a kvrouterd target's index to Config.Residencies and the event
// stream that churns them; plain data derived from the workload, read-only once built and so
// safe to share between goroutines.
//
// Each filler prompt ("chain") is the system prefix followed by its own blocks, as many as a
// family has after the prefix, and is held whole by two workers (chain c by workers c and c+1,
// modulo the worker count), as a family is. Their blocks are no family's and no request's:
// requests match as they would without the filler, through a larger index. The stream takes the
// (chain, holder) pairs in turn and sends one batch for each: the removal of the chain's last
// tail blocks and their store again, as an engine evicting a prompt's tail and recomputing it.
// A batch applies whole, so the index keeps its size.
type filler struct {
	w       *workload
	chains  int // filler prompts
	holders int // workers that hold each chain: 2, or 1 with one worker
	length  int // blocks of a chain after the system prefix
	tail    int // blocks each stream batch removes and stores again
	base    int // residencies of the workload without filler
}

// newFiller returns the filler that brings w's index to at least residencies, with at least one
// chain when stream is set, so that the stream has something to churn.
func newFiller(w *workload, residencies int, stream bool) *filler {
	f := &filler{w: w, holders: min(2, w.workers), length: w.blocks - w.prefix}
	f.tail = max(f.length/2, 1)
	for i := range w.workers {
		for _, ev := range w.events(i) {
			f.base += len(ev.Hashes)
		}
	}
	per := f.holders * f.length
	f.chains = max(0, (residencies-f.base+per-1)/per)
	if stream {
		f.chains = max(f.chains, 1)
	}
	return f
}

// residencies is how many (block, worker) pairs the index holds once filled.
func (f *filler) residencies() int { return f.base + f.chains*f.holders*f.length }

// holder is worker index k of chain c's holders.
func (f *filler) holder(c, k int) int { return (c + k) % f.w.workers }

// hash is the engine hash of block b (counted after the prefix) of chain c; the top bit keeps
// it apart from the families' (workload.engineHash).
func (f *filler) hash(c, b int) uint64 { return 1<<63 | uint64(c)<<20 | uint64(b) }

// parent is the engine hash of the block before block b of chain c.
func (f *filler) parent(c, b int) uint64 {
	if b == 0 {
		return f.w.engineHash(0, f.w.prefix-1)
	}
	return f.hash(c, b-1)
}

// stored sets ev to the event storing blocks [from, to) of chain c, its hashes and tokens
// written into ev's own slices (reused).
func (f *filler) stored(ev *kvevent.Event, c, from, to int) {
	bs := f.w.bs
	*ev = kvevent.Event{Kind: kvevent.Stored, Hashes: ev.Hashes[:0], Tokens: ev.Tokens[:0], BlockSize: bs,
		Parent: f.parent(c, from), HasParent: true}
	for b := from; b < to; b++ {
		ev.Hashes = append(ev.Hashes, f.hash(c, b))
		for i := range bs {
			// A vocabulary's worth of token ids, as the families'; distinct from theirs by chance only,
			// which 16 tokens of 17 bits make certain enough.
			ev.Tokens = append(ev.Tokens, uint32(mix(uint64(c)<<36|uint64(b)<<18|uint64(i))>>47))
		}
	}
}

// removed sets ev to the event removing blocks [from, to) of chain c, its hashes written into
// ev's own slice.
func (f *filler) removed(ev *kvevent.Event, c, from, to int) {
	*ev = kvevent.Event{Kind: kvevent.Removed, Hashes: ev.Hashes[:0]}
	for b := from; b < to; b++ {
		ev.Hashes = append(ev.Hashes, f.hash(c, b))
	}
}

// mix is SplitMix64's finalizer: a cheap, well-spread function of x.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// fill stores every chain on its holders through r.Ingest, the daemon's event path, and waits
// until the shards applied them.
func (f *filler) fill(r *router.Router) error {
	ev := make([]kvevent.Event, 1)
	for c := range f.chains {
		for k := range f.holders {
			id := workerID(f.holder(c, k))
			f.stored(&ev[0], c, 0, f.length)
			if err := r.Ingest(id, model, ev); err != nil {
				return fmt.Errorf("filler chain %d on worker %d: %w", c, id, err)
			}
		}
	}
	return r.Flush()
}

// streamStats is what a stream did; its fields are written by the stream's goroutine and read by
// anyone.
type streamStats struct {
	batches atomic.Int64 // sent
	skipped atomic.Int64 // given up, the stream being more than maxStreamLag behind
}

// stream sends the churn into r at rate blocks per second, evenly spaced, from now until stop is
// closed, counting what it sent in st; it returns the first error of r.Ingest. It waits on an
// alarm, as the open loop's connections do.
func (f *filler) stream(r *router.Router, rate float64, stop <-chan struct{}, st *streamStats) error {
	per := 2 * f.tail // blocks of a batch
	period := time.Duration(float64(per) * 1e9 / rate)
	start := time.Now()
	a := newAlarm(start, period)
	defer a.stop()
	evs := make([]kvevent.Event, 2)
	pairs := f.chains * f.holders
	var n int // batches sent: the rotation's position
	for j := int64(0); ; j++ {
		select {
		case <-stop:
			return nil
		default:
		}
		sched := start.Add(time.Duration(j) * period)
		if lag := time.Since(sched); lag > maxStreamLag {
			skip := int64(lag / period)
			st.skipped.Add(skip)
			j += skip
			sched = start.Add(time.Duration(j) * period)
		}
		if err := a.waitUntil(sched); err != nil {
			return err
		}
		c, k := n%f.chains, n/f.chains%f.holders
		n = (n + 1) % pairs
		f.removed(&evs[0], c, f.length-f.tail, f.length)
		f.stored(&evs[1], c, f.length-f.tail, f.length)
		if err := r.Ingest(workerID(f.holder(c, k)), model, evs); err != nil {
			return fmt.Errorf("event stream, chain %d on worker %d: %w", c, workerID(f.holder(c, k)), err)
		}
		st.batches.Add(1)
	}
}
