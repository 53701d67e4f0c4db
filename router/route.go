package router

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
)

// MaxTokens bounds a request's prompt, in tokens (and its block hashes, in blocks).
const MaxTokens = 1 << 22

// scratch is one request's working memory, pooled so that a request allocates nothing.
type scratch struct {
	h       radix.Hasher
	seqs    []uint64
	m, am   radix.Match
	pm      radix.Match // predict-on-route's match (predict.go)
	cands   []scoring.Candidate
	tree    []int64
	all     bool    // every worker is a candidate: candidate i is worker list position i
	at      []int32 // unless all: worker list position → candidate, -1 when filtered out
	pos     []int32 // unless all: candidate → worker list position
	allowed []uint64
	th      *Thresholds // the model's busy thresholds while route's general path runs, else nil
	over    []bool      // with th: worker list position → its worker is overloaded
	// eject: some rank of the model failed since its last success (eject.go), while route's
	// general path chooses; isOut then marks the positions out of routing at now.
	eject bool
	now   int64
	isOut []bool
	// noReuse: the request's blocks are booked under the random hashes rseqs and share no
	// active block with another request (assume_kv_reuse off).
	noReuse bool
	rseqs   []uint64

	// tseqs are the identities the request's blocks are booked and shared under (tracking.go):
	// seqs, the public sequence hashes the index is matched by, or with Config.TrackingKey
	// kseqs, the keyed ones.
	tseqs, kseqs []uint64

	// scoreKV's working memory (scorekv.go)
	depth []int32
	busy  []radix.Slot
	bpos  []int32
	rows  []busyRow
	tab   []cost
	wtab  []wireCost // tab as records carry it
	have  []bool     // which depths of tab a formula other than CostV1 filled
	// shared is the blocks of the chosen worker's candidate booked there by requests ahead
	// (Candidate.Shared), set by predict for bookStage; predictedFor is the worker the pick
	// that set it and predicted chose.
	shared       int32
	predictedFor *rankWorker
	// predicted is the chosen worker's TTFT as CostTTFT's step model predicts it with nothing
	// queued ahead (ms; 0: none), for its booking (scoring.Output.PredictedTTFT).
	predicted float64
	heap      []ranked
	bounds    []float64
	pool      []ranked
	ties      []tie

	// routeDisagg's (disagg.go): the prefill pick's answer, and the prefill stage's key
	presp wire.RouteResponse
	key   []byte

	// The phase timing's (phases.go): a timed request's clock.
	clock phaseClock
}

// cand returns the candidate of worker list position pos, -1 for none.
func (s *scratch) cand(pos int32) int32 {
	if s.all {
		return pos
	}
	return s.at[pos]
}

// worker returns the worker list position of candidate c.
func (s *scratch) worker(c int) int32 {
	if s.all {
		return int32(c)
	}
	return s.pos[c]
}

// Route scores req against the workers of its model, chooses one, books the request's load on
// it, and fills resp. Match does the same without choosing or booking. resp's slices are reused;
// its strings alias req's. resp means something only when the error is nil: a request refused
// at booking (a duplicate id, say) may leave it filled.
func (r *Router) Route(req *wire.RouteRequest, resp *wire.RouteResponse) error {
	return r.route(req, resp, true, nil)
}

// Match scores req against every allowed worker without choosing or booking.
func (r *Router) Match(req *wire.RouteRequest, resp *wire.RouteResponse) error {
	return r.route(req, resp, false, nil)
}

// AppendRoute is Route answering in the binary format: it appends the answer's message
// (wire.AppendRouteResponse's bytes) to dst and returns the extended slice. On error it returns
// dst, whose spare capacity may have been written. resp is the caller's scratch, reused like
// Route's; its Candidates are unspecified afterwards, since an answer listing every worker is
// encoded straight into dst. dst must not share memory with req's fields (the buffer req was
// decoded from, say): the answer is written before the request is booked under its id.
func (r *Router) AppendRoute(dst []byte, req *wire.RouteRequest, resp *wire.RouteResponse) ([]byte, error) {
	return r.appendAnswer(dst, req, resp, true)
}

// AppendMatch is Match answering in the binary format, as AppendRoute is Route.
func (r *Router) AppendMatch(dst []byte, req *wire.RouteRequest, resp *wire.RouteResponse) ([]byte, error) {
	return r.appendAnswer(dst, req, resp, false)
}

