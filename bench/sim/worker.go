package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
)

var (
	// ErrEmptyPrompt: a request without prompt tokens.
	ErrEmptyPrompt = errors.New("sim: request has an empty prompt")
	// ErrTooLarge: a request whose prompt and output could not fit even in an empty cache.
	ErrTooLarge = errors.New("sim: request does not fit in the worker's KV cache")
)

// WorkerConfig sizes a Worker. It is a plain value; zero fields take the defaults of Dynamo's
// mocker (DefaultWorkerConfig).
type WorkerConfig struct {
	Blocks           int    // KV capacity in blocks (default 16384)
	BlockSize        int    // tokens per block (default 64)
	MaxSeqs          int    // max running sequences (default 256)
	MaxBatchedTokens int    // max tokens per step: prefill chunks + 1 per decoding sequence (default 8192)
	Timing           Timing // step-time model (default DefaultTiming(); the zero Timing means default)

	// HostBlocks, if > 0, gives the worker a host-memory tier of that many blocks: device
	// blocks evicted from the cache are copied into it (an LRU; Stored and Removed events of
	// kvevent.Host), and a request whose cached prefix continues there reloads those blocks
	// instead of computing them. 0: no host tier.
	HostBlocks int
	// HostReload is the time to reload one block from the host tier, added to the step that
	// admits the request (the load precedes the forward pass, as vLLM's KV connectors load
	// synchronously). 0: HostReloadTime(BlockSize, KVBytesPerToken, HostBandwidth).
	HostReload time.Duration
	// TimingBlocks is the capacity the timing model's KV usage u is a fraction of (0: Blocks,
	// as in Dynamo's mocker). The model was fitted on one GPU: its decode time grows with the
	// KV a step reads, so a cache made larger than the GPU it models would, with u a fraction
	// of its own size, decode faster for the same sequences. Set to the fitted capacity (the
	// default 16,384 blocks), a larger cache is timed as that GPU, u capped at 1: the cache's
	// size then changes hits only. The report shows both (docs/decisions.md).
	TimingBlocks int
}

// DefaultWorkerConfig returns the defaults of Dynamo's mocker: 16384 blocks of 64 tokens, 256
// sequences, 8192 batched tokens, DefaultTiming.
func DefaultWorkerConfig() WorkerConfig {
	return WorkerConfig{Blocks: 16384, BlockSize: 64, MaxSeqs: 256, MaxBatchedTokens: 8192, Timing: DefaultTiming()}
}

func (c WorkerConfig) withDefaults() WorkerConfig {
	d := DefaultWorkerConfig()
	if c.Blocks <= 0 {
		c.Blocks = d.Blocks
	}
	if c.BlockSize <= 0 {
		c.BlockSize = d.BlockSize
	}
	if c.MaxSeqs <= 0 {
		c.MaxSeqs = d.MaxSeqs
	}
	if c.MaxBatchedTokens <= 0 {
		c.MaxBatchedTokens = d.MaxBatchedTokens
	}
	if c.Timing == (Timing{}) {
		c.Timing = d.Timing
	}
	if c.HostBlocks < 0 {
		c.HostBlocks = 0
	}
	if c.HostBlocks > 0 && c.HostReload <= 0 {
		c.HostReload = HostReloadTime(c.BlockSize, KVBytesPerToken, HostBandwidth)
	}
	return c
}

// Request is one inference request. The worker keeps Tokens (not a copy) until the request
// completes: the caller must not modify it before then.
type Request struct {
	ID     uint64
	Tokens []uint32 // the prompt
	Output int      // tokens to generate; values below 1 count as 1

	// Remote says the prompt's KV was computed by another worker and arrives with the request
	// (disaggregated serving, the decode side of vLLM's KV connectors): at admission the prompt
	// blocks the cache lacks are filled by the transfer and stored (published as Stored events)
	// without computing them, and only the last prompt token is computed, for the first output
	// token's logits, as vLLM's decode worker does once its remote blocks have arrived. The
	// transfer's duration is the caller's to model: the worker admits the request as if its
	// blocks had just arrived.
	Remote bool
	// Hold keeps the request's blocks pinned when it completes, until Release: the prefill side
	// of disaggregated serving, whose blocks wait for the decode worker to read them.
	Hold bool
}

