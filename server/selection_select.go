package server

import (
	"cmp"
	"container/list"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// The selection service's requests (Dynamo's selection types.rs, input.rs), member for member;
// those kvrouterd does not act on are declared all the same, so that they are not counted as
// unknown. nil is absent or null (Dynamo's Option members).

// selPrompt is Dynamo's PromptRequest, flattened into the requests that carry a prompt.
type selPrompt struct {
	TokenIDs       []uint32        `json:"token_ids"`
	MMRoutingInfo  *selMMRouting   `json:"mm_routing_info"`
	BlockMMInfos   []*selBlockInfo `json:"block_mm_infos"`
	BlockHashes    []int64         `json:"block_hashes"`
	SequenceHashes []int64         `json:"sequence_hashes"`
	ISLTokens      *uint64         `json:"isl_tokens"`
	LoRAName       *string         `json:"lora_name"`
	CacheSalt      *string         `json:"cache_salt"`
	// IsEagle is recorded by Dynamo per partition to hash EAGLE prompts its way; kvrouterd
	// indexes an EAGLE engine's blocks by their tokens as any other's, so it changes nothing.
	IsEagle *bool `json:"is_eagle"`
}

type selMMRouting struct {
	RoutingTokenIDs []uint32        `json:"routing_token_ids"`
	BlockMMInfos    []*selBlockInfo `json:"block_mm_infos"`
}

// selBlockInfo is Dynamo's BlockExtraInfo: a block's multimodal objects.
type selBlockInfo struct {
	MMObjects []struct {
		MMHash  uint64     `json:"mm_hash"`
		Offsets [][]uint64 `json:"offsets"`
	} `json:"mm_objects"`
}

type selWorkerRef struct {
	WorkerID *uint64 `json:"worker_id"`
	DPRank   *uint32 `json:"dp_rank"`
}

// selReserveRequest is Dynamo's request of /select_and_reserve; selSelectRequest, /select's,
// adds advisory. kvrouterd has no queue and no session affinity: priority_jump,
// strict_priority, expected_output_tokens, the session members, affinity_target and
// preferred_taints are accepted and change nothing.
type selReserveRequest struct {
	Model       string  `json:"model_name"`
	Group       string  `json:"routing_group"`
	SelectionID *string `json:"selection_id"`
	selPrompt
	Override             *wire.Override `json:"router_config_override"`
	ExpectedOutputTokens *uint32        `json:"expected_output_tokens"`
	PriorityJump         float64        `json:"priority_jump"`
	StrictPriority       uint32         `json:"strict_priority"`
	SessionID            *string        `json:"session_id"`
	SessionContext       *selSession    `json:"session_context"`
	AffinityTarget       *selWorkerRef  `json:"affinity_target"`
	PinnedWorker         *selWorkerRef  `json:"pinned_worker"`
	AllowedWorkerIDs     []uint64       `json:"allowed_worker_ids"`
	RoutingConstraints   struct {
		RequiredTaints  []string           `json:"required_taints"`
		PreferredTaints map[string]float64 `json:"preferred_taints"`
	} `json:"routing_constraints"`
}

// selSession is Dynamo's SelectionSessionContext: accepted and unused, but refused as serde
// refuses it (check).
type selSession struct {
	SessionID       *string `json:"session_id"`
	ParentSessionID *string `json:"parent_session_id"`
	SessionFinal    *bool   `json:"session_final"`
	InputTrigger    *string `json:"input_trigger"`
}

// check is serde's verdict on a session_context that decoded: session_id is required, and
// input_trigger one of its enum's variants (Dynamo's SelectionInputTrigger, snake_case).
func (c *selSession) check() error {
	if c == nil {
		return nil
	}
	if c.SessionID == nil {
		return errors.New("session_context: missing field `session_id`")
	}
	if t := c.InputTrigger; t != nil {
		switch *t {
		case "user_message", "tool_result", "other":
		default:
			return fmt.Errorf("session_context.input_trigger: unknown variant `%s`, expected one of `user_message`, `tool_result`, `other`", *t)
		}
	}
	return nil
}

type selSelectRequest struct {
	selReserveRequest
	Advisory bool `json:"advisory"`
}

var selChooseNonNull = []string{"model_name", "routing_group", "priority_jump", "strict_priority", "routing_constraints", "advisory"}

// selReservationRequest is Dynamo's ReservationRequest (POST /reservations).
type selReservationRequest struct {
	Model       string  `json:"model_name"`
	Group       string  `json:"routing_group"`
	SelectionID *string `json:"selection_id"`
	WorkerID    *uint64 `json:"worker_id"`
	DPRank      *uint32 `json:"dp_rank"`
	selPrompt
	Override               *wire.Override `json:"router_config_override"`
	ExpectedOutputTokens   *uint32        `json:"expected_output_tokens"`
	EffectivePrefillTokens *uint64        `json:"effective_prefill_tokens"`
	TrackPrefillTokens     *bool          `json:"track_prefill_tokens"`
}

// selLoadsRequest is the body of /potential_loads and /overlap_scores.
type selLoadsRequest struct {
	Model string `json:"model_name"`
	Group string `json:"routing_group"`
	selPrompt
	Override *wire.Override `json:"router_config_override"`
}

// selPart is a partition ready for a request: its schedulable records and block size.
type selPart struct {
	model, group, key string
	bs                int
	recs              map[uint64]*selRecord
}

// part returns the partition of (model, group) if it has a schedulable worker the router
// holds; otherwise it answers Dynamo's 503 and returns false.
func (s *Server) part(ctx *fasthttp.RequestCtx, model, group string) (*selPart, bool) {
	recs, why := s.schedulable(model, group)
	p := &selPart{model: model, group: group, key: partition(model, group), recs: recs}
	if why == "" {
		var ok bool
		if p.bs, ok = s.r.ModelBlockSize(p.key); !ok {
			why = "no schedulable workers for " + partKey(model, group)
		}
	}
	if why != "" {
		s.selError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", why)
		return nil, false
	}
	return p, true
}

// selInput is a prompt normalized: its local block hashes and tokens (local nil when only
// sequence hashes were given), or its sequence hashes.
type selInput struct {
	local []uint64
	seqs  []uint64 // given sequence hashes, when local is nil
	given []uint64 // the sequence hashes given with block hashes, echoed in the answer
	isl   int
}

// normalize turns p into block hashes as Dynamo's input.rs does: mm_routing_info's tokens, or
// token_ids, hashed with the partition's block size, the LoRA name and the cache salt; or the
// block_hashes (salted already), sequence_hashes and isl_tokens trio. seqsOnly takes
// sequence_hashes and isl_tokens without block_hashes (an explicit reservation). Refusals are
// Dynamo's 400 messages; it answers them itself.
func (s *Server) normalize(ctx *fasthttp.RequestCtx, p *selPrompt, bs int, seqsOnly bool) (selInput, bool) {
	bad := func(msg string) (selInput, bool) {
		s.selError(ctx, fasthttp.StatusBadRequest, "invalid", msg)
		return selInput{}, false
	}
	tokens, infos := p.TokenIDs, p.BlockMMInfos
	if p.MMRoutingInfo != nil && len(p.MMRoutingInfo.RoutingTokenIDs) > 0 {
		tokens, infos = p.MMRoutingInfo.RoutingTokenIDs, p.MMRoutingInfo.BlockMMInfos
	}
	if tokens != nil {
		if len(tokens) == 0 {
			return bad("isl_tokens must be greater than 0")
		}
		var mm [][]uint64
		for i, info := range infos {
			if info == nil || len(info.MMObjects) == 0 {
				continue
			}
			if mm == nil {
				mm = make([][]uint64, len(infos))
			}
			for _, o := range info.MMObjects {
				mm[i] = append(mm[i], o.MMHash)
			}
		}
		var h radix.Hasher
		seed := radix.Seed(deref(p.LoRAName), deref(p.CacheSalt))
		return selInput{local: h.AppendLocalMM(nil, tokens, bs, seed, mm), isl: len(tokens)}, true
	}
	switch {
	case p.BlockHashes == nil && !seqsOnly:
		return bad("block_hashes is required without token_ids")
	case p.SequenceHashes == nil:
		return bad("sequence_hashes is required without token_ids")
	case p.ISLTokens == nil:
		return bad("isl_tokens is required without token_ids")
	case *p.ISLTokens == 0:
		return bad("isl_tokens must be greater than 0")
	case p.BlockHashes != nil && len(p.BlockHashes) != len(p.SequenceHashes):
		return bad(fmt.Sprintf("block_hashes length %d must match sequence_hashes length %d", len(p.BlockHashes), len(p.SequenceHashes)))
	case *p.ISLTokens > router.MaxTokens:
		return bad(fmt.Sprintf("isl_tokens %d is over kvrouterd's limit of %d", *p.ISLTokens, router.MaxTokens))
	}
	in := selInput{isl: int(*p.ISLTokens)}
	if p.BlockHashes == nil {
		in.seqs = unsigned(p.SequenceHashes)
		return in, true
	}
	// The index is matched by the chain of the block hashes (Dynamo's public-xxh3-v1 chain, as
	// engines' events carry it); the sequence hashes given are what is booked and compared
	// with the active blocks, as Dynamo's selection does.
	in.local, in.given = unsigned(p.BlockHashes), unsigned(p.SequenceHashes)
	return in, true
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// unsigned reinterprets Dynamo's i64 hashes as the u64 they are, bit for bit.
func unsigned(v []int64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = uint64(x)
	}
	return out
}

// signed is unsigned's inverse, for answers.
func signed(v []uint64) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// routeRequest is the route request of a normalized prompt for partition p: by local block
// hashes, as Dynamo's /query asks the index (the cache salt is in them already), with the
// override's weight and temperature.
// routeRequest is the route request of a selection: the override's weight, temperature, credit
// and load scale apply; its track_prefill_tokens goes through SelectOptions, and its
// assume_kv_reuse is accepted and ignored (a selection books the prompt's real hashes).
func (in *selInput) routeRequest(p *selPart, o *wire.Override) wire.RouteRequest {
	req := wire.RouteRequest{Model: p.key, ByHash: true, Hashes: in.local, ISL: uint32(in.isl)}
	if len(in.local) == 0 && in.isl < p.bs {
		// Shorter than a block: nothing to hash or match, only its length counts; a route
		// request by hashes takes none, so it goes as that many tokens, none hashed.
		req.ByHash, req.Hashes, req.Tokens = false, nil, make([]uint32, in.isl)
	}
	if o != nil && o.OverlapScoreWeight != nil {
		req.HasWeight, req.Weight = true, *o.OverlapScoreWeight
	}
	if o != nil && o.RouterTemperature != nil {
		req.HasTemperature, req.Temperature = true, *o.RouterTemperature
	}
	if o != nil && o.OverlapScoreCredit != nil {
		req.HasCredit, req.OverlapCredit = true, *o.OverlapScoreCredit
	}
	if o != nil && o.PrefillLoadScale != nil {
		req.HasLoadScale, req.PrefillLoadScale = true, *o.PrefillLoadScale
	}
	return req
}

// trackPrefill is the override's track_prefill_tokens, nil for none.
func trackPrefill(o *wire.Override) *bool {
	if o == nil {
		return nil
	}
	return o.TrackPrefillTokens
}

// selWorkerLoad is Dynamo's worker_load of an advisory /select.
type selWorkerLoad struct {
	ActivePrefillTokens  int64   `json:"active_prefill_tokens"`
	PrefillTokenCapacity *uint64 `json:"prefill_token_capacity"`
	TotalKVBlocks        *uint64 `json:"total_kv_blocks,omitempty"`
}

// selOverlap is Dynamo's MooncakeOverlapSummary of one worker, in tokens: gpu the device match,
// cpu that and the host tier's extension, disk that and the disk and external tiers'.
type selOverlap struct {
	Longest int64            `json:"longest_matched"`
	GPU     int64            `json:"gpu"`
	DP      map[string]int64 `json:"dp"`
	CPU     int64            `json:"cpu"`
	Disk    int64            `json:"disk"`
}

func overlapOf(rank uint32, c *router.Scored, bs int) selOverlap {
	gpu := int64(c.Cached) * int64(bs)
	cpu := int64(c.Cached+c.Ext.Host) * int64(bs)
	disk := int64(c.Cached+c.Ext.Blocks()) * int64(bs)
	return selOverlap{Longest: max(gpu, cpu, disk), GPU: gpu, DP: map[string]int64{rankLabel(rank): gpu}, CPU: cpu, Disk: disk}
}

// selSelectResponse is Dynamo's SelectResponse. decode_busy and kv_hint are never present:
// kvrouterd has no busy thresholds and gives no KV-transfer hints.
type selSelectResponse struct {
	SelectionID            *string        `json:"selection_id,omitempty"`
	SequenceHashes         []int64        `json:"sequence_hashes,omitempty"`
	ISLTokens              *int           `json:"isl_tokens,omitempty"`
	TrackPrefillTokens     *bool          `json:"track_prefill_tokens,omitempty"`
	Model                  string         `json:"model_name"`
	Group                  string         `json:"routing_group"`
	WorkerID               uint64         `json:"worker_id"`
	DPRank                 uint32         `json:"dp_rank"`
	Endpoint               string         `json:"endpoint"`
	BlockSize              int            `json:"block_size"`
	Overlap                selOverlap     `json:"overlap"`
	EffectivePrefillTokens int64          `json:"effective_prefill_tokens"`
	PotentialDecodeBlocks  int64          `json:"potential_decode_blocks"`
	WorkerLoad             *selWorkerLoad `json:"worker_load,omitempty"`
}

// selSelect answers /select (book false) and /select_and_reserve: a worker chosen among the
// partition's schedulable ones as /v1/route chooses; booked under the selection id by
// /select_and_reserve, remembered under it for a later POST /reservations by /select.
func (s *Server) selSelect(ctx *fasthttp.RequestCtx, book bool) {
	var j selSelectRequest
	route := "/select"
	var v any = &j
	if book {
		route, v = "/select_and_reserve", &j.selReserveRequest
	}
	nonNull := selChooseNonNull
	if book {
		nonNull = nonNull[:len(nonNull)-1] // advisory is /select's alone: an unknown member here
	}
	keys, ok := s.selJSON(ctx, route, v, nil, nonNull)
	if !ok {
		return
	}
	if pw := j.PinnedWorker; pw != nil && (pw.WorkerID == nil || pw.DPRank == nil) ||
		j.AffinityTarget != nil && j.AffinityTarget.WorkerID == nil {
		s.selError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+"missing field `worker_id` or `dp_rank`")
		return
	}
	if err := j.SessionContext.check(); err != nil {
		s.selError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+err.Error())
		return
	}
	p, ok := s.part(ctx, keys.str("model_name", j.Model, dynDefaultGroup), keys.str("routing_group", j.Group, dynDefaultGroup))
	if !ok {
		return
	}
	id := deref(j.SelectionID)
	if book && j.SelectionID == nil {
		id = uuid4()
	}
	if book && s.r.Booked(id) {
		s.selError(ctx, fasthttp.StatusConflict, "conflict", fmt.Sprintf("selection %s is already reserved or being reserved", id))
		return
	}
	in, ok := s.normalize(ctx, &j.selPrompt, p.bs, false)
	if !ok {
		return
	}
	req := in.routeRequest(p, j.Override)
	if !s.eligible(ctx, p, &j.selReserveRequest, &req) {
		return
	}
	var sel router.Selection
	if err := s.r.Select(&req, router.SelectOptions{TrackPrefill: trackPrefill(j.Override), Seqs: in.given}, &sel); err != nil {
		s.selRouteFail(ctx, p, err)
		return
	}
	w := sel.Chosen.Worker
	if book {
		if err := s.r.Book(p.key, w, id, sel.Seqs, sel.Prefill); err != nil {
			s.selBookFail(ctx, id, err, fmt.Sprintf("selected worker %d is no longer schedulable", w.ID), fasthttp.StatusInternalServerError)
			return
		}
	} else if j.SelectionID != nil {
		s.sel.pending.put(pendingKey{p.model, p.group, id}, &pendingEntry{worker: w, seqs: sel.Seqs, prefill: sel.Prefill})
	}
	rec := p.recs[w.ID]
	out := selSelectResponse{
		Model: p.model, Group: p.group, WorkerID: w.ID, DPRank: w.Rank, Endpoint: deref(rec.Endpoint), BlockSize: p.bs,
		Overlap:                overlapOf(w.Rank, &sel.Chosen, p.bs),
		EffectivePrefillTokens: max(int64(sel.ISL)-int64(sel.Chosen.Cached)*int64(p.bs), 0),
		PotentialDecodeBlocks:  sel.Chosen.DecodeBlocks,
	}
	if book || j.SelectionID != nil {
		out.SelectionID = &id
	}
	if book {
		// The tracking hashes as Dynamo answers them: the client's when it gave them.
		seqs := sel.Seqs
		if in.given != nil {
			seqs = in.given
		}
		out.SequenceHashes, out.ISLTokens, out.TrackPrefillTokens = signed(seqs), &sel.ISL, &sel.TrackPrefill
	}
	if !book && j.Advisory {
		out.WorkerLoad = &selWorkerLoad{ActivePrefillTokens: sel.Chosen.ActivePrefill, PrefillTokenCapacity: rec.MaxBatchedTokens, TotalKVBlocks: rec.TotalKVBlocks}
	}
	s.writeJSON(ctx, &out)
}