func (r *Router) appendAnswer(dst []byte, req *wire.RouteRequest, resp *wire.RouteResponse, book bool) ([]byte, error) {
	out := dst
	if err := r.route(req, resp, book, &out); err != nil {
		return dst, err
	}
	return out, nil
}

// match hashes req's prompt into s.seqs (sequence hashes, first block first) and matches them
// against m's index into s.m, raised to the model's predicted depths with predict-on-route; p
// learns the block count. s.tseqs gets the identities the blocks are booked under. clk, if set, learns when each phase ended (phases.go).
func (s *scratch) match(r *Router, m *model, req *wire.RouteRequest, p *scoring.Params, clk *phaseClock) {
	if clk != nil {
		clk[0] = monoNow()
	}
	chained := false
	switch {
	case req.ByHash:
		s.seqs = append(s.seqs[:0], req.Hashes...)
	case clk == nil:
		// Hashed and chained in one pass; a sampled request times the two apart, below.
		s.seqs = s.h.AppendSequence(s.seqs[:0], req.Tokens, m.blockSize, radix.LoRASeed(req.LoRA))
		chained = true
	default:
		s.seqs = s.h.AppendLocal(s.seqs[:0], req.Tokens, m.blockSize, radix.LoRASeed(req.LoRA))
	}
	if clk != nil {
		clk[1] = monoNow()
	}
	if !chained {
		radix.ChainInPlace(s.seqs, 0, false)
	}
	if clk != nil {
		clk[2] = monoNow()
	}
	s.tseqs = s.seqs
	if m.track.key != nil && !req.ByHash {
		bs, cs := m.track.seeds(m, req.LoRA)
		s.kseqs = s.h.AppendTracking(s.kseqs[:0], req.Tokens, m.blockSize, bs, cs)
		s.tseqs = s.kseqs
	}
	p.Blocks = len(s.seqs)
	m.ix.Match(s.seqs, &s.m)
	if m.pred != nil && m.pred.merge(s, m.list.Load(), r.cfg.Now()) {
		r.predictRaised.Add(1)
	}
	if clk != nil {
		clk[3] = monoNow()
	}
}