// Done reports a request's progress.
type Done struct {
	ID     uint64
	At     int64 // simulated time, ns: the end of the step
	Cached int   // prompt tokens that were a prefix-cache hit on the device
	Host   int   // prompt tokens reloaded from the host tier (after the Cached ones)
}

// Token is one output token a request emitted in a step, at the step's end.
type Token struct {
	ID uint64
	N  int // the request's output tokens so far, this one included: 1 for the first
}

// StepOutput is what one Step produced. Step resets and refills it; the slices (and the
// slices inside Events) are valid until the next Step with the same StepOutput. Reusing one
// StepOutput across steps makes steady-state steps allocation-free.
type StepOutput struct {
	// Events are the KV events of the step, in order, IDs from 1 up per worker: the batch a real
	// engine would publish after this step.
	Events      []kvevent.Event
	Emitted     []Token // every request that emitted a token in this step, one token each
	PrefillDone []Done  // requests whose prefill finished in this step (first token at At)
	Completed   []Done  // requests that finished in this step

	PrefillTokens int // prompt tokens computed in the step
	DecodeTokens  int // decoding sequences served in the step (first tokens not counted)

	hashes []uint64 // arena of the events' Hashes
	tokens []uint32 // arena of the events' Tokens
	locals []uint64 // arena of the events' Locals
}

func (o *StepOutput) reset() {
	clear(o.Events) // drop references into old arenas
	o.Events = o.Events[:0]
	o.Emitted = o.Emitted[:0]
	o.PrefillDone = o.PrefillDone[:0]
	o.Completed = o.Completed[:0]
	o.PrefillTokens, o.DecodeTokens = 0, 0
	o.hashes = o.hashes[:0]
	o.tokens = o.tokens[:0]
	o.locals = o.locals[:0]
}

// Stats are a worker's cumulative counters.
type Stats struct {
	Submitted, Rejected, Admitted, Completed uint64
	Aborted                                  uint64 // requests removed by Abort
	PromptTokens                             uint64 // prompt tokens of admitted requests
	CachedTokens                             uint64 // of which prefix-cache hits
	StoredBlocks, EvictedBlocks              uint64
	Steps                                    uint64
	RemoteTokens                             uint64 // prompt tokens of Remote requests that arrived computed (not cache hits, not computed here)
	ComputedTokens                           uint64 // prompt tokens computed by prefill steps
	// Host tier: prompt tokens reloaded from it, blocks copied into it and evicted from it.
	HostTokens                          uint64
	HostStoredBlocks, HostEvictedBlocks uint64
	// The steps' time, split into the prefill part (with host reloads) and the decode part of
	// the timing model, in ns: what a fleet's pools would have to be sized for.
	PrefillNs, DecodeNs uint64
}

const none int32 = -1

// block is one KV block slot. A block is free (in Worker.free), private to one sequence
// (ref 1, not stored), or stored: in byHash, pinned by ref running sequences, or in the LRU
// list when ref is 0.
type block struct {
	hash, parent      uint64 // engine hash and parent's engine hash, when stored
	local             uint64 // local hash (tokens only), when stored and the worker has a host tier
	ref               int32
	prev, next        int32 // LRU links
	stored, hasParent bool
}

// seq is a request inside the worker.
type seq struct {
	id        uint64
	tokens    []uint32
	output    int
	hashes    []uint64 // engine hashes of the full prompt blocks
	locals    []uint64 // their local hashes, with a host tier (its Stored events carry them)
	blocks    []int32  // the sequence's KV blocks in order
	maxBlocks int      // blocks it holds when it completes
	stored    int      // blocks[:stored] are stored prompt blocks it pins
	computed  int      // tokens whose KV is computed
	generated int
	cached    int // prompt tokens hit in the cache
	host      int // prompt tokens reloaded from the host tier
	emitted   bool
	remote    bool // Request.Remote
	hold      bool // Request.Hold
}

