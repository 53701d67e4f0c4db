package server

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"strconv"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// The selection service's worker catalog (Dynamo's selection core/workers.rs, catalog.rs): a
// record per worker id, upserted by POST /workers, merged by PATCH, removed by DELETE. A record
// is schedulable once it is complete and registered in the router: its ranks
// data_parallel_start_rank .. +data_parallel_size, each with its kv_events endpoint (and the
// replay endpoint), through Config.Changes as /register registers, so that the daemon subscribes
// to their events; otherwise it is incomplete and not_schedulable_reasons says why.

// Lifecycle values of a catalog record.
const (
	lifeIncomplete    = "incomplete"
	lifeSchedulable   = "schedulable"
	lifeDraining      = "draining"
	lifeUnschedulable = "unschedulable"
)

// selRecord is Dynamo's WorkerCatalogRecord: the fields without omitempty are always present,
// null when unset.
type selRecord struct {
	WorkerID                         uint64            `json:"worker_id"`
	Model                            string            `json:"model_name"`
	Group                            string            `json:"routing_group"`
	Lifecycle                        string            `json:"lifecycle"`
	Endpoint                         *string           `json:"endpoint"`
	KVEventsEndpoint                 *string           `json:"kv_events_endpoint"`
	KVEventsEndpoints                map[uint32]string `json:"kv_events_endpoints,omitempty"`
	ReplayEndpoint                   *string           `json:"replay_endpoint"`
	BlockSize                        *uint32           `json:"block_size"`
	DPStart                          uint32            `json:"data_parallel_start_rank"`
	DPSize                           uint32            `json:"data_parallel_size"`
	MaxBatchedTokens                 *uint64           `json:"max_num_batched_tokens"`
	TotalKVBlocks                    *uint64           `json:"total_kv_blocks"`
	StableRoutingID                  *string           `json:"stable_routing_id"`
	IsEagle                          *bool             `json:"is_eagle"`
	Taints                           []string          `json:"taints"`
	TopologyDomains                  map[string]string `json:"topology_domains"`
	KVTransferDomain                 *string           `json:"kv_transfer_domain"`
	KVTransferEnforcement            *string           `json:"kv_transfer_enforcement"`
	KVTransferPreferredWeight        *float64          `json:"kv_transfer_preferred_weight"`
	RouterHintWorkerType             *string           `json:"router_hint_worker_type,omitempty"`
	RouterHintSourceControlEndpoints map[uint32]string `json:"router_hint_source_control_endpoints,omitempty"`
	KVEventSourceMode                *string           `json:"kv_event_source_mode,omitempty"`
	NotSchedulableReasons            []string          `json:"not_schedulable_reasons,omitempty"`
}

// selWorkerFields are the members of Dynamo's WorkerRequest that WorkerPatchRequest has too;
// nil is absent (or null, which a patch takes for absent: it cannot set a field back to null).
type selWorkerFields struct {
	Endpoint                         *string           `json:"endpoint"`
	KVEventsEndpoint                 *string           `json:"kv_events_endpoint"`
	KVEventsEndpoints                map[uint32]string `json:"kv_events_endpoints"`
	ReplayEndpoint                   *string           `json:"replay_endpoint"`
	BlockSize                        *uint32           `json:"block_size"`
	DPStart                          *uint32           `json:"data_parallel_start_rank"`
	DPSize                           *uint32           `json:"data_parallel_size"`
	MaxBatchedTokens                 *uint64           `json:"max_num_batched_tokens"`
	TotalKVBlocks                    *uint64           `json:"total_kv_blocks"`
	StableRoutingID                  *string           `json:"stable_routing_id"`
	IsEagle                          *bool             `json:"is_eagle"`
	Taints                           []string          `json:"taints"`
	TopologyDomains                  map[string]string `json:"topology_domains"`
	KVTransferDomain                 *string           `json:"kv_transfer_domain"`
	KVTransferEnforcement            *string           `json:"kv_transfer_enforcement"`
	KVTransferPreferredWeight        *float64          `json:"kv_transfer_preferred_weight"`
	RouterHintWorkerType             *string           `json:"router_hint_worker_type"`
	RouterHintSourceControlEndpoints map[uint32]string `json:"router_hint_source_control_endpoints"`
	KVEventSourceMode                *string           `json:"kv_event_source_mode"`
}

// selWorkerRequest is Dynamo's WorkerRequest (POST /workers).
type selWorkerRequest struct {
	WorkerID *uint64 `json:"worker_id"`
	Model    string  `json:"model_name"`
	Group    string  `json:"routing_group"`
	selWorkerFields
}

