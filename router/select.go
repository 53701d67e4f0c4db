package router

import (
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Choosing and booking apart, for NVIDIA Dynamo's selection service (server/selection.go):
// Select chooses a worker without booking it, Score scores every allowed worker without
// choosing, Book books a request on a worker the caller names. They score with the same cost,
// the same chooser and the same Tracker as Route, so that a booking made either way counts in the
// other's load; they take the general path of Route (every candidate scored one by one), off the
// hot path. Route itself is not built on them: its fast path (scorekv.go) chooses and books in
// one pass.

// SelectOptions are what a Dynamo selection request may set beyond a wire.RouteRequest.
type SelectOptions struct {
	// TrackPrefill, if not nil, overrides Config.NoTrackPrefill for this request (Dynamo's
	// router_config_override.track_prefill_tokens).
	TrackPrefill *bool
	// Seqs, if as many as the request's full blocks, are its sequence hashes as the client
	// gave them (Dynamo's sequence_hashes beside block_hashes): what the active-block overlap
	// compares and Book books (Selection.Seqs), as Dynamo's selection does, in place of the
	// chain of the block hashes, which the index match still walks.
	Seqs []uint64
}

// Scored is one worker as Score and Select saw it for a request: a plain value.
type Scored struct {
	Worker radix.WorkerKey
	// Cached is the leading blocks of the request the worker holds; Shared those of them
	// already active on it (booked by other requests).
	Cached, Shared int32
	// Ext is how far the lower storage tiers extend Cached (credited in Logit).
	Ext scoring.TierExt
	// The worker's booked load before this request.
	ActiveBlocks, ActivePrefill, ActiveRequests int64
	// PrefillTokens and DecodeBlocks are the worker's load with the request added, and Logit
	// its cost (see scoring.Params.Cost).
	PrefillTokens, DecodeBlocks int64
	Logit                       float64
}

// Selection is the answer of Score and Select; its slices are reused by the next call given
// the same Selection. A Selection belongs to one goroutine.
type Selection struct {
	// Chosen is the worker Select chose; HasChosen is false after Score.
	Chosen    Scored
	HasChosen bool
	// Scores holds every candidate, in worker order.
	Scores []Scored
	// BlockSize is the model's; ISL and Blocks the request's tokens and full blocks.
	BlockSize, ISL, Blocks int
	// TrackPrefill says whether the request's own uncached tokens were charged; Prefill is
	// what Book would book for the chosen worker: ISL − Chosen.Cached × BlockSize when they
	// are, 0 when not.
	TrackPrefill bool
	Prefill      int64
	// Seqs are the identities of the request's full blocks, first block first: what Book
	// books. Its sequence hashes, or with Config.TrackingKey its keyed tracking identities.
	Seqs []uint64
	// Credit is the share of a device block credited (overlap_score_credit, the request's or
	// the router's), Tiers the lower tiers' weights: what Dynamo's router_credit_blocks weighs.
	Credit float64
	Tiers  scoring.TierCredit
}

// Score scores every worker of req's model that req allows (its pinned worker, or its allowed
// ids) as Route would, without choosing or booking, and fills sel. It refuses what Route
// refuses, with the same errors.
func (r *Router) Score(req *wire.RouteRequest, o SelectOptions, sel *Selection) error {
	return r.selectWith(req, o, sel, false)
}

// Select is Score choosing a worker as Route would (mode, temperature, tie-breaks), without
// booking it: Book books it, or nothing does. Between the two another request may book the
// same worker, as between Route's scores and its booking.
func (r *Router) Select(req *wire.RouteRequest, o SelectOptions, sel *Selection) error {
	return r.selectWith(req, o, sel, true)
}

func (r *Router) selectWith(req *wire.RouteRequest, o SelectOptions, sel *Selection, choose bool) error {
	m := r.model(req.Model)
	if m == nil {
		return fieldErr(ErrUnknownModel, "model", "no worker is registered for model %q", req.Model)
	}
	// The checks of route (route.go), but for the request id, which neither needs; the hashes
	// may be a longer prompt's first blocks, as Dynamo's isl_tokens says.
	var p scoring.Params
	if err := r.params(m, req, true, &p); err != nil {
		return err
	}
	if o.TrackPrefill != nil {
		p.TrackPrefill = *o.TrackPrefill
	}
	// Dynamo's selection service reports the booked prefill tokens as they are, decayed only
	// by its prefill load model (Config.DecayPrefill): so do these answers, under any cost.
	p.Decay = r.cfg.DecayPrefill
	s := r.scratch.Get()
	defer r.scratch.Put(s)
	s.noReuse = false // Book books Selection.Seqs, the real hashes
	s.match(r, m, req, &p, nil)
	if len(o.Seqs) == len(s.seqs) && o.Seqs != nil {
		s.kseqs = append(s.kseqs[:0], o.Seqs...) // trusted identities, as Dynamo takes them
		s.tseqs = s.kseqs
	}
	if choose {
		s.setEject(r, r.ejecting(m))
	}
	chosen, err := s.general(r, m.ix, m.list.Load(), &p, req, choose)
	s.eject = false
	if err != nil {
		return err
	}
	r.matched.Inc()

	*sel = Selection{Scores: sel.Scores[:0], Seqs: append(sel.Seqs[:0], s.tseqs...),
		BlockSize: m.blockSize, ISL: p.ISL, Blocks: p.Blocks, TrackPrefill: p.TrackPrefill, Credit: p.Credit, Tiers: p.Tiers}
	for i := range s.cands {
		sel.Scores = append(sel.Scores, scored(&s.cands[i]))
	}
	if choose {
		sel.Chosen, sel.HasChosen = sel.Scores[chosen], true
		if p.TrackPrefill {
			sel.Prefill = max(int64(p.ISL)-int64(sel.Chosen.Cached)*int64(m.blockSize), 0)
		}
	}
	return nil
}

func scored(c *scoring.Candidate) Scored {
	return Scored{
		Worker: radix.WorkerKey{ID: c.Worker, Rank: c.Rank}, Cached: c.Cached, Ext: c.Ext, Shared: c.Shared,
		ActiveBlocks: c.ActiveBlocks, ActivePrefill: c.ActivePrefill, ActiveRequests: c.ActiveRequests,
		PrefillTokens: c.PrefillTokens, DecodeBlocks: c.DecodeBlocks, Logit: c.Logit,
	}
}

// Book books request id on worker of model as Route books the worker it chooses: seqs (the
// request's full blocks' sequence hashes, chained, first block first, as Selection.Seqs) count
// as the worker's active blocks, each once however many requests share it, and prefill as its
// active prefill tokens, until PrefillDone, Complete or Config.RequestExpiry. Config.Share and
// approximate mode learn of it as of a request Route booked, and it counts as routed. The
// Router copies what it keeps. Errors: ErrInvalid (the id, prefill tokens, block count),
// ErrUnknownModel, ErrUnknownWorker (not registered for model), ErrConflict (id is booked
// already).
func (r *Router) Book(model string, worker radix.WorkerKey, id string, seqs []uint64, prefill int64) error {
	if id == "" || len(id) > scoring.MaxRequestID {
		return fieldErr(ErrInvalid, "request_id", "%d bytes, want 1 to %d", len(id), scoring.MaxRequestID)
	}
	if isRemoteKey(id) {
		return fieldErr(ErrInvalid, "request_id", "ids starting with a NUL byte are reserved for other replicas' requests")
	}
	m, list, i, err := r.bookable(model, worker, seqs, prefill)
	if err != nil {
		return err
	}
	w := list.ws[i]
	switch err := r.tracker.Book(id, w.load, seqs, prefill, r.cfg.Now()+int64(r.cfg.RequestExpiry)); err {
	case nil:
	case scoring.ErrDuplicateRequest:
		return fieldErr(ErrConflict, "request_id", "request %q is already active", id)
	default:
		return fieldErr(ErrUnknownWorker, "worker", "%v", err)
	}
	if r.cfg.Share != nil {
		r.cfg.Share.Booked(m.name, w.key, id, seqs, prefill, r.cfg.RequestExpiry)
	}
	r.placedFor(m, w, seqs, id)
	r.routed.Inc()
	return nil
}

// TracksPrefill reports whether requests' own uncached tokens are charged and booked as
// prefill unless a request says otherwise (Config.NoTrackPrefill unset).
func (r *Router) TracksPrefill() bool { return !r.cfg.NoTrackPrefill }

// Booked reports whether request id is booked here (by Route or Book, and neither completed
// nor expired).
func (r *Router) Booked(id string) bool {
	return !isRemoteKey(id) && r.tracker.Booked(id)
}