// Worker is a simulated inference worker. It belongs to one goroutine at a time.
type Worker struct {
	id  uint64
	cfg WorkerConfig

	blocks           []block
	free             []int32 // stack of free block slots
	lruHead, lruTail int32   // least recently used at the head
	lruLen           int
	byHash           map[uint64]int32
	reserved         int // blocks running sequences may still allocate

	running []*seq
	waiting []*seq
	whead   int // waiting[whead:] is the queue
	pool    []*seq
	held    map[uint64]*seq // completed Hold requests, their blocks pinned until Release

	hasher radix.Hasher
	seed   uint64
	nextID uint64 // ID of the last event published

	host   *hostTier // nil without one
	reload int       // blocks reloaded from the host tier in the step under way

	out  *StepOutput // during Step
	recs []eventRec
	st   Stats
}

// eventRec is an event of the step under way; its hashes and tokens are ranges of the output's
// arenas, turned into slices once the arenas stop growing.
type eventRec struct {
	kind      kvevent.Kind
	tier      kvevent.Tier
	h0, h1    int
	t0, t1    int // tokens; for a host Stored event, its locals in the output's arena
	parent    uint64
	hasParent bool
}

// NewWorker returns an idle worker with an empty cache. id is informational (ID).
func NewWorker(id uint64, cfg WorkerConfig) *Worker {
	cfg = cfg.withDefaults()
	w := &Worker{
		id:      id,
		cfg:     cfg,
		blocks:  make([]block, cfg.Blocks),
		free:    make([]int32, cfg.Blocks),
		lruHead: none, lruTail: none,
		byHash: make(map[uint64]int32, cfg.Blocks),
		held:   make(map[uint64]*seq),
		seed:   radix.LoRASeed(""),
	}
	if cfg.HostBlocks > 0 {
		w.host = newHostTier(cfg.HostBlocks)
	}
	// Pop order 0, 1, 2, …: the stack holds the slots in reverse.
	for i := range w.free {
		w.free[i] = int32(cfg.Blocks - 1 - i)
	}
	for i := range w.blocks {
		w.blocks[i].prev, w.blocks[i].next = none, none
	}
	return w
}

// ID returns the id the worker was created with.
func (w *Worker) ID() uint64 { return w.id }

// Config returns the worker's configuration with defaults filled in.
func (w *Worker) Config() WorkerConfig { return w.cfg }

// Stats returns the worker's cumulative counters.
func (w *Worker) Stats() Stats { return w.st }

// Idle reports whether nothing is running or waiting.
func (w *Worker) Idle() bool { return len(w.running) == 0 && w.whead == len(w.waiting) }

// Running returns the number of running sequences.
func (w *Worker) Running() int { return len(w.running) }

// Waiting returns the number of queued requests.
func (w *Worker) Waiting() int { return len(w.waiting) - w.whead }

// Usage returns the fraction of KV blocks in use: held by running sequences or cached.
func (w *Worker) Usage() float64 {
	return float64(w.cfg.Blocks-len(w.free)) / float64(w.cfg.Blocks)
}

// ActiveUsage returns the fraction of KV blocks held by running sequences (cached blocks nobody
// pins excluded). The step-time model uses it, as Dynamo's mocker uses its active blocks.
func (w *Worker) ActiveUsage() float64 {
	return float64(w.cfg.Blocks-len(w.free)-w.lruLen) / float64(w.cfg.Blocks)
}

// timingUsage is the KV usage the step-time model is given: ActiveUsage, or the blocks in use
// as a fraction of TimingBlocks, at most 1.
func (w *Worker) timingUsage() float64 {
	if w.cfg.TimingBlocks <= 0 {
		return w.ActiveUsage()
	}
	return min(1, float64(w.cfg.Blocks-len(w.free)-w.lruLen)/float64(w.cfg.TimingBlocks))
}

// CachedBlocks returns the number of blocks the worker holds (cached or in use) and has
// published as stored.
func (w *Worker) CachedBlocks() int { return len(w.byHash) }

func (w *Worker) blocksFor(tokens int) int {
	return (tokens + w.cfg.BlockSize - 1) / w.cfg.BlockSize
}

