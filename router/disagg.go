package router

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/zeebo/xxh3"
)

// Disaggregated decisions (see role.go for the pools).
//
// A route asking for one (wire.RouteRequest.Disagg) on a model with a prefill worker gets two
// picks: the prefill stage on the prefill pool by the request's full cost (its cached prefix
// and the workers' prefill load), which books its uncached prompt tokens and no blocks, since
// the prefill request generates one token; and the decode stage on the serve pool by load
// alone — overlap weight 0, no own-prefill charge, its blocks booked under random hashes —
// Dynamo's plain decode routing (selector/default.rs: plain disaggregated decode is
// load-only). The decode stage is booked under the request's id, the prefill stage under a key
// of its own (prefillKey), so that each is released on its own:
//
//   - PrefillDone releases the prefill stage whole (its worker is done with the request) and
//     marks the decode stage's prefill done;
//   - Complete releases both; expiry releases each, both carrying the request's deadline;
//   - the other replicas learn of the prefill stage as a request of its own, under the
//     prefill key as its id (replica/SPEC.md): they book, and free, it without knowing it is
//     one, older replicas too.
//
// A model without a prefill worker (none registered, or none among the request's allowed
// workers) serves the request whole on the serve pool (the fallback), or, under
// DisaggConfig.Enforce, refuses it with ErrNoPrefill. A conditional policy may also keep the
// request whole (the bypass): it then goes to the decode worker the router's full cost picks
// on the serve pool, keeping its cache credit (Dynamo: conditional decode retains cache
// credit), with its prefill tracked, as any request served whole.

// Disaggregation outcomes, the label of kvrouterd_disagg_decisions_total.
const (
	DisaggDisaggregated = iota // a prefill and a decode stage
	DisaggBypassed             // kept whole by the conditional policy
	DisaggFallback             // served whole: the model has no prefill worker
	DisaggRefused              // refused: no prefill worker under Enforce
	disaggOutcomes
)

// DisaggOutcomeNames are the outcomes' label values, by outcome.
var DisaggOutcomeNames = [disaggOutcomes]string{"disaggregated", "bypassed", "fallback", "refused"}

// DisaggDecisions returns the count of disaggregated decisions by outcome (DisaggDisaggregated
// and its kin).
func (r *Router) DisaggDecisions() [disaggOutcomes]int64 {
	var out [disaggOutcomes]int64
	for i := range out {
		out[i] = r.disagg[i].Load()
	}
	return out
}

// Prefill stage keys: a NUL byte, which no local id starts with (Route refuses such ids), then
// 0x01 and the request id, or, when that would pass scoring.MaxRequestID bytes, 0x02 and the
// id's 128-bit XXH3. A remote key's second byte is its replica id's first, never 0x00 to 0x01,
// so a prefill key is neither a local id nor another replica's request (share.go).
const (
	prefillMark     = 0x01
	prefillHashMark = 0x02
)

// appendPrefillKey appends the Tracker key of request id's prefill stage to dst.
func appendPrefillKey(dst []byte, id string) []byte {
	if 2+len(id) <= scoring.MaxRequestID {
		dst = append(dst, remoteMark, prefillMark)
		return append(dst, id...)
	}
	h := xxh3.HashString128(id)
	dst = append(dst, remoteMark, prefillHashMark)
	dst = binary.LittleEndian.AppendUint64(dst, h.Hi)
	return binary.LittleEndian.AppendUint64(dst, h.Lo)
}

// releasePrefillStage releases request id's prefill stage, if booked, tells the other
// replicas, and reports whether it was booked. It costs an atomic load while no prefill stage
// is booked.
func (r *Router) releasePrefillStage(id string) bool {
	if r.tracker.Stages() == 0 {
		return false
	}
	s := r.scratch.Get() // its key's memory: a buffer on the stack would escape to the LoadSharer
	defer r.scratch.Put(s)
	s.key = appendPrefillKey(s.key[:0], id)
	key := keyString(s.key)
	r.releaseApprox(key)
	if r.tracker.Complete(key) != nil {
		return false
	}
	if r.cfg.Share != nil {
		r.cfg.Share.Completed(key)
	}
	return true
}

// Disaggregates reports whether a request of model asking for a disaggregated decision
// (wire.RouteRequest.Disagg) can get anything but an aggregated answer: the model has a prefill
// worker now, or Config.Disagg enforces disaggregation (and would refuse it). A caller that asks
// only then, as Dynamo's frontend does, keeps kvrouterd_disagg_decisions_total's fallbacks to
// the requests that wanted a prefill worker. Lock-free.
func (r *Router) Disaggregates(model string) bool {
	if r.cfg.Disagg.Enforce {
		return true
	}
	m := r.model(model)
	return m != nil && m.list.Load().prefill != nil
}

