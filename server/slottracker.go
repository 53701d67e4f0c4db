package server

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// Dynamo's standalone slot tracker (python -m dynamo.slot_tracker, port 8091; lib/kv-router
// services/slot_tracker on ai-dynamo/dynamo main): workers registered by hand per (model_name,
// routing_group), request lifecycles (/add, /prefill_complete, /free) given as chained sequence
// hashes, and the loads they make (/loads, /potential_loads). Its routes, bodies, statuses and
// messages are Dynamo's; what it reports is the Router's own load tracking: an /add is a booking
// like a routed request's, so /loads shows the load of every booking on a worker (/v1/route's,
// the front door's, the selection service's and the slot tracker's), and the router's decisions
// see the slot tracker's requests. docs/dynamo.md, "Slot tracker".

// slotTracker is the slot tracker's registry: its partitions, their workers and the request ids
// it booked. Safe for concurrent use; mu serialises the lifecycle writes, as Dynamo's per-tracker
// lifecycle lock does, so that a registration, an add and a removal never interleave.
type slotTracker struct {
	mu     sync.Mutex
	parts  map[stKey]*stPart // REQUIRES mu
	prefix string            // of the booking ids, unique to this process
	next   uint64            // REQUIRES mu: the booking ids' counter
}

// stKey is a tracker: Dynamo's TrackerKey.
type stKey struct{ model, group string }

// stPart is one tracker's workers and requests. All REQUIRES slotTracker.mu.
type stPart struct {
	blockSize uint32
	workers   map[uint64]*stWorker
	reqs      map[string]*stReq // by the client's request_id
	swept     int               // len(reqs) after the last sweep of expired bookings
}

type stWorker struct {
	dpStart, dpSize uint32
	// owned: the slot tracker registered the worker with the Router, and removes it with its
	// own /unregister; otherwise the worker was the Router's already (its KV events, the
	// indexer API) and keeps it, less the ranks added, which leave.
	owned bool
	added []uint32
}

func (w *stWorker) hasRank(r uint32) bool { return r >= w.dpStart && r-w.dpStart < w.dpSize }

type stReq struct {
	booking   string // the Router's booking id
	worker    radix.WorkerKey
	prefilled bool
}

func newSlotTracker() *slotTracker {
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return &slotTracker{parts: map[stKey]*stPart{}, prefix: "slot-tracker-" + hex.EncodeToString(b[:]) + "-"}
}

// ServeSlotTracker serves Dynamo's slot tracker API on ln until Shutdown, within the connection
// limits of Serve's listeners.
func (s *Server) ServeSlotTracker(ln net.Listener) error {
	return s.stSrv.Serve(s.conns.listener(ln, lnSlotTracker))
}

// newSlotTrackerServer is the slot tracker's fasthttp server, with the API's transport.
func (s *Server) newSlotTrackerServer() *fasthttp.Server {
	srv := HTTPServer(s.HandleSlotTracker, s.cfg)
	srv.ErrorHandler, srv.ConnState, srv.Concurrency = s.stTransportError, s.conns.connState, s.srv.Concurrency
	return srv
}

func (s *Server) stTransportError(ctx *fasthttp.RequestCtx, err error) {
	s.refuseTransport(ctx, err, true)
}

// stRoutes are the slot tracker's routes and their methods.
var stRoutes = map[string]string{
	"/register": "POST", "/unregister": "POST", "/workers": "GET", "/add": "POST",
	"/prefill_complete": "POST", "/free": "POST", "/loads": "GET", "/potential_loads": "POST",
	"/health": "GET", "/replica_sync/peers": "GET", "/replica_sync/register_peer": "POST",
	"/replica_sync/deregister_peer": "POST",
}