// Submit enqueues r at the back of the waiting queue (now is its arrival time; the worker does
// not otherwise use it). It refuses, with an error wrapping ErrEmptyPrompt or ErrTooLarge, a
// request with no prompt tokens or one that needs more than the whole cache; a refused request
// is not queued and will never be reported.
func (w *Worker) Submit(r *Request, now int64) error {
	_ = now
	w.st.Submitted++
	if len(r.Tokens) == 0 {
		w.st.Rejected++
		return fmt.Errorf("%w (request %d)", ErrEmptyPrompt, r.ID)
	}
	output := max(r.Output, 1)
	// The last generated token is sampled, never fed back: its KV is not stored.
	need := w.blocksFor(len(r.Tokens) + output - 1)
	if need > w.cfg.Blocks {
		w.st.Rejected++
		return fmt.Errorf("%w: request %d (%d prompt + %d output tokens) needs %d blocks, capacity %d",
			ErrTooLarge, r.ID, len(r.Tokens), output, need, w.cfg.Blocks)
	}
	var s *seq
	if n := len(w.pool); n > 0 {
		s, w.pool = w.pool[n-1], w.pool[:n-1]
	} else {
		s = new(seq)
	}
	*s = seq{id: r.ID, tokens: r.Tokens, output: output, maxBlocks: need,
		hashes: s.hashes[:0], locals: s.locals[:0], blocks: s.blocks[:0], remote: r.Remote, hold: r.Hold}
	s.hashes = w.hasher.AppendSequence(s.hashes, r.Tokens, w.cfg.BlockSize, w.seed)
	if w.host != nil {
		s.locals = w.hasher.AppendLocal(s.locals[:0], r.Tokens, w.cfg.BlockSize, w.seed)
	}
	if w.whead > 0 && w.whead == len(w.waiting) {
		clear(w.waiting)
		w.waiting, w.whead = w.waiting[:0], 0
	} else if w.whead > 64 && w.whead*2 > len(w.waiting) {
		n := copy(w.waiting, w.waiting[w.whead:])
		clear(w.waiting[n:])
		w.waiting, w.whead = w.waiting[:n], 0
	}
	w.waiting = append(w.waiting, s)
	return nil
}

// Step runs one scheduler step starting at now (see the package doc for the model) and
// returns the time it ends. out is reset and refilled. An idle worker does nothing and returns
// now (out is still reset). Every other step takes at least 1 ns, so a simulation always
// advances.
func (w *Worker) Step(now int64, out *StepOutput) int64 {
	out.reset()
	w.recs = w.recs[:0]
	if w.Idle() {
		return now
	}
	w.st.Steps++
	w.out = out
	w.reload = 0
	budget := w.cfg.MaxBatchedTokens
	decoding := false
	// Decoding sequences first, then running prefills in admission order.
	for _, s := range w.running {
		if budget == 0 {
			break
		}
		if s.computed >= len(s.tokens) {
			budget -= w.schedule(s, budget)
			decoding = true
		}
	}
	for _, s := range w.running {
		if budget == 0 {
			break
		}
		if s.computed < len(s.tokens) {
			budget -= w.schedule(s, budget)
			decoding = decoding || s.emitted
		}
	}
	for budget > 0 && len(w.running) < w.cfg.MaxSeqs && w.whead < len(w.waiting) {
		s := w.waiting[w.whead]
		if !w.admit(s) {
			break
		}
		w.waiting[w.whead] = nil
		w.whead++
		w.running = append(w.running, s)
		budget -= w.schedule(s, budget)
		decoding = decoding || s.emitted
	}

	u := w.timingUsage()
	step := w.cfg.Timing.StepTime(out.PrefillTokens, u, decoding) + time.Duration(w.reload)*w.cfg.HostReload
	end := now + max(1, int64(step))
	decodeNs := int64(0)
	if decoding {
		decodeNs = int64(math.Round(w.cfg.Timing.DecodeMs(u) * 1e6))
	}
	w.st.DecodeNs += uint64(decodeNs)
	w.st.PrefillNs += uint64(max(0, int64(step)-decodeNs))

	kept := w.running[:0]
	for _, s := range w.running {
		if !s.emitted {
			kept = append(kept, s)
			continue
		}
		s.emitted = false
		out.Emitted = append(out.Emitted, Token{ID: s.id, N: s.generated})
		if s.generated == 1 {
			out.PrefillDone = append(out.PrefillDone, Done{ID: s.id, At: end, Cached: s.cached, Host: s.host})
		}
		if s.generated < s.output {
			kept = append(kept, s)
			continue
		}
		out.Completed = append(out.Completed, Done{ID: s.id, At: end, Cached: s.cached, Host: s.host})
		w.st.Completed++
		if s.hold {
			// Its blocks stay pinned; the reservation it will not use goes back.
			w.reserved -= s.maxBlocks - len(s.blocks)
			s.maxBlocks = len(s.blocks)
			w.held[s.id] = s
			continue
		}
		w.release(s)
	}
	clear(w.running[len(kept):])
	w.running = kept

	for _, r := range w.recs {
		w.nextID++
		ev := kvevent.Event{Kind: r.kind, ID: w.nextID, Tier: r.tier, Hashes: out.hashes[r.h0:r.h1:r.h1]}
		if r.kind == kvevent.Stored {
			ev.Parent, ev.HasParent = r.parent, r.hasParent
			ev.BlockSize = w.cfg.BlockSize
			if r.tier == kvevent.Host {
				// The device copy's tokens are gone: the event carries the blocks' local
				// hashes, as Dynamo's KVBM events do (tokens_hash).
				ev.Locals = out.locals[r.t0:r.t1:r.t1]
			} else {
				ev.Tokens = out.tokens[r.t0:r.t1:r.t1]
			}
		}
		out.Events = append(out.Events, ev)
	}
	w.out = nil
	return end
}