// routeDisagg routes req, which asks for a disaggregated decision, on model m whose worker
// list is full; p, s and the rest are route's, with the request's blocks matched.
func (r *Router) routeDisagg(s *scratch, m *model, full *workerList, p *scoring.Params, req *wire.RouteRequest,
	resp *wire.RouteResponse, limit int, th *Thresholds, enc *[]byte, sticky bool) error {
	cfg := r.cfg.Disagg
	pre, serve := full.prefill, full.serve
	if pre != nil && len(req.Allowed) > 0 && !anyAllowed(pre, req.Allowed) {
		pre = nil
	}
	if len(serve.keys) == 0 {
		return fieldErr(ErrUnknownWorker, "model", "model %q has only prefill workers: none decodes", req.Model)
	}
	if pre == nil {
		if cfg.Enforce {
			r.disagg[DisaggRefused].Add(1)
			r.logDisagg(req, DisaggRefused, nil, nil, 0, 0)
			return fieldErr(ErrNoPrefill, "model", "model %q has no prefill worker, and disaggregation is enforced (--enforce-disagg)", req.Model)
		}
		return r.routeWhole(s, m, serve, p, req, resp, limit, th, enc, sticky, DisaggFallback, 0)
	}
	// A pinned worker (or a session's) pins the stage whose pool holds it; the other stage is
	// free. Copies only then: the common path allocates nothing.
	preReq, decReq := req, req
	if req.HasPinned {
		cp := *req
		cp.HasPinned, cp.PinnedWorker, cp.PinnedRank = false, 0, 0
		if rankAt(pre, pinKey(req)) >= 0 {
			decReq = &cp
		} else {
			preReq = &cp
		}
	}

	var ppos, pcached int32
	picked := false // the prefill stage is chosen (a load policy looked at it)
	if cfg.Policy != DisaggNone {
		// The decode worker the request would go to whole, by the full cost on the serve pool.
		dpos, dcached, _, err := r.pick(s, m, serve, p, decReq, resp, limit, true, th, nil)
		if err != nil {
			return err
		}
		isl := p.ISL
		eff := isl - min(int(dcached)*m.blockSize, isl) // Dynamo's net_new_tokens
		bypass := false
		if cfg.Policy == DisaggISLBounding || cfg.Policy == DisaggISLOrLoad {
			bypass = eff < cfg.EffISLThreshold && float64(eff)/float64(max(isl, 1)) < cfg.EffISLRatioThreshold
		}
		if !bypass && (cfg.Policy == DisaggPrefillLoad || cfg.Policy == DisaggISLOrLoad) {
			ppos, pcached, _, err = r.pick(s, m, pre, p, preReq, &s.presp, 1, true, th, nil)
			switch {
			case errors.Is(err, ErrOverloaded):
				bypass = true // every prefill worker is overloaded: busy, as Dynamo's rejected probe
			case err != nil:
				return err
			default:
				picked = true
				bypass = prefillOver(pre.loads[ppos].ActivePrefill(), cfg.PrefillBusyThreshold, pre.ws[ppos])
			}
		}
		if bypass && cfg.HasDecodeBusyThreshold {
			bypass = !decodeBusy(r, serve, dpos, s.tseqs, p.Blocks, cfg.DecodeBusyThreshold)
		}
		if bypass {
			return r.bookWhole(s, m, serve, dpos, dcached, p, req, resp, enc, sticky, DisaggBypassed, eff)
		}
	}
	if !picked {
		var err error
		if ppos, pcached, _, err = r.pick(s, m, pre, p, preReq, &s.presp, 1, true, th, nil); err != nil {
			return err
		}
	}
	pw := pre.ws[ppos]
	// The decode stage: by load alone, nothing cached counts, nothing prefilled is charged, its
	// blocks shared with no other request.
	dp := *p
	dp.Weight, dp.TrackPrefill, dp.Credit = 0, false, 0
	noReuse := s.noReuse
	s.noReuse = true
	dpos, _, _, err := r.pick(s, m, serve, &dp, decReq, resp, limit, true, th, nil)
	s.noReuse = noReuse
	if err != nil {
		return err
	}
	dw := serve.ws[dpos]
	if err := r.bookStage(s, m, dw, &dp, req, req.RequestID, 0, true, true); err != nil {
		return err
	}
	s.key = appendPrefillKey(s.key[:0], req.RequestID)
	if err := r.bookPrefill(s, m, pw, p, keyString(s.key), pcached); err != nil {
		// The decode stage alone is no answer: take it back.
		if r.tracker.Complete(req.RequestID) == nil && r.cfg.Share != nil {
			r.cfg.Share.Completed(req.RequestID)
		}
		return err
	}
	r.noteRouted(m, s, p.ISL, pcached)
	r.disagg[DisaggDisaggregated].Add(1)
	if req.SessionID != "" && r.aff != nil && (sticky || !req.HasPinned) {
		r.bind(m.name, req.SessionID, dw.key)
	}
	resp.Prefill, resp.PrefillWorker, resp.PrefillRank = true, pw.key.ID, pw.key.Rank
	resp.Cached = uint32(pcached)
	r.logDisagg(req, DisaggDisaggregated, pw, dw, int(pcached), 0)
	if enc != nil {
		*enc = wire.AppendRouteResponse(*enc, resp)
	}
	return nil
}