// HandleSlotTracker serves one request of the slot tracker API (tests may call it directly).
func (s *Server) HandleSlotTracker(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	want, ok := stRoutes[path]
	switch method := string(ctx.Method()); {
	case !ok:
		s.stError(ctx, fasthttp.StatusNotFound, "not_found", "route not found")
		return
	case method != want && !(method == "HEAD" && want == "GET"):
		ctx.Response.Header.Set("Allow", want)
		s.stError(ctx, fasthttp.StatusMethodNotAllowed, "method", "method not allowed")
		return
	}
	if s.cfg.Tokens != nil && !s.authorized(ctx, selectionAccess([]byte(path), ctx.Method()), s.selError) {
		return
	}
	st := s.st
	switch path {
	case "/health":
		ctx.SetStatusCode(fasthttp.StatusOK) // Dynamo's: 200 with no body
	case "/register":
		s.stRegister(ctx, st)
	case "/unregister":
		s.stUnregister(ctx, st)
	case "/workers":
		s.stWorkers(ctx, st)
	case "/add":
		s.stAdd(ctx, st)
	case "/prefill_complete", "/free":
		s.stLifecycle(ctx, st, path == "/free")
	case "/loads":
		s.stLoads(ctx, st)
	case "/potential_loads":
		s.stPotential(ctx, st)
	case "/replica_sync/peers":
		// Dynamo's slot trackers copy each other's lifecycles over ZMQ when started with
		// --replica-sync-bind; kvrouterd replicas share bookings through their event stream
		// (--share-load) instead, so this one has no ZMQ peers: Dynamo's answers with sync off.
		s.writeJSON(ctx, []string{})
	default:
		s.stError(ctx, fasthttp.StatusConflict, "disabled", "replica sync is disabled")
	}
}

// stError answers a refusal in Dynamo's shape ({"error": msg}), counted and logged.
func (s *Server) stError(ctx *fasthttp.RequestCtx, status int, reason, msg string) {
	s.m.rejected.WithLabelValues("slot_tracker", reason).Inc()
	s.refusals.Warn("request refused", "endpoint", "slot_tracker", "path", string(ctx.Path()), "status", status,
		"reason", reason, "error", msg, "remote", ctx.RemoteAddr().String())
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendError(ctx.Response.Body()[:0], msg, "", -1))
}

// stOK answers Dynamo's {"status": "ok"}.
func (s *Server) stOK(ctx *fasthttp.RequestCtx, status int) {
	ctx.SetStatusCode(status)
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

// stJSON decodes a body as axum's Json extractor does for Dynamo's handlers: 415 without a JSON
// Content-Type, 400 for a body that is not JSON, 422 for a missing field or a wrong type. The
// routing group defaults to "default"; Dynamo's older name for it, tenant_id, is read too.
func (s *Server) stJSON(ctx *fasthttp.RequestCtx, v any, group *stGroup, required ...string) bool {
	if !jsonContentType(string(ctx.Request.Header.ContentType())) {
		s.stError(ctx, fasthttp.StatusUnsupportedMediaType, "content_type", "Expected request with `Content-Type: application/json`")
		return false
	}
	unknown, keys, err := decodeLenient(ctx.PostBody(), v)
	if err != nil {
		var je *jsonError
		switch {
		case !errors.As(err, &je):
			s.stError(ctx, fasthttp.StatusBadRequest, "json", axumSyntax+err.Error())
		case je.typed:
			s.stError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+je.msg)
		default:
			s.stError(ctx, fasthttp.StatusBadRequest, "json", axumSyntax+je.msg)
		}
		return false
	}
	s.noteUnknown("slot_tracker "+string(ctx.Path()), unknown)
	for _, name := range required {
		if !keys.has(name) || keys.null(name) {
			s.stError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+"missing field `"+name+"`")
			return false
		}
	}
	for _, name := range []string{"routing_group", "tenant_id"} {
		if keys.null(name) {
			s.stError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+name+": invalid type: null, expected a string")
			return false
		}
	}
	if group != nil && group.Group == "" {
		group.Group = cmp.Or(group.Tenant, dynDefaultGroup)
		if keys.has("routing_group") {
			group.Group = "" // given empty: a group of that name, as Dynamo's
		}
	}
	return true
}

// stGroup is a body's routing group.
type stGroup struct {
	Group  string `json:"routing_group"`
	Tenant string `json:"tenant_id"`
}

func (k stKey) notFound() string {
	return fmt.Sprintf("no slot tracker for model=%s routing_group=%s", k.model, k.group)
}

func (k stKey) workerNotFound(id uint64) string {
	return fmt.Sprintf("worker %d not found for model=%s routing_group=%s", id, k.model, k.group)
}

// dynWorkerRank is how Dynamo's messages print a worker rank (its Debug form).
func dynWorkerRank(w radix.WorkerKey) string {
	return fmt.Sprintf("WorkerWithDpRank { worker_id: %d, dp_rank: %d }", w.ID, w.Rank)
}

