package router

import (
	"slices"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"

	"github.com/kvrouterd/kvrouterd/shard"
)

// WorkerInfo is one registered (worker, dp rank) and its state, for listings.
type WorkerInfo struct {
	ID             uint64 `json:"worker_id"`
	Rank           uint32 `json:"dp_rank"`
	Model          string `json:"model"`
	BlockSize      int    `json:"block_size"`
	CachedBlocks   int64  `json:"cached_blocks"`
	ActiveBlocks   int64  `json:"active_blocks"`
	ActivePrefill  int64  `json:"active_prefill_tokens"`
	ActiveRequests int64  `json:"active_requests"`
	LastEventID    uint64 `json:"last_event_id"`
	// LastBatch is the sequence of the last batch applied from the rank's engine socket, if
	// HasBatch; a restarted daemon resumes the engine's stream after it.
	LastBatch uint64 `json:"last_batch_seq,omitempty"`
	HasBatch  bool   `json:"-"`
	// EventLag is the number of events received for the worker and not applied yet.
	EventLag  int64  `json:"event_lag"`
	Capacity  int64  `json:"capacity_blocks,omitempty"`
	MaxTokens int64  `json:"max_batched_tokens,omitempty"`
	Endpoint  string `json:"endpoint,omitempty"`
	Replay    string `json:"replay_endpoint,omitempty"`
	// HTTPEndpoint is the worker's OpenAI-compatible API (every rank's).
	HTTPEndpoint string `json:"http_endpoint,omitempty"`
	// APIKeySet says whether the front door sends the worker's API a key of its own
	// (registered, or from Config.APIKeys); the key itself is never listed.
	APIKeySet bool `json:"api_key_set,omitempty"`
	// Weight is the worker's device-aware weight (Registration.Weight), 0 when never set.
	Weight float64 `json:"weight,omitempty"`
	// Role is the worker's role: prefill, decode or both (role.go).
	Role string `json:"role"`
	// Problems says what is known to be wrong with the worker's configuration, such as an
	// engine block size other than its model's: each a short line naming the setting.
	Problems []string `json:"problems,omitempty"`
	// BlockSizeRefused counts the worker's stored events refused for their block size.
	BlockSizeRefused int64 `json:"-"`
	// Unmatched counts the sampled requests that found other workers' blocks of the model and
	// none of this one's since it last had a hit, while it held many blocks; ZeroHits is true
	// once they are enough to list it as misconfigured (Config.ZeroHits).
	Unmatched int64 `json:"-"`
	ZeroHits  bool  `json:"-"`
	// Report is the worker's last load report, if it sends them.
	Report *LoadReport `json:"load_report,omitempty"`
	// State says where the rank's events come from and whether they flow (see SourceState);
	// empty in approximate mode, which reads no events.
	State SourceState `json:"state,omitempty"`
	// LastEventAt is when the rank's last event batch arrived: from the rank's own socket when
	// the daemon subscribes to it, else the last batch of any of the worker's ranks. Zero
	// (omitted) before the first.
	LastEventAt time.Time `json:"last_event_at,omitzero"`
	// Health is the rank's standing with the outlier ejection (eject.go): "ok", "suspect"
	// (it failed since its last answer, and loses ties) or "ejected" (out of routing).
	// EjectedUntil is when an ejected rank's time is up (its health is probed then, or it comes
	// back); Ejections the ejection multiplier (times ejected, decayed); ConsecutiveFailures its
	// failures in a row; LastFailure the reason of the last one, while it is not ok.
	Health              string    `json:"health"`
	EjectedUntil        time.Time `json:"ejected_until,omitzero"`
	Ejections           int       `json:"ejections,omitempty"`
	ConsecutiveFailures int       `json:"consecutive_failures,omitempty"`
	LastFailure         string    `json:"last_failure,omitempty"`
}