// eligible restricts req to the workers j may be sent to: the partition's schedulable ones,
// among allowed_worker_ids if given, with every required taint (kvrouterd's reading of
// Dynamo's routing_constraints: a worker qualifies by carrying the taints required); or the
// pinned worker, which must be one of them. It answers a refusal itself.
func (s *Server) eligible(ctx *fasthttp.RequestCtx, p *selPart, j *selReserveRequest, req *wire.RouteRequest) bool {
	ok := func(rec *selRecord) bool {
		if j.AllowedWorkerIDs != nil && !slices.Contains(j.AllowedWorkerIDs, rec.WorkerID) {
			return false
		}
		for _, t := range j.RoutingConstraints.RequiredTaints {
			if !slices.Contains(rec.Taints, t) {
				return false
			}
		}
		return true
	}
	if pw := j.PinnedWorker; pw != nil {
		id, rank := *pw.WorkerID, *pw.DPRank
		if j.AllowedWorkerIDs != nil && !slices.Contains(j.AllowedWorkerIDs, id) {
			s.selError(ctx, fasthttp.StatusBadRequest, "invalid", fmt.Sprintf("pinned worker %d is not in allowed worker set", id))
			return false
		}
		if rec := p.recs[id]; rec == nil || !rec.hasRank(rank) {
			s.selError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("schedulable worker %d (dp_rank %d) not found for %s", id, rank, partKey(p.model, p.group)))
			return false
		}
		req.HasPinned, req.PinnedWorker, req.PinnedRank = true, id, rank
		return true
	}
	for id, rec := range p.recs {
		if ok(rec) {
			req.Allowed = append(req.Allowed, id)
		}
	}
	if len(req.Allowed) == 0 {
		s.selError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "all eligible workers were rejected by policy filters")
		return false
	}
	slices.Sort(req.Allowed)
	return true
}