// stRegister answers POST /register: one contiguous range of ranks of a worker, 201.
func (s *Server) stRegister(ctx *fasthttp.RequestCtx, st *slotTracker) {
	var j struct {
		stGroup
		WorkerID  uint64 `json:"worker_id"`
		Model     string `json:"model_name"`
		BlockSize uint32 `json:"block_size"`
		DPStart   uint32 `json:"dp_start"`
		DPSize    uint32 `json:"dp_size"`
	}
	if !s.stJSON(ctx, &j, &j.stGroup, "worker_id", "model_name", "block_size", "dp_start", "dp_size") {
		return
	}
	key := stKey{j.Model, j.Group}
	switch {
	case j.BlockSize == 0:
		s.stError(ctx, fasthttp.StatusBadRequest, "invalid", "block_size must be greater than 0")
		return
	case j.DPSize == 0:
		s.stError(ctx, fasthttp.StatusBadRequest, "invalid", "dp_size must be greater than 0")
		return
	case uint64(j.DPStart)+uint64(j.DPSize)-1 > math.MaxUint32:
		s.stError(ctx, fasthttp.StatusBadRequest, "invalid", fmt.Sprintf("dp range overflows u32: start=%d size=%d", j.DPStart, j.DPSize))
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	p := st.parts[key]
	if p != nil && p.blockSize != j.BlockSize {
		s.stError(ctx, fasthttp.StatusConflict, "conflict", fmt.Sprintf("block_size mismatch for model=%s routing_group=%s: existing=%d, requested=%d",
			key.model, key.group, p.blockSize, j.BlockSize))
		return
	}
	if p != nil && p.workers[j.WorkerID] != nil {
		s.stError(ctx, fasthttp.StatusConflict, "conflict", fmt.Sprintf("worker %d already registered for model=%s routing_group=%s", j.WorkerID, key.model, key.group))
		return
	}
	name := partition(key.model, key.group)
	w := &stWorker{dpStart: j.DPStart, dpSize: j.DPSize, owned: true}
	reg := router.Registration{ID: j.WorkerID, Model: name, BlockSize: int(j.BlockSize), KeepRole: true}
	if m, ok := s.r.WorkerModel(j.WorkerID); ok {
		// The Router's worker already (its events, the indexer API): the slot tracker adopts
		// it, and adds the ranks it lacks.
		if m != name {
			model, group := splitPartition(m)
			s.stError(ctx, fasthttp.StatusConflict, "conflict", fmt.Sprintf("worker %d is registered for model=%s routing_group=%s in kvrouterd, which gives a worker one model",
				j.WorkerID, model, group))
			return
		}
		w.owned = false
	}
	for r := range uint64(j.DPSize) {
		rank := j.DPStart + uint32(r)
		if w.owned || !s.r.HasRank(j.WorkerID, rank) {
			reg.Ranks = append(reg.Ranks, rank)
		}
		if len(reg.Ranks) > wire.MaxSnapshotRanks {
			s.stError(ctx, fasthttp.StatusBadRequest, "too_long", fmt.Sprintf("dp_size %d: kvrouterd holds at most %d ranks of a worker", j.DPSize, wire.MaxSnapshotRanks))
			return
		}
	}
	if !w.owned {
		w.added = reg.Ranks
	}
	if len(reg.Ranks) > 0 {
		if err := s.ch.Register(reg); err != nil {
			s.stFail(ctx, err)
			return
		}
	}
	if p == nil {
		p = &stPart{blockSize: j.BlockSize, workers: map[uint64]*stWorker{}, reqs: map[string]*stReq{}}
		st.parts[key] = p
	}
	p.workers[j.WorkerID] = w
	s.stOK(ctx, fasthttp.StatusCreated)
}

// stFail answers an error of package router with the status Dynamo gives its kind.
func (s *Server) stFail(ctx *fasthttp.RequestCtx, err error) {
	status, reason := dynStatus(err)
	s.stError(ctx, status, reason, err.Error())
}

// stUnregister answers POST /unregister: the worker's ranks and its requests go at once.
func (s *Server) stUnregister(ctx *fasthttp.RequestCtx, st *slotTracker) {
	var j struct {
		stGroup
		WorkerID uint64 `json:"worker_id"`
		Model    string `json:"model_name"`
	}
	if !s.stJSON(ctx, &j, &j.stGroup, "worker_id", "model_name") {
		return
	}
	key := stKey{j.Model, j.Group}
	st.mu.Lock()
	defer st.mu.Unlock()
	p := st.parts[key]
	if p == nil || p.workers[j.WorkerID] == nil {
		s.stError(ctx, fasthttp.StatusNotFound, "not_found", key.workerNotFound(j.WorkerID))
		return
	}
	w := p.workers[j.WorkerID]
	for id, rq := range p.reqs {
		if rq.worker.ID == j.WorkerID {
			_ = s.r.Complete(rq.booking) // gone already if it expired
			delete(p.reqs, id)
		}
	}
	var err error
	if w.owned {
		err = s.ch.Unregister(j.WorkerID)
	} else {
		for _, r := range w.added {
			err = cmp.Or(err, s.ch.UnregisterRank(j.WorkerID, r))
		}
	}
	if err != nil && !errors.Is(err, router.ErrUnknownWorker) {
		// The slot tracker's registration goes all the same: its requests are freed.
		s.log.Warn("slot tracker: the worker's removal from the router failed", "worker", j.WorkerID, "err", err)
	}
	delete(p.workers, j.WorkerID)
	if len(p.workers) == 0 {
		delete(st.parts, key)
	}
	s.stOK(ctx, fasthttp.StatusOK)
}

// stFilter is /workers' and /loads' query: model_name and routing_group (or tenant_id), each
// optional.
func stFilter(ctx *fasthttp.RequestCtx) func(stKey) bool {
	args := ctx.QueryArgs()
	model, hasModel := string(args.Peek("model_name")), args.Has("model_name")
	group, hasGroup := string(args.Peek("routing_group")), args.Has("routing_group")
	if !hasGroup && args.Has("tenant_id") {
		group, hasGroup = string(args.Peek("tenant_id")), true
	}
	return func(k stKey) bool { return (!hasModel || k.model == model) && (!hasGroup || k.group == group) }
}

// stWorkers answers GET /workers, sorted by model, group and worker.
func (s *Server) stWorkers(ctx *fasthttp.RequestCtx, st *slotTracker) {
	type info struct {
		WorkerID  uint64 `json:"worker_id"`
		Model     string `json:"model_name"`
		Group     string `json:"routing_group"`
		BlockSize uint32 `json:"block_size"`
		DPStart   uint32 `json:"dp_start"`
		DPSize    uint32 `json:"dp_size"`
	}
	keep := stFilter(ctx)
	out := []info{}
	st.mu.Lock()
	for k, p := range st.parts {
		if keep(k) {
			for id, w := range p.workers {
				out = append(out, info{id, k.model, k.group, p.blockSize, w.dpStart, w.dpSize})
			}
		}
	}
	st.mu.Unlock()
	slices.SortFunc(out, func(a, b info) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group), cmp.Compare(a.WorkerID, b.WorkerID))
	})
	s.writeJSON(ctx, out)
}