// Workers lists the registered workers, by model, id and rank.
func (r *Router) Workers() []WorkerInfo {
	r.mu.Lock()
	var (
		out []WorkerInfo
		rws []*rankWorker // rws[i] is out[i]'s
	)
	for _, reg := range r.workers {
		for _, w := range reg.ranks {
			out = append(out, WorkerInfo{
				ID: w.key.ID, Rank: w.key.Rank, Model: reg.model.name, BlockSize: reg.model.blockSize,
				Capacity: reg.capacity.Load(), MaxTokens: reg.maxTokens.Load(), Weight: reg.getWeight(), Role: reg.getRole().String(), Endpoint: w.endpoint, Replay: w.replay,
			})
			if u := reg.http.Load(); u != nil {
				out[len(out)-1].HTTPEndpoint = *u
				out[len(out)-1].APIKeySet = r.apiKeyLocked(reg, *u) != ""
			}
			rws = append(rws, w)
		}
	}
	r.mu.Unlock()
	// Counters are atomic, read outside the lock: listing a large fleet does not hold up
	// registrations. A worker unregistered meanwhile is listed with what they read.
	for i := range out {
		x, w := &out[i], rws[i]
		r.sourceState(x, w.reg)
		x.CachedBlocks = w.reg.model.ix.Blocks(w.slot)
		x.ActiveBlocks = w.load.ActiveBlocks()
		x.ActivePrefill = w.load.ActivePrefill()
		x.ActiveRequests = w.load.Requests()
		x.Report = w.report.Load()
		x.EventLag = w.reg.received.Load() - w.reg.applied.Load()
		x.Problems = w.reg.mis.problems(w.reg.model.blockSize)
		x.BlockSizeRefused = w.reg.mis.blockSizeEvents.Load()
		x.Unmatched, x.ZeroHits = w.reg.mis.unmatched.Load(), w.reg.mis.zeroHits.Load()
	}
	r.fillHealth(out, rws)
	// Cursors live on the shards: one visit per shard, not per worker (metrics scrapes list
	// every worker).
	byShard := make(map[int][]int)
	for i := range out {
		sh := r.set.ShardOf(out[i].ID)
		byShard[sh] = append(byShard[sh], i)
	}
	for _, idx := range byShard {
		_ = r.set.Do(out[idx[0]].ID, func(a *shard.Applier) {
			for _, i := range idx {
				out[i].LastEventID = a.Cursor(out[i].ID, out[i].Rank)
				if b := a.Batch(out[i].ID, out[i].Rank); b > 0 {
					out[i].LastBatch = b - 1
					out[i].HasBatch = true
				}
			}
		})
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int {
		switch {
		case a.Model != b.Model:
			if a.Model < b.Model {
				return -1
			}
			return 1
		case a.ID != b.ID:
			if a.ID < b.ID {
				return -1
			}
			return 1
		}
		return int(a.Rank) - int(b.Rank)
	})
	return out
}

// ModelInfo describes one model's index.
type ModelInfo struct {
	Name        string `json:"model"`
	BlockSize   int    `json:"block_size"`
	Workers     int    `json:"workers"`
	Blocks      int64  `json:"blocks"`      // distinct blocks in the index
	Residencies int64  `json:"residencies"` // (block, worker) pairs
	// HostResidencies, DiskResidencies and ExternalResidencies are the (block, worker) pairs of
	// the lower storage tiers' indexes; Blocks and Residencies are the device tier's.
	HostResidencies     int64 `json:"host_residencies,omitempty"`
	DiskResidencies     int64 `json:"disk_residencies,omitempty"`
	ExternalResidencies int64 `json:"external_residencies,omitempty"`
}

// TierResidencies returns the model's residencies by storage tier (kvevent.Tier).
func (m *ModelInfo) TierResidencies() [kvevent.NumTiers]int64 {
	return [kvevent.NumTiers]int64{m.Residencies, m.HostResidencies, m.DiskResidencies, m.ExternalResidencies}
}

