package router

import (
	"fmt"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// Misconfiguration: a worker whose engine hashes blocks of another size than the router does
// for its model gets no cache credit — every match misses — and would route on load alone in
// silence. The router notices it on the first batch such a worker publishes, counts it per
// worker, lists it in Workers and logs one line that names the setting to fix.

// misconfig is what a registration records of its engine's settings disagreeing with the
// router's. Its fields are atomics, read by listings without a lock.
type misconfig struct {
	// engineBlockSize is the block size the engine publishes with, when it differs from the
	// model's; 0 while none differed.
	engineBlockSize atomic.Int64
	// blockSizeEvents counts the stored events refused for it.
	blockSizeEvents atomic.Int64
}

// engineBlockSize returns the block size the stored events of evs show the engine uses, if one
// differs from bs: a stated block_size, or the tokens per block of an event whose token count
// is a multiple of its blocks other than bs. 0 when none differs.
func engineBlockSize(evs []kvevent.Event, bs int) int {
	for i := range evs {
		ev := &evs[i]
		if ev.Kind != kvevent.Stored || ev.Tier != kvevent.Device || len(ev.Hashes) == 0 {
			continue
		}
		if ev.BlockSize != 0 && ev.BlockSize != bs {
			return ev.BlockSize
		}
		if n := len(ev.Tokens); n != len(ev.Hashes)*bs && n%len(ev.Hashes) == 0 && n > 0 {
			return n / len(ev.Hashes)
		}
	}
	return 0
}

// noteRefused notes, for a batch of worker's refused, whether its stored events show an engine
// block size other than bs, the model's.
func (r *Router) noteRefused(worker uint64, evs []kvevent.Event, bs int) {
	ebs := engineBlockSize(evs, bs)
	if ebs == 0 {
		return
	}
	r.mu.Lock()
	reg := r.workers[worker]
	r.mu.Unlock()
	if reg != nil {
		r.noteBlockSize(reg, ebs, bs, len(evs))
	}
}

// noteBlockSize records that worker reg's engine publishes blocks of ebs tokens, where its
// model's are bs, for a batch of n events refused, and logs it (the log is rate-limited by the
// daemon's handler).
func (r *Router) noteBlockSize(reg *registration, ebs, bs, n int) {
	reg.mis.blockSizeEvents.Add(int64(n))
	if reg.mis.engineBlockSize.Swap(int64(ebs)) != int64(ebs) {
		r.log.Error("worker misconfigured: its engine publishes KV blocks of another size than its model's, so no request ever matches its cache",
			"worker", reg.id, "model", reg.model.name, "engine_block_size", ebs, "model_block_size", bs,
			"fix", fmt.Sprintf("start the engine with a block size of %d (vLLM --block-size, SGLang --page-size), or register the model with block_size %d", bs, ebs))
	}
}

// Problems returns what is known to be wrong with a worker's configuration, for listings.
func (m *misconfig) problems(bs int) []string {
	if ebs := m.engineBlockSize.Load(); ebs != 0 {
		return []string{fmt.Sprintf("block_size: the engine publishes blocks of %d tokens, the model's are %d (%d stored events refused)",
			ebs, bs, m.blockSizeEvents.Load())}
	}
	return nil
}