// Abort removes request id, waiting or running, as an engine drops a request whose client went
// away, and reports whether the worker had it. A running request's blocks are released as a
// completed one's are: its stored prompt blocks stay cached (no event), the others go back to
// the free pool. An aborted request is never reported again, and the worker no longer holds its
// Tokens. Abort is for the goroutine that owns the worker, between steps; it scans the running
// and waiting requests, so it costs O(Running + Waiting).
func (w *Worker) Abort(id uint64) bool {
	for i, s := range w.running {
		if s.id != id {
			continue
		}
		n := copy(w.running[i:], w.running[i+1:])
		w.running[i+n] = nil
		w.running = w.running[:i+n]
		w.release(s)
		w.st.Aborted++
		return true
	}
	for i := w.whead; i < len(w.waiting); i++ {
		s := w.waiting[i]
		if s.id != id {
			continue
		}
		n := copy(w.waiting[i:], w.waiting[i+1:])
		w.waiting[i+n] = nil
		w.waiting = w.waiting[:i+n]
		s.tokens = nil
		w.pool = append(w.pool, s)
		w.st.Aborted++
		return true
	}
	return false
}

// Release unpins the blocks of a completed Hold request, as a completed request's are released
// (its stored blocks stay cached), and reports whether the worker held it. It is for the
// goroutine that owns the worker, between steps.
func (w *Worker) Release(id uint64) bool {
	s, ok := w.held[id]
	if !ok {
		return false
	}
	delete(w.held, id)
	w.release(s)
	return true
}

// Held returns the number of completed Hold requests not yet released.
func (w *Worker) Held() int { return len(w.held) }

// AppendHeldBlocks appends the block slots (0 ≤ slot < Blocks, in sequence order) of the held
// request id to dst, or returns dst and false when the worker holds no such request.
func (w *Worker) AppendHeldBlocks(dst []int32, id uint64) ([]int32, bool) {
	s, ok := w.held[id]
	if !ok {
		return dst, false
	}
	return append(dst, s.blocks...), true
}

// schedule gives s its work of this step within budget (> 0) and returns the tokens used.
func (w *Worker) schedule(s *seq, budget int) int {
	prompt := len(s.tokens)
	if s.computed < prompt {
		chunk := min(prompt-s.computed, budget)
		w.grow(s, s.computed+chunk)
		s.computed += chunk
		w.storeFull(s)
		w.out.PrefillTokens += chunk
		w.st.ComputedTokens += uint64(chunk)
		if s.computed == prompt {
			s.generated++ // the first token is sampled from the last prefill position
			s.emitted = true
		}
		return chunk
	}
	// Decode: compute the KV of the token sampled last step and sample the next one.
	w.grow(s, s.computed+1)
	s.computed++
	s.generated++
	s.emitted = true
	w.out.DecodeTokens++
	return 1
}