// The WorkerRequest members with a serde default rather than an Option: absent is their
// default, null is refused.
var selWorkerNonNull = []string{"model_name", "routing_group", "data_parallel_start_rank", "data_parallel_size", "taints", "topology_domains"}

// check refuses the values of Dynamo's enums it does not have, as serde does (422).
func (f *selWorkerFields) check() error {
	variant := func(name string, v *string, want ...string) error {
		if v == nil || slices.Contains(want, *v) {
			return nil
		}
		return fmt.Errorf("%s: unknown variant `%s`, expected `%s` or `%s`", name, *v, want[0], want[1])
	}
	return cmp.Or(variant("kv_transfer_enforcement", f.KVTransferEnforcement, "required", "preferred"),
		variant("kv_event_source_mode", f.KVEventSourceMode, "framework_v1", "state_agent_v2"))
}

// merge sets rec's fields from f's present ones.
func (f *selWorkerFields) merge(rec *selRecord) {
	set := func(dst **string, v *string) {
		if v != nil {
			*dst = v
		}
	}
	set(&rec.Endpoint, f.Endpoint)
	set(&rec.KVEventsEndpoint, f.KVEventsEndpoint)
	set(&rec.ReplayEndpoint, f.ReplayEndpoint)
	set(&rec.StableRoutingID, f.StableRoutingID)
	set(&rec.KVTransferDomain, f.KVTransferDomain)
	set(&rec.KVTransferEnforcement, f.KVTransferEnforcement)
	set(&rec.RouterHintWorkerType, f.RouterHintWorkerType)
	set(&rec.KVEventSourceMode, f.KVEventSourceMode)
	if f.KVEventsEndpoints != nil {
		rec.KVEventsEndpoints = f.KVEventsEndpoints
	}
	if f.BlockSize != nil {
		rec.BlockSize = f.BlockSize
	}
	if f.DPStart != nil {
		rec.DPStart = *f.DPStart
	}
	if f.DPSize != nil {
		rec.DPSize = *f.DPSize
	}
	if f.MaxBatchedTokens != nil {
		rec.MaxBatchedTokens = f.MaxBatchedTokens
	}
	if f.TotalKVBlocks != nil {
		rec.TotalKVBlocks = f.TotalKVBlocks
	}
	if f.IsEagle != nil {
		rec.IsEagle = f.IsEagle
	}
	if f.Taints != nil {
		rec.Taints = f.Taints
	}
	if f.TopologyDomains != nil {
		rec.TopologyDomains = f.TopologyDomains
	}
	if f.KVTransferPreferredWeight != nil {
		rec.KVTransferPreferredWeight = f.KVTransferPreferredWeight
	}
	if f.RouterHintSourceControlEndpoints != nil {
		rec.RouterHintSourceControlEndpoints = f.RouterHintSourceControlEndpoints
	}
}

// partition is the router model holding rec's (model_name, routing_group).
func (rec *selRecord) partition() string { return partition(rec.Model, rec.Group) }

// ranks are rec's data-parallel ranks, first to last (meaningful once reasons found none).
func (rec *selRecord) ranks() []uint32 {
	out := make([]uint32, rec.DPSize)
	for i := range out {
		out[i] = rec.DPStart + uint32(i)
	}
	return out
}

// hasRank reports whether rank is one of rec's.
func (rec *selRecord) hasRank(rank uint32) bool {
	return rank >= rec.DPStart && uint64(rank) < uint64(rec.DPStart)+uint64(rec.DPSize)
}

// eventsEndpoint is where rank publishes its KV events: its own entry of kv_events_endpoints,
// or kv_events_endpoint for a single rank when that map is empty (Dynamo's rule).
func (rec *selRecord) eventsEndpoint(rank uint32) (string, bool) {
	if len(rec.KVEventsEndpoints) > 0 {
		ep, ok := rec.KVEventsEndpoints[rank]
		return ep, ok
	}
	if rec.DPSize == 1 && rec.KVEventsEndpoint != nil {
		return *rec.KVEventsEndpoint, true
	}
	return "", false
}

func (rec *selRecord) eagle() bool { return rec.IsEagle != nil && *rec.IsEagle }