// params checks req for model m and fills p with its scoring parameters: the router's, then
// the request's mode, weight, temperature, prefill tracking and cost terms (Dynamo's
// router_config_override), and the prompt's length. The hashes of a request
// by hash are a whole prompt's (its ISL within their last block), or with prefix a longer
// prompt's first blocks (Dynamo's selection service's isl_tokens).
func (r *Router) params(m *model, req *wire.RouteRequest, prefix bool, p *scoring.Params) error {
	*p = scoring.Params{
		Mode:         scoring.Mode(req.Mode),
		BlockSize:    m.blockSize,
		Weight:       r.cfg.OverlapWeight,
		Temperature:  r.cfg.Temperature,
		TrackPrefill: req.TrackPrefill.Or(!r.cfg.NoTrackPrefill),
		Formula:      r.cfg.Cost,
		Terms:        *r.cfg.Terms,
		Tiers:        *r.cfg.TierCredit,
	}
	if p.Formula == scoring.CostTTFT {
		// A request that sets one of Dynamo's cost weights (router_config_override) is
		// scored by the formula it belongs to, as Dynamo would score it.
		switch {
		case req.HasWeight:
			p.Formula = scoring.CostV1
		case req.HasCredit || req.HasLoadScale:
			p.Formula = scoring.CostMain
		}
	}
	if p.Formula == scoring.CostTTFT || r.cfg.DecayPrefill {
		p.Step, p.CacheWeight, p.Now = *m.step.Load(), r.cfg.CacheWeight, r.cfg.Now()
		p.Step.RequestMs = r.tracker.MeanLifetime() / r.tracker.FleetSlowness()
		p.Decay = true
	}
	if p.Mode == scoring.Default {
		p.Mode = r.cfg.Mode
	}
	if !p.Mode.Valid() {
		return fieldErr(ErrInvalid, "mode", "unknown mode %d", req.Mode)
	}
	if req.HasCredit {
		if !(req.OverlapCredit >= 0) || math.IsInf(req.OverlapCredit, 1) {
			return fieldErr(ErrInvalid, "overlap_score_credit", "%v is not a finite number ≥ 0", req.OverlapCredit)
		}
		p.Credit = req.OverlapCredit
	}
	if req.HasLoadScale {
		if !(req.PrefillLoadScale >= 0) || math.IsInf(req.PrefillLoadScale, 1) {
			return fieldErr(ErrInvalid, "prefill_load_scale", "%v is not a finite number ≥ 0", req.PrefillLoadScale)
		}
		p.LoadScale = req.PrefillLoadScale
	}
	if req.HasWeight {
		if !(req.Weight >= 0) || math.IsInf(req.Weight, 1) {
			return fieldErr(ErrInvalid, "overlap_score_weight", "%v is not a finite number ≥ 0", req.Weight)
		}
		p.Weight = req.Weight
		if p.Formula == scoring.CostMain {
			// Dynamo main reads the deprecated weight as the prefill load scale, over the
			// override's own, and a weight of 0 as no credit either (config.rs,
			// RouterConfigOverride's TryFrom).
			p.LoadScale = req.Weight
			if req.Weight == 0 {
				p.Credit = 0
			}
		}
	}
	if req.HasTemperature {
		if !(req.Temperature >= 0) || math.IsInf(req.Temperature, 1) {
			return fieldErr(ErrInvalid, "router_temperature", "%v is not a finite number ≥ 0", req.Temperature)
		}
		p.Temperature = req.Temperature
	}
	if math.IsNaN(req.PriorityJump) || math.IsInf(req.PriorityJump, 0) {
		return fieldErr(ErrInvalid, "priority_jump", "%v is not a finite number", req.PriorityJump)
	}
	if p.Mode == scoring.Direct && !req.HasPinned {
		return fieldErr(ErrInvalid, "pinned_worker", "direct mode needs a pinned worker")
	}
	bs := m.blockSize
	if req.ByHash {
		n := len(req.Hashes)
		if n == 0 || n > MaxTokens/bs {
			return fieldErr(ErrInvalid, "block_hashes", "%d hashes: want 1 to %d", n, MaxTokens/bs)
		}
		p.ISL = int(req.ISL)
		if p.ISL == 0 {
			p.ISL = n * bs
		}
		if p.ISL < n*bs || !prefix && p.ISL >= (n+1)*bs {
			return fieldErr(ErrInvalid, "isl", "%d tokens disagree with %d full blocks of %d tokens", p.ISL, n, bs)
		}
		return nil
	}
	n := len(req.Tokens)
	if n == 0 || n > MaxTokens {
		return fieldErr(ErrInvalid, "token_ids", "%d tokens: want 1 to %d", n, MaxTokens)
	}
	if req.ISL != 0 && int(req.ISL) != n {
		return fieldErr(ErrInvalid, "isl", "isl %d but %d token ids", req.ISL, n)
	}
	p.ISL = n
	return nil
}