// selRouteFail answers a refusal of the router's Select or Score: a request it refuses is 400
// with its message; a worker it does not hold (gone meanwhile) is the partition's 503.
func (s *Server) selRouteFail(ctx *fasthttp.RequestCtx, p *selPart, err error) {
	if errors.Is(err, router.ErrUnknownModel) || errors.Is(err, router.ErrUnknownWorker) {
		s.selError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "no schedulable workers for "+partKey(p.model, p.group))
		return
	}
	s.selFail(ctx, err)
}

// selBookFail answers a refusal of the router's Book of selection id: 409 for an id booked
// already; gone for a worker the router does not hold, with status.
func (s *Server) selBookFail(ctx *fasthttp.RequestCtx, id string, err error, gone string, status int) {
	switch {
	case errors.Is(err, router.ErrConflict):
		s.selError(ctx, fasthttp.StatusConflict, "conflict", fmt.Sprintf("selection %s is already reserved or being reserved", id))
	case errors.Is(err, router.ErrUnknownModel), errors.Is(err, router.ErrUnknownWorker):
		s.selError(ctx, status, "not_found", gone)
	default:
		s.selFail(ctx, err)
	}
}

// selReservationResponse is Dynamo's ReservationResponse.
type selReservationResponse struct {
	SelectionID string `json:"selection_id"`
	Model       string `json:"model_name"`
	Group       string `json:"routing_group"`
	WorkerID    uint64 `json:"worker_id"`
	DPRank      uint32 `json:"dp_rank"`
	Endpoint    string `json:"endpoint"`
}