// admit pins s's cache hit and reserves the blocks it can still need, or reports false when
// the cache cannot hold it now.
func (w *Worker) admit(s *seq) bool {
	limit := min(len(s.hashes), (len(s.tokens)-1)/w.cfg.BlockSize)
	hit, unpinned := 0, 0
	for hit < limit {
		b, ok := w.byHash[s.hashes[hit]]
		if !ok {
			break
		}
		if w.blocks[b].ref == 0 {
			unpinned++
		}
		hit++
	}
	need := s.maxBlocks - hit
	if need > len(w.free)+w.lruLen-unpinned-w.reserved {
		return false
	}
	// The cached prefix may continue in the host tier.
	host := 0
	if w.host != nil && !s.remote { // a transfer brings the rest of a Remote prompt
		for hit+host < limit && w.host.has(s.hashes[hit+host]) {
			host++
		}
	}
	for i := range hit {
		b := w.byHash[s.hashes[i]]
		w.pin(b)
		s.blocks = append(s.blocks, b)
	}
	s.stored = hit
	s.computed = hit * w.cfg.BlockSize
	s.cached = s.computed
	w.reserved += need
	w.st.Admitted++
	w.st.PromptTokens += uint64(len(s.tokens))
	w.st.CachedTokens += uint64(s.cached)
	if host > 0 {
		// Reloaded, not computed: the blocks come back into device blocks of the request's
		// reservation and are stored (published) as if computed, and the step pays the copy.
		// Deepest first, so that a parent stays more recently used than its child in the
		// host LRU and leaves it after the child.
		for i := hit + host - 1; i >= hit; i-- {
			w.host.touch(s.hashes[i])
		}
		s.host = host * w.cfg.BlockSize
		s.computed += s.host
		w.grow(s, s.computed)
		w.storeFull(s)
		w.reload += host
		w.st.HostTokens += uint64(s.host)
	}
	if last := len(s.tokens) - 1; s.remote && s.computed < last {
		// The transferred blocks land in the blocks it reserved and are cached as if computed
		// here; the last prompt token is left to compute, for the first output token.
		w.st.RemoteTokens += uint64(last - s.computed)
		w.grow(s, last)
		s.computed = last
		w.storeFull(s)
	}
	return true
}

// grow gives s the blocks to hold tokens tokens of KV.
func (w *Worker) grow(s *seq, tokens int) {
	for need := w.blocksFor(tokens); len(s.blocks) < need; {
		b := w.alloc()
		w.blocks[b].ref = 1
		s.blocks = append(s.blocks, b)
		w.reserved--
	}
}

// alloc takes a free block, or evicts the least recently used unpinned cached one.
func (w *Worker) alloc() int32 {
	if n := len(w.free); n > 0 {
		b := w.free[n-1]
		w.free = w.free[:n-1]
		return b
	}
	b := w.lruHead
	if b == none {
		panic("sim: no KV block to allocate; the admission reservation is broken")
	}
	w.lruRemove(b)
	blk := &w.blocks[b]
	delete(w.byHash, blk.hash)
	if w.host != nil {
		w.offload(blk)
	}
	w.recordRemoved(blk.hash)
	*blk = block{prev: none, next: none}
	w.st.EvictedBlocks++
	return b
}

// storeFull stores s's prompt blocks that the chunks so far have filled.
func (w *Worker) storeFull(s *seq) {
	full := min(s.computed/w.cfg.BlockSize, len(s.hashes))
	for i := s.stored; i < full; i++ {
		b, h := s.blocks[i], s.hashes[i]
		if e, ok := w.byHash[h]; ok {
			// Computed concurrently by another sequence: share the cached copy.
			w.pin(e)
			w.blocks[b].ref = 0
			w.free = append(w.free, b)
			s.blocks[i] = e
			continue
		}
		blk := &w.blocks[b]
		blk.hash, blk.stored = h, true
		if w.host != nil {
			blk.local = s.locals[i]
		}
		if i > 0 {
			blk.parent, blk.hasParent = s.hashes[i-1], true
		}
		w.byHash[h] = b
		w.recordStored(blk.hash, blk.parent, blk.hasParent, s.tokens[i*w.cfg.BlockSize:(i+1)*w.cfg.BlockSize])
		w.st.StoredBlocks++
	}
	s.stored = max(s.stored, full)
}