// route answers req in resp. With enc set it also appends the encoded answer to *enc: resp then
// holds the answer's header, and its candidates unless the kv path encoded them straight into
// *enc.
func (r *Router) route(req *wire.RouteRequest, resp *wire.RouteResponse, book bool, enc *[]byte) error {
	m := r.model(req.Model)
	if m == nil {
		if req.Model == "" {
			return fieldErr(ErrInvalid, "model", "required: the name of the model to route for, as its workers registered it, e.g. \"llama\"")
		}
		return fieldErr(ErrUnknownModel, "model", "no worker is registered for model %q", req.Model)
	}
	if book {
		if err := checkBookID(req.RequestID); err != nil {
			return err
		}
	} else if len(req.RequestID) > scoring.MaxRequestID {
		return fieldErr(ErrInvalid, "request_id", "%d bytes, at most %d", len(req.RequestID), scoring.MaxRequestID)
	}
	sticky := false
	if req.SessionID != "" && r.aff != nil && book && !req.HasPinned {
		if k, ok := r.sticky(m, req, true); ok {
			cp := *req
			cp.HasPinned, cp.PinnedWorker, cp.PinnedRank = true, k.ID, k.Rank
			req, sticky = &cp, true
		}
	}
	var p scoring.Params
	if err := r.params(m, req, false, &p); err != nil {
		return err
	}
	s := r.scratch.Get()
	defer r.scratch.Put(s)
	s.noReuse = !req.AssumeReuse.Or(!r.cfg.NoAssumeReuse)
	var clk *phaseClock
	if book {
		clk = r.timePhases(s)
	}
	s.match(r, m, req, &p, clk)
	list := m.list.Load()
	if len(s.m.Slots) > 0 && rand.Uint32()&uint32(r.cfg.HitSample-1) == 0 {
		noteHits(m, list, s.m.Slots)
	}
	limit := int(req.MaxCandidates)
	if limit == 0 {
		limit = r.cfg.MaxCandidates
	}
	th := m.busy.Load()
	if !book {
		// A match answers for every worker, as Dynamo's /query, and ignores Disagg.
		_, _, encoded, err := r.pick(s, m, list, &p, req, resp, limit, false, th, enc)
		if err != nil {
			return err
		}
		r.matched.Inc()
		if enc != nil && !encoded {
			*enc = wire.AppendRouteResponse(*enc, resp)
		}
		return nil
	}
	if req.Disagg {
		err := r.routeDisagg(s, m, list, &p, req, resp, limit, th, enc, sticky)
		if err == nil && clk != nil {
			r.observePhases(clk)
		}
		return err
	}
	// A route serves the request whole: never on a prefill worker (role.go).
	serve := list.serve
	if len(serve.keys) == 0 {
		return fieldErr(ErrUnknownWorker, "model", "model %q has only prefill workers: none serves a request whole", req.Model)
	}
	pos, cached, encoded, err := r.pick(s, m, serve, &p, req, resp, limit, true, th, enc)
	if err != nil {
		return err
	}
	w := serve.ws[pos]
	if err := r.bookStage(s, m, w, &p, req, req.RequestID, cached, s.noReuse, true); err != nil {
		return err
	}
	r.noteRouted(m, s, p.ISL, cached)
	if req.SessionID != "" && r.aff != nil && (sticky || !req.HasPinned) {
		r.bind(m.name, req.SessionID, w.key)
	}
	if clk != nil {
		r.observePhases(clk)
	}
	resp.Cached = uint32(cached)
	if enc != nil && !encoded {
		*enc = wire.AppendRouteResponse(*enc, resp)
	}
	return nil
}

// noteRouted counts a routed request of model m of isl prompt tokens whose worker holds cached
// blocks of it, against the deepest prefix any worker held (s's match): the hit achieved and
// the hit available.
func (r *Router) noteRouted(m *model, s *scratch, isl int, cached int32) {
	bs := int64(m.blockSize)
	achieved := min(int64(cached)*bs, int64(isl))
	r.routed.Inc()
	r.promptTokens.Add(int64(isl))
	r.cachedTokens.Add(achieved)
	deepest := cached
	for _, d := range s.m.Depth {
		deepest = max(deepest, d)
	}
	m.hits.prompt.Add(int64(isl))
	m.hits.achieved.Add(achieved)
	m.hits.available.Add(min(int64(deepest)*bs, int64(isl)))
}