// selReserve answers POST /reservations: without worker_id, the booking /select remembered
// under the selection id; with it, a booking on that worker of the prompt given.
func (s *Server) selReserve(ctx *fasthttp.RequestCtx) {
	var j selReservationRequest
	keys, ok := s.selJSON(ctx, "/reservations", &j, []string{"selection_id"}, []string{"model_name", "routing_group"})
	if !ok {
		return
	}
	model, group, id := keys.str("model_name", j.Model, dynDefaultGroup), keys.str("routing_group", j.Group, dynDefaultGroup), *j.SelectionID
	pk := pendingKey{model, group, id}
	if j.WorkerID != nil {
		s.sel.pending.take(pk) // the explicit form discards what /select remembered
	}
	p, ok := s.part(ctx, model, group)
	if !ok {
		return
	}
	noPending := func() {
		s.selError(ctx, fasthttp.StatusNotFound, "not_found",
			fmt.Sprintf("no pending selection %s for %s (expired, already used, or never selected)", id, partKey(model, group)))
	}
	if j.WorkerID == nil && s.sel.pending.get(pk) == nil {
		noPending() // a replay of a used selection, booked or not, as Dynamo's docs say
		return
	}
	if s.r.Booked(id) {
		s.selError(ctx, fasthttp.StatusConflict, "conflict", fmt.Sprintf("selection %s is already reserved or being reserved", id))
		return
	}
	var (
		w       radix.WorkerKey
		seqs    []uint64
		prefill int64
	)
	if j.WorkerID == nil {
		e := s.sel.pending.get(pk)
		if e == nil {
			noPending()
			return
		}
		w, seqs, prefill = e.worker, e.seqs, e.prefill
		gone := fmt.Sprintf("schedulable worker %d (dp_rank %d) not found for %s", w.ID, w.Rank, partKey(model, group))
		if rec := p.recs[w.ID]; rec == nil || !rec.hasRank(w.Rank) {
			s.selError(ctx, fasthttp.StatusNotFound, "not_found", gone)
			return
		}
		if err := s.r.Book(p.key, w, id, seqs, prefill); err != nil {
			s.selBookFail(ctx, id, err, gone, fasthttp.StatusNotFound)
			return
		}
		s.sel.pending.take(pk) // used: consumed once booked, left for a retry otherwise
	} else {
		w = radix.WorkerKey{ID: *j.WorkerID, Rank: deref32(j.DPRank)}
		in, ok := s.normalize(ctx, &j.selPrompt, p.bs, true)
		if !ok {
			return
		}
		// Dynamo's order: the request's own, then true with effective_prefill_tokens, then the
		// override's, then the router's.
		track := s.r.TracksPrefill()
		switch {
		case j.TrackPrefillTokens != nil:
			track = *j.TrackPrefillTokens
		case j.EffectivePrefillTokens != nil:
			track = true
		case trackPrefill(j.Override) != nil:
			track = *trackPrefill(j.Override)
		}
		if e := j.EffectivePrefillTokens; e != nil && *e > uint64(in.isl) {
			// Dynamo's text (scheduling InvalidEffectivePrefillTokens), a 400.
			s.selError(ctx, fasthttp.StatusBadRequest, "invalid", fmt.Sprintf("effective_prefill_tokens (%d) must not exceed isl_tokens (%d)", *e, in.isl))
			return
		}
		// The worker is looked up after the prompt and its effective tokens are checked, in
		// Dynamo's order.
		gone := fmt.Sprintf("schedulable worker %d not found for %s", w.ID, partKey(model, group))
		if rec := p.recs[w.ID]; rec == nil || !rec.hasRank(w.Rank) {
			s.selError(ctx, fasthttp.StatusNotFound, "not_found", gone)
			return
		}
		if len(in.local) > 0 {
			// The worker's cached prefix, from the index, as /select would see it.
			req := in.routeRequest(p, j.Override)
			req.HasPinned, req.PinnedWorker, req.PinnedRank = true, w.ID, w.Rank
			var sel router.Selection
			if err := s.r.Select(&req, router.SelectOptions{TrackPrefill: &track, Seqs: in.given}, &sel); err != nil {
				if errors.Is(err, router.ErrUnknownWorker) || errors.Is(err, router.ErrUnknownModel) {
					s.selError(ctx, fasthttp.StatusNotFound, "not_found", gone)
				} else {
					s.selFail(ctx, err)
				}
				return
			}
			seqs, prefill = sel.Seqs, sel.Prefill
		} else {
			// Sequence hashes alone: Dynamo's index is walked by block hashes, so it credits them
			// nothing cached, and kvrouterd does the same (a client's tracking hashes need not be
			// its chain); a prompt shorter than a block has nothing cached either.
			seqs = in.seqs
			if track {
				prefill = int64(in.isl)
			}
		}
		if e := j.EffectivePrefillTokens; e != nil && track {
			prefill = int64(*e)
		}
		if err := s.r.Book(p.key, w, id, seqs, prefill); err != nil {
			s.selBookFail(ctx, id, err, gone, fasthttp.StatusNotFound)
			return
		}
	}
	ctx.SetStatusCode(fasthttp.StatusCreated)
	s.writeJSON(ctx, selReservationResponse{SelectionID: id, Model: model, Group: group, WorkerID: w.ID, DPRank: w.Rank, Endpoint: deref(p.recs[w.ID].Endpoint)})
}