// bookPrefill books a prefill stage on w under key: the prompt tokens it must prefill (its
// uncached ones, if p tracks prefill), no blocks. The other replicas learn of it as a request
// of its own; approximate mode and predict-on-route record its blocks on w, which computes
// them.
func (r *Router) bookPrefill(s *scratch, m *model, w *rankWorker, p *scoring.Params, key string, cached int32) error {
	prefill := int64(p.ISL) - int64(cached)*int64(m.blockSize)
	if !p.TrackPrefill {
		prefill = 0
	}
	if err := r.tracker.BookStage(key, w.load, prefill, r.cfg.Now()+int64(r.cfg.RequestExpiry)); err != nil {
		if err == scoring.ErrDuplicateRequest {
			return fieldErr(ErrConflict, "request_id", "the prefill stage of this request is already active")
		}
		return fieldErr(ErrUnknownWorker, "worker", "%v", err)
	}
	if r.cfg.Share != nil {
		r.cfg.Share.Booked(m.name, w.key, key, nil, prefill, r.cfg.RequestExpiry)
	}
	r.placedFor(m, w, s.seqs, key)
	return nil
}

// routeWhole serves a disaggregated request whole on the serve pool, as a route without Disagg,
// counting outcome.
func (r *Router) routeWhole(s *scratch, m *model, serve *workerList, p *scoring.Params, req *wire.RouteRequest,
	resp *wire.RouteResponse, limit int, th *Thresholds, enc *[]byte, sticky bool, outcome int, eff int) error {
	pos, cached, _, err := r.pick(s, m, serve, p, req, resp, limit, true, th, nil)
	if err != nil {
		return err
	}
	return r.bookWhole(s, m, serve, pos, cached, p, req, resp, enc, sticky, outcome, eff)
}

// bookWhole books req whole on serve's worker at pos, chosen by pick into resp.
func (r *Router) bookWhole(s *scratch, m *model, serve *workerList, pos, cached int32, p *scoring.Params, req *wire.RouteRequest,
	resp *wire.RouteResponse, enc *[]byte, sticky bool, outcome int, eff int) error {
	w := serve.ws[pos]
	if err := r.bookStage(s, m, w, p, req, req.RequestID, cached, s.noReuse, true); err != nil {
		return err
	}
	r.noteRouted(m, s, p.ISL, cached)
	r.disagg[outcome].Add(1)
	if req.SessionID != "" && r.aff != nil && (sticky || !req.HasPinned) {
		r.bind(m.name, req.SessionID, w.key)
	}
	resp.Cached = uint32(cached)
	r.logDisagg(req, outcome, nil, w, int(cached), eff)
	if enc != nil {
		*enc = wire.AppendRouteResponse(*enc, resp)
	}
	return nil
}

// decodeBusy is Dynamo's decode gate: whether serve's worker at pos would hold more than
// threshold × its KV capacity with the request's blocks counted (true while its capacity is
// unknown: the gate then denies, as Dynamo's does without the signal).
func decodeBusy(r *Router, serve *workerList, pos int32, seqs []uint64, blocks int, threshold float64) bool {
	w := serve.ws[pos]
	capacity := w.reg.capacity.Load()
	if capacity <= 0 {
		return true
	}
	l := serve.loads[pos]
	potential := l.ActiveBlocks() + int64(blocks) - int64(r.tracker.Shared(l, seqs))
	return float64(potential) > threshold*float64(capacity)
}

// anyAllowed reports whether one of list's workers is among allowed.
func anyAllowed(list *workerList, allowed []uint64) bool {
	for _, k := range list.keys {
		for _, id := range allowed {
			if k.ID == id {
				return true
			}
		}
	}
	return false
}

// logDisagg writes the debug line of a disaggregated decision: its outcome, the workers of
// its stages, the prefill worker's cached blocks (or, served whole, the worker's) and, for a
// bypass, the uncached tokens the policy weighed.
func (r *Router) logDisagg(req *wire.RouteRequest, outcome int, pw, dw *rankWorker, cached, eff int) {
	if !r.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []any{"request", strings.Clone(req.RequestID), "model", strings.Clone(req.Model),
		"outcome", DisaggOutcomeNames[outcome], "policy", r.cfg.Disagg.Policy.String(), "cached_blocks", cached}
	if pw != nil {
		attrs = append(attrs, "prefill_worker", pw.key.ID, "prefill_dp_rank", pw.key.Rank)
	}
	if dw != nil {
		attrs = append(attrs, "worker", dw.key.ID, "dp_rank", dw.key.Rank)
	}
	if outcome == DisaggBypassed {
		attrs = append(attrs, "net_new_tokens", eff)
	}
	r.log.Debug("disaggregation decision", attrs...)
}

// pinKey is the worker req pins.
func pinKey(req *wire.RouteRequest) radix.WorkerKey {
	return radix.WorkerKey{ID: req.PinnedWorker, Rank: req.PinnedRank}
}