// pick scores req against list's workers with p and answers in resp; with book it chooses one
// and returns its position in list and its cached blocks (not booked yet: bookStage books it).
// th, if set, takes the overloaded workers out of a route's candidates. enc is as scoreKV's:
// encoded says the answer went to *enc already.
func (r *Router) pick(s *scratch, m *model, list *workerList, p *scoring.Params, req *wire.RouteRequest, resp *wire.RouteResponse,
	limit int, book bool, th *Thresholds, enc *[]byte) (pos, cached int32, encoded bool, err error) {
	// The fast path prices a worker by its device depth alone: a prompt that a lower storage
	// tier extends for some worker takes the general path, which credits the extension.
	// A model with a rank out of routing (eject.go) takes the general path too, which skips
	// it; one with a rank that failed since its last answer, but none out, makes the suspect
	// ranks lose ties on either path.
	// What predict keeps for the booking is this pick's alone (predictedFor says whose).
	s.shared, s.predicted, s.predictedFor = 0, 0, nil
	eject := book && r.ejecting(m)
	out := false
	if eject {
		s.now = r.cfg.Now()
		out = s.now < m.health.outMax.Load()
	}
	if p.Mode == scoring.KV && p.Temperature == 0 && !req.HasPinned && len(req.Allowed) == 0 && th == nil && !out &&
		len(s.m.Tiers) == 0 && len(list.keys) > 0 && !r.general && !r.log.Enabled(context.Background(), slog.LevelDebug) {
		if err := p.Check(); err != nil {
			return 0, 0, false, fieldErr(ErrInvalid, "request", "%v", err)
		}
		s.eject = eject
		pos, cached, encoded = s.scoreKV(r, m.ix, list, p, req, resp, limit, book, enc)
		s.eject = false
		if book && pos >= 0 && p.Formula == scoring.CostTTFT {
			c := s.chosenCandidate(pos)
			s.predict(p, &c, list.loads[pos], resp)
			s.predictedFor = list.ws[pos]
		}
		return pos, cached, encoded, nil
	}
	if book {
		// A match answers for every worker, as Dynamo's /query. s.now is read already.
		s.th, s.eject = th, eject
	}
	chosen, err := s.general(r, m.ix, list, p, req, book)
	s.th, s.eject = nil, false
	if err != nil {
		return 0, 0, false, err
	}
	if book {
		pos, cached = s.worker(chosen), s.cands[chosen].Cached
	}
	s.fill(resp, req, p, chosen, book, limit)
	if book && p.Formula == scoring.CostTTFT {
		s.predict(p, &s.cands[chosen], list.loads[pos], resp)
		s.predictedFor = list.ws[pos]
	}
	return pos, cached, false, nil
}

// bookStage books one stage of request req on worker w under key: the prompt tokens w must
// prefill (its uncached ones, if p tracks prefill) and, with blocks, the prompt's blocks
// (under random hashes with noReuse: Dynamo's assume_kv_reuse=false), with its output blocks
// as Config.TrackOutputBlocks says. It tells the other replicas, and in approximate mode and
// with predict-on-route records the blocks as held by w: a prefill worker computes them, a
// decode worker receives them.
func (r *Router) bookStage(s *scratch, m *model, w *rankWorker, p *scoring.Params, req *wire.RouteRequest, key string, cached int32, noReuse, blocks bool) error {
	// Under CostTTFT (predict set s.shared), blocks booked on w by requests ahead count as
	// computed: the engine computes a prefix its queue shares once, and the prompt-side work
	// queued there (what the next request's predicted time waits for) is that once. Dynamo's
	// formulas book its prompt less the device's cache alone, as Dynamo does.
	if s.predictedFor != w {
		// Another pick's (a disaggregated request's prefill worker, then served whole).
		s.shared, s.predicted = 0, 0
	}
	prefill := int64(p.ISL) - int64(max(cached, s.shared))*int64(m.blockSize)
	s.shared, s.predictedFor = 0, nil
	if !p.TrackPrefill {
		prefill = 0 // not tracked: not booked either (Dynamo's track_prefill_tokens=false)
	}
	var seqs []uint64
	var out scoring.Output
	if blocks {
		seqs = s.tseqs
		if noReuse {
			// The request's blocks under random hashes, which no other request's share (the
			// index still matched the real ones).
			s.rseqs = slices.Grow(s.rseqs[:0], len(seqs))[:len(seqs)]
			for i := range s.rseqs {
				s.rseqs[i] = rand.Uint64()
			}
			seqs = s.rseqs
		}
		if r.cfg.TrackOutputBlocks {
			out = scoring.Output{ISL: int64(p.ISL), BlockSize: int32(m.blockSize), Expected: int64(req.ExpectedOSL)}
		}
	}
	out.PredictedTTFT, s.predicted = s.predicted, 0
	if err := r.tracker.BookOutput(key, w.load, seqs, prefill, r.cfg.Now()+int64(r.cfg.RequestExpiry), out); err != nil {
		if err == scoring.ErrDuplicateRequest {
			return fieldErr(ErrConflict, "request_id", "request %q is already active", req.RequestID)
		}
		return fieldErr(ErrUnknownWorker, "worker", "%v", err)
	}
	if r.cfg.Share != nil {
		r.cfg.Share.Booked(m.name, w.key, key, seqs, prefill, r.cfg.RequestExpiry)
	}
	r.placedFor(m, w, s.seqs, key)
	return nil
}