func deref32(p *uint32) uint32 {
	if p == nil {
		return 0
	}
	return *p
}

// selPrefillComplete answers POST /reservations/{id}/prefill_complete.
func (s *Server) selPrefillComplete(ctx *fasthttp.RequestCtx, id string) {
	if s.r.PrefillDone(id) != nil {
		s.selError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("reservation %s not found", id))
		return
	}
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

// selFree answers DELETE /reservations/{id}: the booking completed, its load freed.
func (s *Server) selFree(ctx *fasthttp.RequestCtx, id string) {
	if s.r.Complete(id) != nil {
		s.selError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("reservation %s not found", id))
		return
	}
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

// selOutputBlock answers POST /reservations/{id}/output_block: one more output block booked for
// the reservation, and with decay_fraction its own blocks weighed by it, as Dynamo's
// add_output_block (router.Router.OutputBlock, the mechanism the front door and
// /v1/requests/{id}/output use too).
func (s *Server) selOutputBlock(ctx *fasthttp.RequestCtx, id string) {
	var j struct {
		DecayFraction *float64 `json:"decay_fraction"`
	}
	if _, ok := s.selJSON(ctx, "/reservations/{reservation_id}/output_block", &j, nil, nil); !ok {
		return
	}
	if d := j.DecayFraction; d != nil && !(*d >= 0 && *d <= 1) {
		s.selError(ctx, fasthttp.StatusBadRequest, "invalid", "decay_fraction must be between 0.0 and 1.0")
		return
	}
	var decay float64
	if d := j.DecayFraction; d != nil {
		decay = *d
	}
	if s.r.OutputBlock(id, decay, j.DecayFraction != nil) != nil {
		s.selError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("reservation %s not found", id))
		return
	}
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