// reasons says why rec cannot be scheduled on its own, in Dynamo's words, before anything is
// registered; kvEvents: workers must publish KV events (not the daemon's approximate mode).
// Queueing is never on in kvrouterd, so max_num_batched_tokens is never required.
func (rec *selRecord) reasons(kvEvents bool) []string {
	var why []string
	if rec.Endpoint == nil || *rec.Endpoint == "" {
		why = append(why, "endpoint is required")
	}
	if rec.BlockSize == nil || *rec.BlockSize == 0 {
		why = append(why, "block_size must be greater than 0")
	} else if *rec.BlockSize > wire.MaxBlockSize {
		why = append(why, fmt.Sprintf("block_size %d is over kvrouterd's limit of %d", *rec.BlockSize, wire.MaxBlockSize))
	}
	switch last := uint64(rec.DPStart) + uint64(rec.DPSize); {
	case rec.DPSize == 0:
		why = append(why, "data_parallel_size must be greater than 0")
	case rec.DPSize > wire.MaxSnapshotRanks:
		why = append(why, fmt.Sprintf("data_parallel_size %d is over kvrouterd's limit of %d ranks per worker", rec.DPSize, wire.MaxSnapshotRanks))
	case last > math.MaxUint32+1:
		why = append(why, fmt.Sprintf("data_parallel_start_rank %d + data_parallel_size %d is past the last dp_rank %d", rec.DPStart, rec.DPSize, uint32(math.MaxUint32)))
	case kvEvents:
		for _, rank := range rec.ranks() {
			if ep, ok := rec.eventsEndpoint(rank); !ok || ep == "" {
				why = append(why, fmt.Sprintf("kv_events endpoint is required for dp_rank %d", rank))
			}
		}
	}
	if kvEvents && rec.ReplayEndpoint != nil && *rec.ReplayEndpoint != "" && rec.DPSize != 1 {
		why = append(why, "replay_endpoint is supported only for data_parallel_size 1")
	}
	return why
}

// records returns the catalog's records of model and group ("" for any), sorted by (model,
// group, worker id).
func (sel *selection) records(model, group string) []*selRecord {
	sel.mu.Lock()
	out := make([]*selRecord, 0, len(sel.workers))
	for _, rec := range sel.workers {
		if (model == "" || rec.Model == model) && (group == "" || rec.Group == group) {
			out = append(out, rec)
		}
	}
	sel.mu.Unlock()
	slices.SortFunc(out, func(a, b *selRecord) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group), cmp.Compare(a.WorkerID, b.WorkerID))
	})
	return out
}

func (sel *selection) record(id uint64) *selRecord {
	sel.mu.Lock()
	defer sel.mu.Unlock()
	return sel.workers[id]
}

func (sel *selection) store(rec *selRecord) {
	sel.mu.Lock()
	defer sel.mu.Unlock()
	sel.workers[rec.WorkerID] = rec
	if rec.Lifecycle == lifeSchedulable {
		if _, ok := sel.eagle[rec.partition()]; !ok {
			sel.eagle[rec.partition()] = rec.eagle()
		}
	}
}

// selListWorkers answers GET /workers?model_name&routing_group.
func (s *Server) selListWorkers(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	s.writeJSON(ctx, s.sel.records(string(args.Peek("model_name")), string(args.Peek("routing_group"))))
}

// selUpsertWorker answers POST /workers: the record replaced by the request's (a worker may
// move to another partition), reconciled with the router, 201 with it even when incomplete.
func (s *Server) selUpsertWorker(ctx *fasthttp.RequestCtx) {
	var j selWorkerRequest
	keys, ok := s.selJSON(ctx, "/workers", &j, []string{"worker_id"}, selWorkerNonNull)
	if !ok {
		return
	}
	if err := j.check(); err != nil {
		s.selError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+err.Error())
		return
	}
	rec := &selRecord{
		WorkerID: *j.WorkerID,
		Model:    keys.str("model_name", j.Model, dynDefaultGroup),
		Group:    keys.str("routing_group", j.Group, dynDefaultGroup),
		DPSize:   1,
		Taints:   []string{},
	}
	rec.TopologyDomains = map[string]string{}
	j.merge(rec)
	s.sel.write.Lock()
	defer s.sel.write.Unlock()
	s.reconcile(rec, s.sel.record(rec.WorkerID))
	ctx.SetStatusCode(fasthttp.StatusCreated)
	s.writeJSON(ctx, rec)
}