// Models lists the models, by name.
func (r *Router) Models() []ModelInfo {
	ms := *r.models.Load()
	out := make([]ModelInfo, 0, len(ms))
	for _, m := range ms {
		st := m.ix.Stats()
		mi := ModelInfo{Name: m.name, BlockSize: m.blockSize, Workers: len(m.list.Load().ws),
			Blocks: int64(st.Entries), Residencies: int64(st.Residencies)}
		for t, dst := range [...]*int64{kvevent.Host: &mi.HostResidencies, kvevent.Disk: &mi.DiskResidencies, kvevent.External: &mi.ExternalResidencies} {
			if tix := m.ix.TierIndex(kvevent.Tier(t)); dst != nil && tix != nil {
				*dst = tix.Stats().Residencies
			}
		}
		out = append(out, mi)
	}
	slices.SortFunc(out, func(a, b ModelInfo) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// ModelBlockSize returns the block size of model name, if it exists.
func (r *Router) ModelBlockSize(name string) (int, bool) {
	m := r.model(name)
	if m == nil {
		return 0, false
	}
	return m.blockSize, true
}

// Stats are the Router's counters.
type Stats struct {
	Routed, Matched, Expired int64
	ActiveRequests           int64
	Discovered, TimedOut     int64 // workers registered by their events, dropped as silent
	SnapshotSkipped          int64 // workers left out of snapshots: the format cannot hold them
	// Predictions are the (block, worker) pairs predict-on-route holds; PredictRaised counts
	// the matches whose depths they raised (Config.PredictedTTL).
	Predictions, PredictRaised int64
	Events                     shard.Stats

	// PromptTokens and CachedTokens sum the routed requests' prompt tokens and the tokens of
	// them in the device prefix cached on the worker chosen (for a disaggregated request, its
	// prefill worker): their rates' ratio is the token-weighted hit rate.
	PromptTokens, CachedTokens int64
}

// Stats returns the counters.
func (r *Router) Stats() Stats {
	return Stats{
		Routed: r.routed.Value(), Matched: r.matched.Value(), Expired: r.expired.Load(),
		PromptTokens: r.promptTokens.Value(), CachedTokens: r.cachedTokens.Value(),
		ActiveRequests: r.tracker.Active(),
		Discovered:     r.discovered.Load(), TimedOut: r.timedOut.Load(),
		SnapshotSkipped: r.snapshotSkipped.Load(),
		Predictions:     r.predictions(),
		PredictRaised:   r.predictRaised.Load(),
		Events:          r.set.Stats(),
	}
}

// PrefillDone records that request id finished its prefill: a disaggregated request's prefill
// stage is released whole (its worker is done with the request), and the prompt tokens of the
// booking under id stop counting.
func (r *Router) PrefillDone(id string) error {
	if isRemoteKey(id) {
		return fieldErr(ErrUnknownRequest, "id", "no active request %q", id)
	}
	staged := r.releasePrefillStage(id)
	if r.tracker.PrefillDone(id) != nil {
		if !staged {
			return fieldErr(ErrUnknownRequest, "id", "no active request %q", id)
		}
	} else if r.cfg.Share != nil {
		r.cfg.Share.PrefillDone(id)
	}
	r.drain()
	return nil
}

// OutputTokens records that request id has generated n output tokens in all (a count that only
// grows; a smaller or equal one changes nothing). With Config.TrackOutputBlocks it books an
// output block at each block boundary the prompt and output cross (see
// scoring.Tracker.Generated); without, it only checks that the request is booked. It allocates
// nothing. Output blocks are this replica's: they are not shared with other replicas.
func (r *Router) OutputTokens(id string, n int64) error {
	if isRemoteKey(id) {
		return fieldErr(ErrUnknownRequest, "id", "no active request %q", id)
	}
	if n < 0 {
		return fieldErr(ErrInvalid, "generated_tokens", "%d: want a count ≥ 0", n)
	}
	if _, err := r.tracker.Generated(id, n); err != nil {
		return fieldErr(ErrUnknownRequest, "id", "no active request %q", id)
	}
	return nil
}

// TracksOutput reports whether OutputTokens books output blocks (Config.TrackOutputBlocks), so
// that a caller can skip counting tokens nobody uses.
func (r *Router) TracksOutput() bool { return r.cfg.TrackOutputBlocks }

// OutputBlock adds one output block to request id, and with hasDecay weighs the request's own
// blocks by decay (0 to 1): Dynamo's add_output_block, for callers that count blocks themselves.
// Like OutputTokens its blocks are this replica's.
func (r *Router) OutputBlock(id string, decay float64, hasDecay bool) error {
	if hasDecay && !(decay >= 0 && decay <= 1) {
		return fieldErr(ErrInvalid, "decay_fraction", "%v: want 0.0 to 1.0", decay)
	}
	if isRemoteKey(id) || r.tracker.OutputBlock(id, decay, hasDecay) != nil {
		return fieldErr(ErrUnknownRequest, "id", "no active request %q", id)
	}
	return nil
}

// Complete records that request id finished: its load is freed, a disaggregated request's
// both stages'.
func (r *Router) Complete(id string) error {
	if isRemoteKey(id) {
		return fieldErr(ErrUnknownRequest, "id", "no active request %q", id)
	}
	staged := r.releasePrefillStage(id)
	r.releaseApprox(id)
	if r.tracker.Complete(id) != nil {
		if !staged {
			return fieldErr(ErrUnknownRequest, "id", "no active request %q", id)
		}
	} else if r.cfg.Share != nil {
		r.cfg.Share.Completed(id)
	}
	r.drain()
	return nil
}

// DumpedBlock is one block a worker holds: the engine's hash and the router's sequence hash.
type DumpedBlock struct {
	Rank   uint32
	Engine uint64
	Seq    uint64
}

// DumpWorker calls f with the blocks of every registered worker of model, sorted by rank and
// sequence hash, so that two replicas with the same state dump the same bytes.
func (r *Router) DumpWorker(id uint64, dst []DumpedBlock) []DumpedBlock {
	_ = r.set.Do(id, func(a *shard.Applier) {
		a.EachBlock(id, func(rank uint32, engine, seq uint64) {
			dst = append(dst, DumpedBlock{rank, engine, seq})
		})
	})
	slices.SortFunc(dst, func(a, b DumpedBlock) int {
		switch {
		case a.Rank != b.Rank:
			return int(a.Rank) - int(b.Rank)
		case a.Seq < b.Seq:
			return -1
		case a.Seq > b.Seq:
			return 1
		case a.Engine < b.Engine:
			return -1
		case a.Engine > b.Engine:
			return 1
		}
		return 0
	})
	return dst
}

// DumpTree appends worker id's blocks to dst, each after its parent (see
// shard.Applier.DumpTree), and returns it with how many blocks it left out: all of them
// without Config.KeepTree.
func (r *Router) DumpTree(id uint64, dst []shard.TreeBlock) ([]shard.TreeBlock, int) {
	left := 0
	_ = r.set.Do(id, func(a *shard.Applier) { dst, left = a.DumpTree(id, dst) })
	return dst, left
}

// KeepsTree reports whether the router keeps each block's local hash and parent.
func (r *Router) KeepsTree() bool { return r.cfg.KeepTree }

// ModelWorkers returns the ids of the workers registered for model, ascending.
func (r *Router) ModelWorkers(model string) []uint64 {
	m := r.model(model)
	if m == nil {
		return nil
	}
	var ids []uint64
	for _, w := range m.list.Load().ws {
		if len(ids) == 0 || ids[len(ids)-1] != w.key.ID {
			ids = append(ids, w.key.ID)
		}
	}
	return ids
}

// WorkerModel is the model worker id is registered for; false if it is not registered.
func (r *Router) WorkerModel(id uint64) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reg := r.workers[id]; reg != nil {
		return reg.model.name, true
	}
	return "", false
}

// HasRank reports whether worker id is registered with data-parallel rank rank.
func (r *Router) HasRank(id uint64, rank uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reg := r.workers[id]; reg != nil {
		for _, w := range reg.ranks {
			if w.key.Rank == rank {
				return true
			}
		}
	}
	return false
}