// selPotentialLoad is Dynamo's PotentialLoad.
type selPotentialLoad struct {
	WorkerID               uint64 `json:"worker_id"`
	DPRank                 uint32 `json:"dp_rank"`
	PotentialPrefillTokens int64  `json:"potential_prefill_tokens"`
	PotentialDecodeBlocks  int64  `json:"potential_decode_blocks"`
	ActiveRequests         int64  `json:"active_requests"`
}

// selLoads answers GET /loads?model_name&routing_group: the booked load of every worker the
// router holds, by partition; bookings of /v1/route and of the selection service alike.
// kvrouterd has no queue: pending_count and pending_isl_tokens are 0.
func (s *Server) selLoads(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	wantModel, wantGroup := string(args.Peek("model_name")), string(args.Peek("routing_group"))
	type modelLoad struct {
		Model        string             `json:"model_name"`
		Group        string             `json:"routing_group"`
		Loads        []selPotentialLoad `json:"loads"`
		PendingCount int                `json:"pending_count"`
		PendingISL   int                `json:"pending_isl_tokens"`
	}
	var out []*modelLoad
	byKey := map[string]*modelLoad{}
	for _, w := range s.r.Workers() {
		model, group := splitPartition(w.Model)
		if wantModel != "" && model != wantModel || wantGroup != "" && group != wantGroup {
			continue
		}
		ml := byKey[w.Model]
		if ml == nil {
			ml = &modelLoad{Model: model, Group: group, Loads: []selPotentialLoad{}}
			byKey[w.Model] = ml
			out = append(out, ml)
		}
		ml.Loads = append(ml.Loads, selPotentialLoad{WorkerID: w.ID, DPRank: w.Rank,
			PotentialPrefillTokens: w.ActivePrefill, PotentialDecodeBlocks: w.ActiveBlocks, ActiveRequests: w.ActiveRequests})
	}
	slices.SortFunc(out, func(a, b *modelLoad) int { return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group)) })
	for _, ml := range out {
		slices.SortFunc(ml.Loads, func(a, b selPotentialLoad) int {
			return cmp.Or(cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
		})
	}
	if out == nil {
		out = []*modelLoad{}
	}
	s.writeJSON(ctx, out)
}