// selPatchWorker answers PATCH /workers/{id}: the request's present fields merged into the
// record, reconciled with the router.
func (s *Server) selPatchWorker(ctx *fasthttp.RequestCtx, id uint64) {
	var j selWorkerFields
	if _, ok := s.selJSON(ctx, "/workers/{worker_id}", &j, nil, nil); !ok {
		return
	}
	if err := j.check(); err != nil {
		s.selError(ctx, fasthttp.StatusUnprocessableEntity, "json", axumSchema+err.Error())
		return
	}
	s.sel.write.Lock()
	defer s.sel.write.Unlock()
	old := s.sel.record(id)
	if old == nil {
		s.selError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("worker %d not found", id))
		return
	}
	rec := *old
	rec.NotSchedulableReasons = nil
	j.merge(&rec)
	s.reconcile(&rec, old)
	s.writeJSON(ctx, &rec)
}

// selDeleteWorker answers DELETE /workers/{id}: draining, out of the router, unschedulable, out
// of the catalog; the answer is the unschedulable record. A worker the router cannot let go of
// now (the event stream unreachable) stays, and the answer is 503.
func (s *Server) selDeleteWorker(ctx *fasthttp.RequestCtx, id uint64) {
	s.sel.write.Lock()
	defer s.sel.write.Unlock()
	old := s.sel.record(id)
	if old == nil {
		s.selError(ctx, fasthttp.StatusNotFound, "not_found", fmt.Sprintf("worker %d not found", id))
		return
	}
	draining := *old
	draining.Lifecycle = lifeDraining
	s.sel.store(&draining)
	if err := s.leave(&draining); err != nil {
		s.sel.store(old)
		s.selFail(ctx, err)
		return
	}
	rec := draining // a stored record is never changed: readers may hold it
	rec.Lifecycle = lifeUnschedulable
	s.sel.mu.Lock()
	delete(s.sel.workers, id)
	s.sel.mu.Unlock()
	s.writeJSON(ctx, &rec)
}

// leave unregisters rec's worker from the router if it is registered for rec's partition
// (another partition's worker of the same id is not the catalog's).
func (s *Server) leave(rec *selRecord) error {
	if m, ok := s.r.WorkerModel(rec.WorkerID); !ok || m != rec.partition() {
		return nil
	}
	if err := s.ch.Unregister(rec.WorkerID); err != nil && !errors.Is(err, router.ErrUnknownWorker) {
		return err
	}
	return nil
}

// reconcile makes the router hold rec's worker as rec says, and sets rec's lifecycle and
// reasons; old is the record it replaces (nil for none). Ranks registered already with the
// same endpoints are kept, with their blocks and event cursors; the others are registered
// anew. A record that cannot be scheduled leaves the router. It stores rec. REQUIRES
// sel.write.
func (s *Server) reconcile(rec, old *selRecord) {
	rec.Lifecycle, rec.NotSchedulableReasons = lifeIncomplete, rec.reasons(!s.cfg.NoKVEvents)
	if len(rec.NotSchedulableReasons) == 0 {
		if err := s.register(rec); err != nil {
			rec.NotSchedulableReasons = []string{"reconciliation failed: " + err.Error()}
		} else {
			rec.Lifecycle = lifeSchedulable
		}
	}
	if rec.Lifecycle != lifeSchedulable && old != nil && old.Lifecycle == lifeSchedulable {
		if err := s.leave(old); err != nil {
			s.log.Warn("selection service: a worker no longer schedulable is still registered", "worker", rec.WorkerID, "err", err)
		}
	}
	s.sel.store(rec)
}

