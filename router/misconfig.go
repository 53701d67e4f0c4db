package router

import (
	"fmt"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

// Misconfiguration: a worker whose engine hashes blocks of another size than the router does
// for its model gets no cache credit — every match misses — and would route on load alone in
// silence. The router notices it on the first batch such a worker publishes, counts it per
// worker, lists it in Workers and logs one line that names the setting to fix.
//
// Other disagreements cannot be seen in the events themselves: the router hashes a stored
// block's token ids and a request's the same way, so an engine's own hash seed does not matter,
// but a request naming its LoRA adapter otherwise than the engine does, or a gateway sending
// block hashes computed another way, matches nothing the worker holds. Those are found by their
// effect: one request in Config.HitSample notes which workers hold some of its blocks, and a
// worker holding many blocks that none of Config.ZeroHits such requests found, while they found
// other workers' blocks, is listed with a zero-hit problem until a request finds its blocks.

// misconfig is what a registration records of its engine's settings disagreeing with the
// router's. Its fields are atomics, read by listings without a lock.
type misconfig struct {
	// engineBlockSize is the block size the engine publishes with, when it differs from the
	// model's; 0 while none differed.
	engineBlockSize atomic.Int64
	// blockSizeEvents counts the stored events refused for it.
	blockSizeEvents atomic.Int64

	// hits counts the sampled requests that found some of the worker's blocks, once per rank.
	hits atomic.Int64
	// unmatched is the number of sampled requests that found other workers' blocks of its model
	// and none of its own since its last hit, while it held at least Config.ZeroHitBlocks
	// blocks; zeroHits is true while that is at least Config.ZeroHits. Written by checkHits.
	unmatched atomic.Int64
	zeroHits  atomic.Bool
	seenHits  int64 // hits at the last check (checkHits' own)
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
	var out []string
	if ebs := m.engineBlockSize.Load(); ebs != 0 {
		out = append(out, fmt.Sprintf("block_size: the engine publishes blocks of %d tokens, the model's are %d (%d stored events refused)",
			ebs, bs, m.blockSizeEvents.Load()))
	}
	if m.zeroHits.Load() {
		out = append(out, fmt.Sprintf("zero_hits: none of %d sampled requests that found cached blocks on other workers of the model found any of this worker's; "+
			"requests hash its blocks differently (lora_name, block_hashes computed by a gateway, or the block size)", m.unmatched.Load()))
	}
	return out
}

// noteHits notes a sampled request that found blocks on the ranks of index slots (list's): a
// hit for each one's worker. Called on the route path: it allocates nothing and takes no lock.
func noteHits(m *model, list *workerList, slots []radix.Slot) {
	m.sampledHits.Add(1)
	for _, slot := range slots {
		if int(slot) < len(list.bySlot) {
			if pos := list.bySlot[slot]; pos >= 0 {
				list.ws[pos].reg.mis.hits.Add(1)
			}
		}
	}
}

// checkHits updates every worker's zero-hit state from the hits sampled since the last check,
// and logs a worker's entering and leaving it. Called by the expiry loop, once a second.
func (r *Router) checkHits() {
	if r.approx != nil {
		return // the index is the router's own guess: nothing to learn from it
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range *r.models.Load() {
		total := m.sampledHits.Load()
		elsewhere := total - m.seenSampledHits
		m.seenSampledHits = total
		for _, reg := range m.regs {
			r.checkWorkerHits(reg, elsewhere)
		}
	}
}

// checkWorkerHits is checkHits for one worker, whose model had sampled requests find blocks
// elsewhere since the last check. REQUIRES r.mu.
func (r *Router) checkWorkerHits(reg *registration, elsewhere int64) {
	mis := &reg.mis
	if h := mis.hits.Load(); h != mis.seenHits {
		mis.seenHits = h
		mis.unmatched.Store(0)
		if mis.zeroHits.Swap(false) {
			r.log.Info("worker's cached blocks match requests again", "worker", reg.id, "model", reg.model.name)
		}
		return
	}
	var blocks int64
	for _, w := range reg.ranks {
		blocks += reg.model.ix.Blocks(w.slot)
	}
	if blocks < r.cfg.ZeroHitBlocks {
		return // too little cached to expect a hit
	}
	n := mis.unmatched.Add(elsewhere)
	if n >= r.cfg.ZeroHits && !mis.zeroHits.Swap(true) {
		r.log.Error("worker misconfigured: requests find other workers' cached blocks but never its own, so it gets no cache credit",
			"worker", reg.id, "model", reg.model.name, "cached_blocks", blocks, "sampled_requests", n,
			"fix", "make requests name LoRA adapters as the engine does (lora_name), make a gateway sending block_hashes hash tokens as kvrouterd does (wire/SPEC.md), and check the engine's block size")
	}
}