// release returns a finished sequence's blocks, tail first, and recycles s.
func (w *Worker) release(s *seq) {
	w.reserved -= s.maxBlocks - len(s.blocks)
	for i := len(s.blocks) - 1; i >= 0; i-- {
		b := s.blocks[i]
		blk := &w.blocks[b]
		blk.ref--
		if blk.ref > 0 {
			continue
		}
		if blk.stored {
			w.lruPushTail(b)
		} else {
			w.free = append(w.free, b)
		}
	}
	s.tokens = nil
	w.pool = append(w.pool, s)
}

func (w *Worker) pin(b int32) {
	if w.blocks[b].ref == 0 {
		w.lruRemove(b)
	}
	w.blocks[b].ref++
}

func (w *Worker) lruPushTail(b int32) {
	blk := &w.blocks[b]
	blk.prev, blk.next = w.lruTail, none
	if w.lruTail == none {
		w.lruHead = b
	} else {
		w.blocks[w.lruTail].next = b
	}
	w.lruTail = b
	w.lruLen++
}

func (w *Worker) lruRemove(b int32) {
	blk := &w.blocks[b]
	if blk.prev == none {
		w.lruHead = blk.next
	} else {
		w.blocks[blk.prev].next = blk.next
	}
	if blk.next == none {
		w.lruTail = blk.prev
	} else {
		w.blocks[blk.next].prev = blk.prev
	}
	blk.prev, blk.next = none, none
	w.lruLen--
}

// recordStored appends a stored block to the step's events, extending the last event when it is
// a Stored event ending with the block's parent.
func (w *Worker) recordStored(hash, parent uint64, hasParent bool, tokens []uint32) {
	o := w.out
	if n := len(w.recs); n > 0 && hasParent {
		r := &w.recs[n-1]
		if r.kind == kvevent.Stored && r.tier == kvevent.Device && o.hashes[r.h1-1] == parent {
			o.hashes = append(o.hashes, hash)
			o.tokens = append(o.tokens, tokens...)
			r.h1, r.t1 = len(o.hashes), len(o.tokens)
			return
		}
	}
	r := eventRec{kind: kvevent.Stored, h0: len(o.hashes), t0: len(o.tokens), parent: parent, hasParent: hasParent}
	o.hashes = append(o.hashes, hash)
	o.tokens = append(o.tokens, tokens...)
	r.h1, r.t1 = len(o.hashes), len(o.tokens)
	w.recs = append(w.recs, r)
}

// recordHostStored appends a block copied into the host tier to the step's events, extending
// the last event when it is a host Stored event ending with the block's parent.
func (w *Worker) recordHostStored(hash, parent uint64, hasParent bool, local uint64) {
	o := w.out
	if n := len(w.recs); n > 0 && hasParent {
		r := &w.recs[n-1]
		if r.kind == kvevent.Stored && r.tier == kvevent.Host && o.hashes[r.h1-1] == parent {
			o.hashes = append(o.hashes, hash)
			o.locals = append(o.locals, local)
			r.h1, r.t1 = len(o.hashes), len(o.locals)
			return
		}
	}
	w.recs = append(w.recs, eventRec{kind: kvevent.Stored, tier: kvevent.Host, h0: len(o.hashes), h1: len(o.hashes) + 1,
		t0: len(o.locals), t1: len(o.locals) + 1, parent: parent, hasParent: hasParent})
	o.hashes = append(o.hashes, hash)
	o.locals = append(o.locals, local)
}

// recordRemoved appends a block evicted from the device to the step's events.
func (w *Worker) recordRemoved(hash uint64) { w.recordRemovedTier(hash, kvevent.Device) }

// recordRemovedTier appends a block that left tier to the step's events, extending the last
// event when it is a Removed event of the same tier.
func (w *Worker) recordRemovedTier(hash uint64, tier kvevent.Tier) {
	o := w.out
	if n := len(w.recs); n > 0 && w.recs[n-1].kind == kvevent.Removed && w.recs[n-1].tier == tier {
		o.hashes = append(o.hashes, hash)
		w.recs[n-1].h1 = len(o.hashes)
		return
	}
	w.recs = append(w.recs, eventRec{kind: kvevent.Removed, tier: tier, h0: len(o.hashes), h1: len(o.hashes) + 1})
	o.hashes = append(o.hashes, hash)
}