// register registers rec's ranks in the router, rank by rank with their own endpoints, after
// unregistering those registered otherwise; an error is Dynamo's reconciliation error, and
// leaves the worker unregistered. REQUIRES sel.write.
func (s *Server) register(rec *selRecord) error {
	key, id, bs := rec.partition(), rec.WorkerID, int(*rec.BlockSize)
	pk := partKey(rec.Model, rec.Group)
	kvEvents := !s.cfg.NoKVEvents
	want := map[uint32]router.RankEndpoint{}
	for _, rank := range rec.ranks() {
		ep := router.RankEndpoint{Rank: rank}
		if kvEvents {
			ep.Endpoint, _ = rec.eventsEndpoint(rank)
			if err := validZMQEndpoint(ep.Endpoint); err != nil {
				return fmt.Errorf("invalid kv_events endpoint for worker %d dp_rank %d: %v", id, rank, err)
			}
			if rec.ReplayEndpoint != nil && *rec.ReplayEndpoint != "" {
				ep.Replay = *rec.ReplayEndpoint
				if err := validZMQEndpoint(ep.Replay); err != nil {
					return fmt.Errorf("invalid replay endpoint for worker %d: %v", id, err)
				}
			}
		}
		want[rank] = ep
	}
	if have, ok := s.r.ModelBlockSize(key); ok && have != bs {
		return fmt.Errorf("block_size mismatch for %s: existing=%d requested=%d", pk, have, bs)
	}
	s.sel.mu.Lock()
	eagle, known := s.sel.eagle[key]
	s.sel.mu.Unlock()
	if known && eagle != rec.eagle() {
		return fmt.Errorf("is_eagle mismatch for %s: existing=%t requested=%t", pk, eagle, rec.eagle())
	}
	capacity, maxTokens := clampInt64(rec.TotalKVBlocks), clampInt64(rec.MaxBatchedTokens)

	// What the router holds of the worker now, whoever registered it: the catalog's record is
	// the worker's whole truth (an upsert may move it to another partition, as in Dynamo).
	var stale []uint32
	held := map[uint32]bool{}
	moved := false
	for _, w := range s.r.Workers() {
		if w.ID != id {
			continue
		}
		if w.Model != key {
			moved = true
			break
		}
		if ep, ok := want[w.Rank]; ok && ep.Endpoint == w.Endpoint && ep.Replay == w.Replay {
			held[w.Rank] = true
		} else {
			stale = append(stale, w.Rank)
		}
	}
	fail := func(err error) error {
		if uerr := s.ch.Unregister(id); uerr != nil && !errors.Is(uerr, router.ErrUnknownWorker) {
			s.log.Warn("selection service: a worker whose registration failed is still registered", "worker", id, "err", uerr)
		}
		return err
	}
	switch {
	case moved || len(stale) > 0 && len(held) == 0:
		if err := s.ch.Unregister(id); err != nil && !errors.Is(err, router.ErrUnknownWorker) {
			return err
		}
		clear(held)
	default:
		for _, rank := range stale {
			if err := s.ch.UnregisterRank(id, rank); err != nil && !errors.Is(err, router.ErrUnknownWorker) {
				return fail(err)
			}
		}
	}
	g := router.Registration{ID: id, Model: key, BlockSize: bs, Capacity: capacity, MaxTokens: maxTokens, KeepRole: true}
	// The catalog's endpoint is where the worker serves requests: the front door's target too,
	// when it is an HTTP URL.
	if u, err := url.Parse(deref(rec.Endpoint)); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		g.HTTPEndpoint = deref(rec.Endpoint)
	}
	if g.HTTPEndpoint != "" && g.HTTPEndpoint != s.r.HTTPEndpoint(id) && len(held) > 0 && !moved {
		// Ranks unchanged, endpoint changed: re-registering a held rank updates it alone.
		up := g
		up.Ranks = []uint32{slices.Min(slices.Collect(maps.Keys(held)))}
		if err := s.ch.Register(up); err != nil {
			return fail(dynamoField(err))
		}
	}
	if !kvEvents {
		// No endpoints to tell apart: the ranks not held, in one registration.
		for _, rank := range slices.Sorted(maps.Keys(want)) {
			if !held[rank] {
				g.Ranks = append(g.Ranks, rank)
			}
		}
		if len(g.Ranks) > 0 {
			if err := s.ch.Register(g); err != nil {
				return fail(dynamoField(err))
			}
		}
		return nil
	}
	for _, rank := range slices.Sorted(maps.Keys(want)) {
		if held[rank] {
			continue
		}
		ep := want[rank]
		g.Ranks, g.Endpoint, g.Replay = []uint32{rank}, ep.Endpoint, ep.Replay
		if err := s.ch.Register(g); err != nil {
			return fail(dynamoField(err))
		}
	}
	return nil
}

// clampInt64 is *v as an int64 for a registration: 0 for nil, MaxInt64 past it.
func clampInt64(v *uint64) int64 {
	if v == nil {
		return 0
	}
	return int64(min(*v, math.MaxInt64))
}

// schedulable returns the catalog's schedulable records of (model, group); none says why not
// with Dynamo's 503 message.
func (s *Server) schedulable(model, group string) (map[uint64]*selRecord, string) {
	s.sel.mu.Lock()
	defer s.sel.mu.Unlock()
	out, any := map[uint64]*selRecord{}, false
	for id, rec := range s.sel.workers {
		if rec.Lifecycle != lifeSchedulable {
			continue
		}
		any = true
		if rec.Model == model && rec.Group == group {
			out[id] = rec
		}
	}
	switch {
	case !any:
		return nil, "no schedulable workers are available"
	case len(out) == 0:
		return nil, "no schedulable workers for " + partKey(model, group)
	}
	return out, ""
}

// rankLabel is a dp rank as a JSON object's key.
func rankLabel(r uint32) string { return strconv.FormatUint(uint64(r), 10) }
