package loadgen

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// model is the model every benchmark worker serves.
const model = "bench"

// tailBit is set in every token of a request's random tail and in no prompt token, so that the
// changed tail never matches the index by chance and the cached depth is exactly the one drawn.
const tailBit = 1 << 31

// workload is the prompts of one run and which worker holds which of their blocks: plain data
// derived from the seed, read-only once built and so safe to share between goroutines.
type workload struct {
	workers, blocks, bs int
	prefix              int        // blocks of the system prefix every worker holds and every prompt starts with
	partial             int        // blocks of a family held by a worker that holds no family whole
	minDepth            int        // a request keeps at least this many of its family's blocks
	families            [][]uint32 // each family's prompt, blocks × bs tokens
}

func newWorkload(c *Config) *workload {
	w := &workload{
		workers:  c.Workers,
		blocks:   c.Blocks,
		bs:       c.BlockSize,
		prefix:   c.Blocks / 8,
		partial:  c.Blocks / 2,
		minDepth: c.Blocks * 3 / 4,
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x70726f6d707473))
	n := c.Blocks * c.BlockSize
	sys := make([]uint32, w.prefix*w.bs)
	for i := range sys {
		sys[i] = rng.Uint32N(1 << 17) // a vocabulary's worth of token ids, well below tailBit
	}
	w.families = make([][]uint32, c.Prompts)
	for p := range w.families {
		t := make([]uint32, n)
		copy(t, sys)
		for i := len(sys); i < n; i++ {
			t[i] = rng.Uint32N(1 << 17)
		}
		w.families[p] = t
	}
	return w
}

// workerID is the registered id of worker index i; ids start at 1 so that 0 never looks valid.
func workerID(i int) uint64 { return uint64(i) + 1 }

// holders are the worker indexes that hold family p whole.
func (w *workload) holders(p int) (int, int) {
	return p % w.workers, (p + 1) % w.workers
}

// holdings lists the families worker i holds whole, and the family whose first w.partial blocks
// it holds (-1 when it holds one whole: then every worker holds data).
func (w *workload) holdings(i int) (full []int, partial int) {
	for p := range w.families {
		if a, b := w.holders(p); a == i || b == i {
			full = append(full, p)
		}
	}
	if len(full) > 0 {
		return full, -1
	}
	return nil, i % len(w.families)
}

// engineHash is the engine's hash of block b of family p. Prefix blocks have the same hash in
// every family because they hold the same tokens, as an engine's content hash would.
func (w *workload) engineHash(p, b int) uint64 {
	if b < w.prefix {
		return uint64(b) + 1
	}
	return uint64(p+1)<<32 | uint64(b)
}

// events are worker i's stored events: the prefix, then each family it holds chained onto the
// prefix's last block. They are unnumbered (ID 0) so that a rerun against the same external
// kvrouterd is not a stream of duplicate ids.
func (w *workload) events(i int) []kvevent.Event {
	evs := []kvevent.Event{w.stored(0, 0, w.prefix)}
	full, partial := w.holdings(i)
	for _, p := range full {
		evs = append(evs, w.stored(p, w.prefix, w.blocks))
	}
	if partial >= 0 {
		evs = append(evs, w.stored(partial, w.prefix, w.partial))
	}
	return evs
}

// stored is the event storing blocks [from, to) of family p.
func (w *workload) stored(p, from, to int) kvevent.Event {
	ev := kvevent.Event{
		Kind:      kvevent.Stored,
		Hashes:    make([]uint64, 0, to-from),
		Tokens:    w.families[p][from*w.bs : to*w.bs],
		BlockSize: w.bs,
	}
	for b := from; b < to; b++ {
		ev.Hashes = append(ev.Hashes, w.engineHash(p, b))
	}
	if from > 0 {
		ev.Parent, ev.HasParent = w.engineHash(p, from-1), true
	}
	return ev
}

// setup registers the workers and posts their events through c, then checks with a match that the
// index holds what it should: a family's whole prompt on its holders and the prefix everywhere.
func (w *workload) setup(c *client.Client) error {
	for i := range w.workers {
		if err := c.Register(client.Worker{ID: workerID(i), Model: model, BlockSize: w.bs}); err != nil {
			return fmt.Errorf("register worker %d: %w", workerID(i), err)
		}
	}
	for i := range w.workers {
		evs := w.events(i)
		res, err := c.Events(&wire.EventBatch{Worker: workerID(i), Model: model, Events: evs})
		if err != nil {
			return fmt.Errorf("events of worker %d: %w", workerID(i), err)
		}
		if res.OK != len(evs) {
			return fmt.Errorf("events of worker %d: %d of %d applied cleanly: %+v", workerID(i), res.OK, len(evs), res.Outcomes)
		}
	}
	var resp wire.RouteResponse
	if err := c.Match(&wire.RouteRequest{Model: model, Tokens: w.families[0]}, &resp); err != nil {
		return fmt.Errorf("check match: %w", err)
	}
	if len(resp.Candidates) != w.workers {
		return fmt.Errorf("check match: %d candidates, want %d workers", len(resp.Candidates), w.workers)
	}
	a, b := w.holders(0)
	for _, cd := range resp.Candidates {
		want := w.prefix
		if cd.Worker == workerID(a) || cd.Worker == workerID(b) {
			want = w.blocks
		}
		if int(cd.CachedBlocks) < want {
			return fmt.Errorf("check match: worker %d has %d blocks of family 0 cached, want at least %d", cd.Worker, cd.CachedBlocks, want)
		}
	}
	return nil
}

// teardown unregisters the workers, so that an external kvrouterd is left as it was found.
func (w *workload) teardown(c *client.Client) error {
	for i := range w.workers {
		if err := c.Unregister(workerID(i)); err != nil {
			return fmt.Errorf("unregister worker %d: %w", workerID(i), err)
		}
	}
	return nil
}

// prompt writes into dst a request for a random family with a random tail changed, and returns it
// with the number of the family's blocks it keeps.
func (w *workload) prompt(rng *rand.Rand, dst []uint32) ([]uint32, int) {
	f := w.families[rng.IntN(len(w.families))]
	depth := w.minDepth + rng.IntN(w.blocks-w.minDepth+1)
	dst = append(dst[:0], f...)
	for i := depth * w.bs; i < len(dst); i++ {
		dst[i] = tailBit | rng.Uint32N(1<<17)
	}
	return dst, depth
}