// check verifies the worker's internal invariants; tests call it after every step.
func (w *Worker) check() error {
	refs := make([]int32, len(w.blocks))
	reserved := 0
	seqs := slices.Clone(w.running)
	for _, s := range w.held {
		seqs = append(seqs, s)
	}
	for _, s := range seqs {
		if s.stored > len(s.blocks) || len(s.blocks) > s.maxBlocks {
			return fmt.Errorf("seq %d: stored %d, blocks %d, max %d", s.id, s.stored, len(s.blocks), s.maxBlocks)
		}
		if want := w.blocksFor(s.computed); len(s.blocks) != want {
			return fmt.Errorf("seq %d: %d blocks for %d computed tokens", s.id, len(s.blocks), s.computed)
		}
		for i, b := range s.blocks {
			refs[b]++
			blk := &w.blocks[b]
			if (i < s.stored) != blk.stored {
				return fmt.Errorf("seq %d block %d: stored %v, seq stored %d", s.id, i, blk.stored, s.stored)
			}
			if blk.stored && blk.hash != s.hashes[i] {
				return fmt.Errorf("seq %d block %d: hash mismatch", s.id, i)
			}
		}
		reserved += s.maxBlocks - len(s.blocks)
	}
	if reserved != w.reserved {
		return fmt.Errorf("reserved %d, want %d", w.reserved, reserved)
	}
	inFree := make([]bool, len(w.blocks))
	for _, b := range w.free {
		if inFree[b] {
			return fmt.Errorf("block %d free twice", b)
		}
		inFree[b] = true
	}
	inLRU := make([]bool, len(w.blocks))
	lruPos := make([]int, len(w.blocks))
	n, prev := 0, none
	for b := w.lruHead; b != none; b = w.blocks[b].next {
		if w.blocks[b].prev != prev {
			return fmt.Errorf("LRU link broken at %d", b)
		}
		inLRU[b] = true
		lruPos[b] = n
		prev = b
		n++
	}
	if n != w.lruLen || prev != w.lruTail {
		return fmt.Errorf("LRU length %d, counted %d", w.lruLen, n)
	}
	stored := 0
	for b := range w.blocks {
		blk := &w.blocks[b]
		if blk.ref != refs[b] {
			return fmt.Errorf("block %d: ref %d, held by %d", b, blk.ref, refs[b])
		}
		switch {
		case inFree[b]:
			if blk.ref != 0 || blk.stored || inLRU[b] {
				return fmt.Errorf("free block %d in use", b)
			}
		case blk.stored:
			stored++
			if w.byHash[blk.hash] != int32(b) {
				return fmt.Errorf("stored block %d not indexed", b)
			}
			if inLRU[b] != (blk.ref == 0) {
				return fmt.Errorf("stored block %d: ref %d, in LRU %v", b, blk.ref, inLRU[b])
			}
			if blk.hasParent {
				p, ok := w.byHash[blk.parent]
				if !ok {
					return fmt.Errorf("stored block %d: parent not cached", b)
				}
				if blk.ref > 0 && w.blocks[p].ref < blk.ref {
					return fmt.Errorf("stored block %d pinned %d times, parent %d", b, blk.ref, w.blocks[p].ref)
				}
				// Children leave the LRU first: a parent is never evicted before its child.
				if inLRU[b] && inLRU[p] && lruPos[p] < lruPos[b] {
					return fmt.Errorf("stored block %d: parent %d older in the LRU", b, p)
				}
			}
		default:
			if blk.ref != 1 || inLRU[b] {
				return fmt.Errorf("private block %d: ref %d", b, blk.ref)
			}
		}
	}
	if stored != len(w.byHash) {
		return fmt.Errorf("%d stored blocks, %d indexed", stored, len(w.byHash))
	}
	if err := w.checkHost(); err != nil {
		return err
	}
	if free := len(w.free); free+w.lruLen < w.reserved {
		return fmt.Errorf("free %d + evictable %d < reserved %d", free, w.lruLen, w.reserved)
	}
	return nil
}