// selPotential answers /potential_loads (every schedulable rank's load with the prompt added)
// and /overlap_scores (every schedulable rank's cached prefix of it).
func (s *Server) selPotential(ctx *fasthttp.RequestCtx, overlap bool) {
	var j selLoadsRequest
	route := "/potential_loads"
	if overlap {
		route = "/overlap_scores"
	}
	keys, ok := s.selJSON(ctx, route, &j, nil, []string{"model_name", "routing_group"})
	if !ok {
		return
	}
	p, ok := s.part(ctx, keys.str("model_name", j.Model, dynDefaultGroup), keys.str("routing_group", j.Group, dynDefaultGroup))
	if !ok {
		return
	}
	in, ok := s.normalize(ctx, &j.selPrompt, p.bs, false)
	if !ok {
		return
	}
	req := in.routeRequest(p, j.Override)
	for id := range p.recs {
		req.Allowed = append(req.Allowed, id)
	}
	slices.Sort(req.Allowed)
	var sel router.Selection
	if err := s.r.Score(&req, router.SelectOptions{TrackPrefill: trackPrefill(j.Override), Seqs: in.given}, &sel); err != nil {
		s.selRouteFail(ctx, p, err)
		return
	}
	if !overlap {
		out := make([]selPotentialLoad, 0, len(sel.Scores))
		for _, c := range sel.Scores {
			out = append(out, selPotentialLoad{WorkerID: c.Worker.ID, DPRank: c.Worker.Rank,
				PotentialPrefillTokens: c.PrefillTokens, PotentialDecodeBlocks: c.DecodeBlocks, ActiveRequests: c.ActiveRequests})
		}
		s.writeJSON(ctx, out)
		return
	}
	// Each tier's blocks as Dynamo reports them: host_pinned_blocks and disk_blocks cumulative,
	// the extensions apart, the credit as the cost formula weighs them. Dynamo's shared cache
	// is not kept by kvrouterd: it is off.
	type row struct {
		WorkerID            uint64  `json:"worker_id"`
		DPRank              uint32  `json:"dp_rank"`
		Device              int32   `json:"device_blocks"`
		HostPinned          int32   `json:"host_pinned_blocks"`
		Disk                int32   `json:"disk_blocks"`
		HostPinnedExtension int32   `json:"host_pinned_extension_blocks"`
		DiskExtension       int32   `json:"disk_extension_blocks"`
		SharedBeyondDevice  *uint32 `json:"shared_beyond_device_blocks"`
		RouterCreditBlocks  float64 `json:"router_credit_blocks"`
	}
	rows := make([]row, 0, len(sel.Scores))
	for _, c := range sel.Scores {
		disk := c.Ext.Disk + c.Ext.External
		credit := sel.Credit*float64(c.Cached) + sel.Tiers.Host*float64(c.Ext.Host) + sel.Tiers.Disk*float64(disk)
		rows = append(rows, row{WorkerID: c.Worker.ID, DPRank: c.Worker.Rank, Device: c.Cached, HostPinned: c.Cached + c.Ext.Host,
			Disk: c.Cached + c.Ext.Blocks(), HostPinnedExtension: c.Ext.Host, DiskExtension: disk, RouterCreditBlocks: credit})
	}
	s.writeJSON(ctx, map[string]any{
		"block_size": p.bs, "num_blocks": sel.Blocks, "workers": rows,
		"shared_cache": map[string]any{"enabled": false, "total_hit_blocks": 0, "ranges": [][2]int{}, "error": nil},
	})
}