// stAdd answers POST /add: the request is booked on the worker rank as a routed request is, its
// sequence hashes as its active blocks and new_isl_tokens (when > 0) as its prefill tokens.
func (s *Server) stAdd(ctx *fasthttp.RequestCtx, st *slotTracker) {
	var j struct {
		stGroup
		Model     string  `json:"model_name"`
		RequestID string  `json:"request_id"`
		WorkerID  uint64  `json:"worker_id"`
		DPRank    uint32  `json:"dp_rank"`
		Hashes    []int64 `json:"sequence_hashes"`
		NewISL    uint64  `json:"new_isl_tokens"`
	}
	if !s.stJSON(ctx, &j, &j.stGroup, "model_name", "request_id", "worker_id", "dp_rank", "sequence_hashes") {
		return
	}
	if j.NewISL > router.MaxTokens {
		s.stError(ctx, fasthttp.StatusBadRequest, "invalid", fmt.Sprintf("new_isl_tokens %d is over kvrouterd's limit of %d", j.NewISL, router.MaxTokens))
		return
	}
	key, wk := stKey{j.Model, j.Group}, radix.WorkerKey{ID: j.WorkerID, Rank: j.DPRank}
	st.mu.Lock()
	defer st.mu.Unlock()
	p := st.parts[key]
	if p == nil {
		s.stError(ctx, fasthttp.StatusNotFound, "not_found", key.notFound())
		return
	}
	if rq := p.reqs[j.RequestID]; rq != nil {
		if s.r.Booked(rq.booking) {
			s.stError(ctx, fasthttp.StatusConflict, "conflict", fmt.Sprintf("Request %s already exists (assigned to worker %s)", j.RequestID, dynWorkerRank(rq.worker)))
			return
		}
		delete(p.reqs, j.RequestID) // expired (Dynamo's 300 s): the id is free again
	}
	if w := p.workers[j.WorkerID]; w == nil || !w.hasRank(j.DPRank) {
		s.stError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("Worker %s not found", dynWorkerRank(wk)))
		return
	}
	st.next++
	booking := st.prefix + strconv.FormatUint(st.next, 36)
	if err := s.r.Book(partition(key.model, key.group), wk, booking, unsigned(j.Hashes), int64(j.NewISL)); err != nil {
		if errors.Is(err, router.ErrUnknownWorker) || errors.Is(err, router.ErrUnknownModel) {
			// Removed from the Router meanwhile (by the indexer API, or for silence).
			s.stError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("Worker %s not found", dynWorkerRank(wk)))
			return
		}
		s.stFail(ctx, err)
		return
	}
	p.reqs[j.RequestID] = &stReq{booking: booking, worker: wk}
	if len(p.reqs) > 2*p.swept+1024 {
		// Requests never freed expire in the Router (--router-request-expiry, Dynamo's 300 s);
		// their ids go here, amortised over the adds.
		for id, rq := range p.reqs {
			if !s.r.Booked(rq.booking) {
				delete(p.reqs, id)
			}
		}
		p.swept = len(p.reqs)
	}
	s.stOK(ctx, fasthttp.StatusCreated)
}