// checkBookID checks the id of a request to book.
func checkBookID(id string) error {
	switch {
	case id == "":
		return fieldErr(ErrInvalid, "request_id", "a routed request needs an id")
	case len(id) > scoring.MaxRequestID:
		return fieldErr(ErrInvalid, "request_id", "%d bytes, at most %d", len(id), scoring.MaxRequestID)
	case isRemoteKey(id):
		return fieldErr(ErrInvalid, "request_id", "ids starting with a NUL byte are reserved for other replicas' requests")
	}
	return nil
}

// general scores every allowed worker of list one by one and returns the chosen candidate's
// position in s.cands (if book).
func (s *scratch) general(r *Router, ix *radix.Index, list *workerList, p *scoring.Params, req *wire.RouteRequest, book bool) (int, error) {
	if s.noReuse {
		s.am.Slots, s.am.Depth = s.am.Slots[:0], s.am.Depth[:0] // nothing booked is shared
	} else {
		r.tracker.Match(s.tseqs, &s.am)
	}
	if err := s.candidates(r, ix, list, p, req); err != nil {
		return 0, err
	}
	for i, slot := range s.m.Slots {
		if int(slot) < len(list.bySlot) {
			if pos := list.bySlot[slot]; pos >= 0 {
				if c := s.cand(pos); c >= 0 {
					s.cands[c].Cached = s.m.Depth[i]
				}
			}
		}
	}
	for i := range s.m.Tiers {
		x := &s.m.Tiers[i]
		if int(x.Slot) < len(list.bySlot) {
			if pos := list.bySlot[x.Slot]; pos >= 0 {
				if c := s.cand(pos); c >= 0 {
					s.cands[c].Ext = tierExt(x, s.cands[c].Cached)
				}
			}
		}
	}
	for i, slot := range s.am.Slots {
		if int(slot) < len(list.byActive) {
			if pos := list.byActive[slot]; pos >= 0 {
				if c := s.cand(pos); c >= 0 {
					s.cands[c].Shared = s.am.Depth[i]
				}
			}
		}
	}
	var chosen int
	var err error
	if book {
		chosen, err = r.chooser.Choose(s.cands, p, r.cfg.Rand)
		tied := chosen
		if err == nil && s.eject {
			chosen = s.avoidSuspect(list, p, chosen, r.cfg.Rand)
		}
		if err == nil && s.eject && r.log.Enabled(context.Background(), slog.LevelDebug) {
			s.logHealth(r, req, list, tied, chosen)
		}
	} else {
		if err = p.Check(); err == nil {
			scoring.Score(s.cands, p)
		}
	}
	if err != nil {
		return 0, fieldErr(ErrInvalid, "request", "%v", err)
	}
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.logDecision(req, p, s.cands, chosen, book)
	}
	return chosen, nil
}

// tierExt returns the lower tiers' extensions of x beyond a device depth of cached blocks:
// x's own, less the blocks a predicted depth (predict-on-route) already counts as the device's,
// taken off the host's first, then the disk's, then the external's.
func tierExt(x *radix.TierMatch, cached int32) scoring.TierExt {
	e := [3]int32{x.Blocks[kvevent.Host], x.Blocks[kvevent.Disk], x.Blocks[kvevent.External]}
	over := cached - x.Blocks[kvevent.Device]
	for i := range e {
		if over <= 0 {
			break
		}
		cut := min(over, e[i])
		e[i] -= cut
		over -= cut
	}
	return scoring.TierExt{Host: e[0], Disk: e[1], External: e[2]}
}