// uuid4 is a random UUID, version 4: the id /select_and_reserve gives a booking that names
// none, as Dynamo does.
func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// pendingKey names a pending selection: Dynamo keys them by partition and selection id.
type pendingKey struct{ model, group, id string }

// pendingEntry is what /select remembered of a selection, to book it as it was chosen.
type pendingEntry struct {
	key     pendingKey
	worker  radix.WorkerKey
	seqs    []uint64
	prefill int64
	expires time.Time
	size    int64
	elem    *list.Element
}

// pendingCache holds the selections /select made with a selection_id until POST
// /reservations books them, bounded as Dynamo bounds its cache: a TTL, a number of entries
// and their bytes; the oldest go first. Safe for concurrent use.
type pendingCache struct {
	ttl        time.Duration
	maxEntries int
	maxBytes   int64
	now        func() time.Time

	mu    sync.Mutex
	m     map[pendingKey]*pendingEntry // REQUIRES mu
	order list.List                    // oldest first; REQUIRES mu
	bytes int64                        // REQUIRES mu
}

func newPendingCache(ttl time.Duration, maxEntries int, maxBytes int64) *pendingCache {
	return &pendingCache{ttl: ttl, maxEntries: maxEntries, maxBytes: maxBytes, now: time.Now, m: map[pendingKey]*pendingEntry{}}
}

// put remembers e under k, replacing what k held; it drops the expired entries and, past a
// bound, the oldest. An entry larger than the byte bound on its own is not kept.
func (c *pendingCache) put(k pendingKey, e *pendingEntry) {
	e.key, e.seqs = k, slices.Clone(e.seqs)
	e.size = int64(8*len(e.seqs) + len(k.model) + len(k.group) + len(k.id) + 128)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	e.expires = now.Add(c.ttl)
	c.removeLocked(c.m[k])
	if e.size > c.maxBytes {
		return
	}
	for f := c.order.Front(); f != nil; f = c.order.Front() {
		old := f.Value.(*pendingEntry)
		if !now.After(old.expires) && len(c.m) < c.maxEntries && c.bytes+e.size <= c.maxBytes {
			break
		}
		c.removeLocked(old)
	}
	e.elem = c.order.PushBack(e)
	c.m[k] = e
	c.bytes += e.size
}

// get returns the entry of k, nil if there is none or it expired.
func (c *pendingCache) get(k pendingKey) *pendingEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[k]
	if e != nil && c.now().After(e.expires) {
		c.removeLocked(e)
		return nil
	}
	return e
}

// take forgets k's entry.
func (c *pendingCache) take(k pendingKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(c.m[k])
}

// removeLocked forgets e (nil: nothing). REQUIRES c.mu.
func (c *pendingCache) removeLocked(e *pendingEntry) {
	if e == nil {
		return
	}
	c.order.Remove(e.elem)
	delete(c.m, e.key)
	c.bytes -= e.size
}

// len is the number of entries held, expired or not.
func (c *pendingCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