// stLifecycle answers POST /prefill_complete (200; a repeat changes nothing; an unknown request
// 404) and POST /free (200, also for an unknown request).
func (s *Server) stLifecycle(ctx *fasthttp.RequestCtx, st *slotTracker, free bool) {
	var j struct {
		stGroup
		Model     string `json:"model_name"`
		RequestID string `json:"request_id"`
	}
	if !s.stJSON(ctx, &j, &j.stGroup, "model_name", "request_id") {
		return
	}
	key := stKey{j.Model, j.Group}
	st.mu.Lock()
	defer st.mu.Unlock()
	p := st.parts[key]
	if p == nil {
		s.stError(ctx, fasthttp.StatusNotFound, "not_found", key.notFound())
		return
	}
	rq := p.reqs[j.RequestID]
	if rq != nil && !s.r.Booked(rq.booking) {
		delete(p.reqs, j.RequestID) // expired
		rq = nil
	}
	switch {
	case free:
		if rq != nil {
			_ = s.r.Complete(rq.booking)
			delete(p.reqs, j.RequestID)
		}
	case rq == nil:
		s.stError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("Request %s not found", j.RequestID))
		return
	case !rq.prefilled:
		_ = s.r.PrefillDone(rq.booking)
		rq.prefilled = true
	}
	s.stOK(ctx, fasthttp.StatusOK)
}

// stLoad is Dynamo's ActiveLoadInfo.
type stLoad struct {
	Model         string `json:"model_name"`
	Group         string `json:"routing_group"`
	WorkerID      uint64 `json:"worker_id"`
	DPRank        uint32 `json:"dp_rank"`
	ActivePrefill int64  `json:"active_prefill_tokens"`
	ActiveBlocks  int64  `json:"active_decode_blocks"`
}

// stLoads answers GET /loads: every registered rank's booked load, sorted.
func (s *Server) stLoads(ctx *fasthttp.RequestCtx, st *slotTracker) {
	keep := stFilter(ctx)
	byRank := map[radix.WorkerKey]router.WorkerInfo{}
	for _, w := range s.r.Workers() {
		byRank[radix.WorkerKey{ID: w.ID, Rank: w.Rank}] = w
	}
	out := []stLoad{}
	st.mu.Lock()
	for k, p := range st.parts {
		if !keep(k) {
			continue
		}
		name := partition(k.model, k.group)
		for id, w := range p.workers {
			for r := range uint64(w.dpSize) {
				l := stLoad{Model: k.model, Group: k.group, WorkerID: id, DPRank: w.dpStart + uint32(r)}
				if x, ok := byRank[radix.WorkerKey{ID: id, Rank: l.DPRank}]; ok && x.Model == name {
					l.ActivePrefill, l.ActiveBlocks = x.ActivePrefill, x.ActiveBlocks
				}
				out = append(out, l)
			}
		}
	}
	st.mu.Unlock()
	slices.SortFunc(out, func(a, b stLoad) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group), cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
	})
	s.writeJSON(ctx, out)
}