// candidates fills s.cands with the allowed workers of list and their loads, less the
// overloaded ones when s.th is set.
func (s *scratch) candidates(r *Router, ix *radix.Index, list *workerList, p *scoring.Params, req *wire.RouteRequest) error {
	n := len(list.keys)
	s.tree = slices.Grow(s.tree[:0], n)[:n]
	ix.FillBlocks(list.slots, s.tree)
	nOver := 0
	if s.th != nil {
		s.over = slices.Grow(s.over[:0], n)[:n]
		nOver = r.markOverloaded(s.th, list, s.over, req.Model, true)
	}
	nOut := 0
	if s.eject {
		nOut = s.markOut(list)
	}
	s.all = !req.HasPinned && len(req.Allowed) == 0 && nOver == 0 && nOut == 0
	if s.all {
		s.cands = slices.Grow(s.cands[:0], n)[:n]
		for i, k := range list.keys {
			l, c := list.loads[i], &s.cands[i]
			c.Worker, c.Rank, c.Cached, c.Ext, c.Shared, c.Tree = k.ID, k.Rank, 0, scoring.TierExt{}, 0, s.tree[i]
			c.ActiveBlocks, c.ActivePrefill, c.ActiveRequests = l.ActiveBlocks(), s.activePrefill(l, p), l.Requests()
			c.Pending = l.Pending()
			c.Slow = l.SlownessStep()
			c.DeviceWeight = list.ws[i].reg.getWeight()
		}
		if n == 0 {
			return fieldErr(ErrUnknownWorker, "model", "model %q has no registered worker", req.Model)
		}
		return nil
	}
	s.cands, s.pos = s.cands[:0], s.pos[:0]
	s.at = slices.Grow(s.at[:0], n)[:n]
	allowed := req.Allowed
	if len(allowed) > 8 {
		s.allowed = append(s.allowed[:0], allowed...)
		slices.Sort(s.allowed)
		allowed = s.allowed
	}
	eligible, skipped := 0, 0 // allowed, overloaded or not; and out of routing
again:
	for i, k := range list.keys {
		s.at[i] = -1
		switch {
		case req.HasPinned:
			if k.ID != req.PinnedWorker || k.Rank != req.PinnedRank {
				continue
			}
		case len(allowed) > 8:
			if _, ok := slices.BinarySearch(allowed, k.ID); !ok {
				continue
			}
		case len(allowed) > 0:
			if !slices.Contains(allowed, k.ID) {
				continue
			}
		}
		if nOut > 0 && s.isOut[i] {
			skipped++
			continue
		}
		eligible++
		if nOver > 0 && s.over[i] {
			continue
		}
		l := list.loads[i]
		s.at[i] = int32(len(s.cands))
		s.pos = append(s.pos, int32(i))
		s.cands = append(s.cands, scoring.Candidate{
			Worker:         k.ID,
			Rank:           k.Rank,
			Tree:           s.tree[i],
			ActiveBlocks:   l.ActiveBlocks(),
			ActivePrefill:  s.activePrefill(l, p),
			ActiveRequests: l.Requests(),
			Pending:        l.Pending(),
			Slow:           l.SlownessStep(),
			DeviceWeight:   list.ws[i].reg.getWeight(),
		})
	}
	if eligible == 0 && skipped > 0 {
		// Every candidate is out of routing: route among them anyway (Envoy's panic mode).
		r.health.panics.Add(1)
		nOut, skipped = 0, 0
		s.cands, s.pos = s.cands[:0], s.pos[:0]
		goto again
	}
	if len(s.cands) == 0 && eligible > 0 {
		r.overloadRejected.Add(1)
		if req.HasPinned {
			return fieldErr(ErrOverloaded, "pinned_worker", "pinned worker %d is overloaded (busy thresholds: %s)", req.PinnedWorker, s.th)
		}
		return fieldErr(ErrOverloaded, "model", "all eligible workers are overloaded (%d worker ranks of model %q; busy thresholds: %s)", eligible, req.Model, s.th)
	}
	if len(s.cands) == 0 {
		if req.HasPinned {
			return fieldErr(ErrUnknownWorker, "pinned_worker", "worker %d rank %d is not registered for model %q", req.PinnedWorker, req.PinnedRank, req.Model)
		}
		return fieldErr(ErrUnknownWorker, "allowed_workers", "none of the %d allowed workers is registered for model %q", len(req.Allowed), req.Model)
	}
	return nil
}