// stPotential answers POST /potential_loads: each registered rank's load with the request added,
// its sequence hashes compared with the blocks active on the rank as Book would count them, and
// new_isl_tokens added to every rank's prefill tokens.
func (s *Server) stPotential(ctx *fasthttp.RequestCtx, st *slotTracker) {
	var j struct {
		stGroup
		Model  string  `json:"model_name"`
		Hashes []int64 `json:"sequence_hashes"`
		NewISL uint64  `json:"new_isl_tokens"`
	}
	if !s.stJSON(ctx, &j, &j.stGroup, "model_name", "sequence_hashes") {
		return
	}
	if j.NewISL > router.MaxTokens {
		s.stError(ctx, fasthttp.StatusBadRequest, "invalid", fmt.Sprintf("new_isl_tokens %d is over kvrouterd's limit of %d", j.NewISL, router.MaxTokens))
		return
	}
	key := stKey{j.Model, j.Group}
	st.mu.Lock()
	p := st.parts[key]
	var ranks []radix.WorkerKey
	if p != nil {
		for id, w := range p.workers {
			for r := range uint64(w.dpSize) {
				ranks = append(ranks, radix.WorkerKey{ID: id, Rank: w.dpStart + uint32(r)})
			}
		}
	}
	st.mu.Unlock()
	if p == nil {
		s.stError(ctx, fasthttp.StatusNotFound, "not_found", key.notFound())
		return
	}
	name := partition(key.model, key.group)
	out := make([]selPotentialLoad, 0, len(ranks))
	loads := map[radix.WorkerKey]selPotentialLoad{}
	for _, w := range s.r.Workers() {
		if w.Model == name {
			loads[radix.WorkerKey{ID: w.ID, Rank: w.Rank}] = selPotentialLoad{WorkerID: w.ID, DPRank: w.Rank,
				PotentialPrefillTokens: w.ActivePrefill, PotentialDecodeBlocks: w.ActiveBlocks + int64(len(j.Hashes)), ActiveRequests: w.ActiveRequests}
		}
	}
	if seqs := unsigned(j.Hashes); len(seqs) > 0 {
		// The Router's scoring compares the hashes with each rank's active blocks: given as
		// the request's sequence hashes (SelectOptions.Seqs), they are what is compared, as a
		// booking of them would count them.
		bs, _ := s.r.ModelBlockSize(name)
		no := false
		req := wire.RouteRequest{Model: name, ByHash: true, Hashes: seqs, ISL: uint32(min(len(seqs)*max(bs, 1), router.MaxTokens))}
		for _, r := range ranks {
			if len(req.Allowed) == 0 || req.Allowed[len(req.Allowed)-1] != r.ID {
				req.Allowed = append(req.Allowed, r.ID)
			}
		}
		slices.Sort(req.Allowed)
		req.Allowed = slices.Compact(req.Allowed)
		var sel router.Selection
		if err := s.r.Score(&req, router.SelectOptions{TrackPrefill: &no, Seqs: seqs}, &sel); err == nil {
			for _, c := range sel.Scores {
				if l, ok := loads[c.Worker]; ok {
					l.PotentialDecodeBlocks = c.ActiveBlocks + int64(len(seqs)) - int64(c.Shared)
					loads[c.Worker] = l
				}
			}
		} else {
			s.log.Debug("slot tracker: /potential_loads scored no rank; active blocks counted unshared", "model", name, "err", err)
		}
	}
	for _, r := range ranks {
		l, ok := loads[r]
		if !ok {
			l = selPotentialLoad{WorkerID: r.ID, DPRank: r.Rank, PotentialDecodeBlocks: int64(len(j.Hashes))}
		}
		l.PotentialPrefillTokens += int64(j.NewISL)
		out = append(out, l)
	}
	s.writeJSON(ctx, out)
}