// fill writes the answer: every candidate in worker order, or, when limit is below their
// number, the chosen worker first and then the lowest logits (ties in worker order), up to limit.
func (s *scratch) fill(resp *wire.RouteResponse, req *wire.RouteRequest, p *scoring.Params, chosen int, book bool, limit int) {
	cands := s.cands
	fillHeader(resp, req, p, book)
	if book {
		resp.Worker, resp.Rank = cands[chosen].Worker, cands[chosen].Rank
	}
	tiered := len(s.m.Tiers) > 0
	add := func(c *scoring.Candidate) {
		resp.Candidates = appendCandidate(resp.Candidates, c)
		if tiered {
			resp.Tiers = append(resp.Tiers, wire.CandidateTiers{Host: uint32(c.Ext.Host), Disk: uint32(c.Ext.Disk), External: uint32(c.Ext.External)})
		}
	}
	if limit <= 0 || limit >= len(cands) {
		for i := range cands {
			add(&cands[i])
		}
		return
	}
	skip := -1
	if book {
		add(&cands[chosen])
		skip, limit = chosen, limit-1
	}
	s.heap = lowest(s.heap, cands, limit, skip)
	for _, e := range s.heap {
		add(&cands[e.pos])
	}
}

// fillHeader writes resp's fields other than the chosen worker, and empties its candidates.
func fillHeader(resp *wire.RouteResponse, req *wire.RouteRequest, p *scoring.Params, book bool) {
	resp.RequestID = req.RequestID
	resp.Mode = wire.Mode(p.Mode)
	resp.Chosen = book
	resp.Worker, resp.Rank = 0, 0
	resp.Blocks = uint32(p.Blocks)
	resp.ISL = uint32(p.ISL)
	resp.Candidates = resp.Candidates[:0]
	resp.Tiers = resp.Tiers[:0]
	resp.Cached = 0
	resp.Prefill, resp.PrefillWorker, resp.PrefillRank = false, 0, 0
	resp.PredictedTTFT = 0
}

func appendCandidate(dst []wire.Candidate, c *scoring.Candidate) []wire.Candidate {
	return append(dst, wireCandidate(c))
}

// wireCandidate is c as an answer carries it.
func wireCandidate(c *scoring.Candidate) wire.Candidate {
	return wire.Candidate{
		Worker:        c.Worker,
		Rank:          c.Rank,
		CachedBlocks:  uint32(c.Cached),
		PrefillTokens: clampU32(c.PrefillTokens),
		ActiveBlocks:  clampU32(c.DecodeBlocks),
		TreeBlocks:    uint64(max(c.Tree, 0)),
		Logit:         c.Logit,
	}
}

// lowest returns, in h's storage, the k candidates other than skip with the lowest (logit,
// index), in that order, kept in a bounded heap while it scans: O(n log k).
func lowest(h []ranked, cands []scoring.Candidate, k, skip int) []ranked {
	h = h[:0]
	for i := range cands {
		if i != skip {
			h = keepLowest(h, ranked{cands[i].Logit, int32(i)}, k)
		}
	}
	slices.SortFunc(h, ranked.compare)
	return h
}

func clampU32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}

// logDecision writes the debug line per candidate, in Dynamo's words.
func (r *Router) logDecision(req *wire.RouteRequest, p *scoring.Params, cands []scoring.Candidate, chosen int, book bool) {
	id := strings.Clone(req.RequestID)
	for i := range cands {
		c := &cands[i]
		r.log.Debug("candidate",
			"request", id,
			"decision", formatDecision(c, p),
			"chosen", book && i == chosen)
	}
}

// activePrefill is worker load l's active prefill tokens as p's formula sees them: with
// p.Decay, decayed by the time its oldest prefill has run until p.Now.
func (s *scratch) activePrefill(l *scoring.Load, p *scoring.Params) int64 {
	if !p.Decay {
		return l.ActivePrefill()
	}
	return p.Step.Decayed(l.ActivePrefill(), l.PrefillSince(), p.Now, l.Requests(), l.ActiveBlocks(), l.Slowness())
}

// predict sets resp's predicted TTFT for the chosen worker c, of load l (the step model's,
// times the worker's learned slowness), and keeps the step model's own in s.predicted for the
// booking to learn the slowness from, when nothing is queued ahead of the request: a queue's
// time depends on the requests in it, which the model knows less well.
func (s *scratch) predict(p *scoring.Params, c *scoring.Candidate, l *scoring.Load, resp *wire.RouteResponse) {
	pr := p.PredictTTFT(c.Cached, c.Shared, c.Ext, c.ActiveBlocks, c.ActivePrefill, c.ActiveRequests)
	resp.PredictedTTFT = pr * l.Slowness()
	s.shared = c.Shared
	s.predicted = 0
	if c.ActivePrefill == 0 {
		s.predicted = pr
	}
}
