package server

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// Dynamo's /dump, its peers and the recovery from a peer's dump (lib/kv-router services/indexer
// server.rs and recovery.rs): the index as Dynamo's RouterEvents, per "model:routing_group",
// {"block_size": n, "events": [...]}, each stored event's blocks naming the engine's hash
// (block_hash) and Dynamo's local hash (tokens_hash), chained onto parent_hash.

// errNoTree is the dump of a partition by a router that keeps no block tree: what Dynamo's
// peers read as a failed dump, so that they try another peer rather than build a wrong index.
const errNoTree = "kvrouterd keeps no block tree (local hashes and parents) without --keep-block-tree; " +
	"/dump?form=sequence lists its blocks by sequence hash"

// dynamoDump writes the index in Dynamo's form, streamed; with ?form=sequence, kvrouterd's own:
// per (worker, rank) one event of every block, block_hash the engine's hash and tokens_hash the
// router's sequence hash, sorted, so that two replicas in the same state write the same bytes.
func (s *Server) dynamoDump(ctx *fasthttp.RequestCtx) {
	sequence := string(ctx.QueryArgs().Peek("form")) == "sequence"
	models := s.r.Models()
	slices.SortFunc(models, func(a, b router.ModelInfo) int { return cmp.Compare(dumpKey(a.Name), dumpKey(b.Name)) })
	ctx.SetContentType("application/json")
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		var tree []shard.TreeBlock
		var blocks []router.DumpedBlock
		var b []byte
		w.WriteByte('{')
		for i, m := range models {
			if i > 0 {
				w.WriteByte(',')
			}
			b = strconv.AppendQuote(b[:0], dumpKey(m.Name))
			if !sequence && !s.r.KeepsTree() {
				b = append(b, `:{"error":`...)
				b = strconv.AppendQuote(b, errNoTree)
				w.Write(append(b, '}'))
				continue
			}
			b = append(b, `:{"block_size":`...)
			b = strconv.AppendInt(b, int64(m.BlockSize), 10)
			w.Write(append(b, `,"events":[`...))
			ev := dumpEvents{w: w}
			for _, id := range s.r.ModelWorkers(m.Name) {
				if sequence {
					blocks = s.r.DumpWorker(id, blocks[:0])
					ev.sequence(id, blocks)
					continue
				}
				var left int
				tree, left = s.r.DumpTree(id, tree[:0])
				ev.tree(id, tree)
				if left > 0 {
					s.log.Debug("/dump: blocks left out (no tree, or no parent held)", "worker", id, "blocks", left)
				}
			}
			w.WriteString("]}")
		}
		w.WriteString("}\n")
	})
}

// dumpKey is Dynamo's name of a partition in a dump: "model:routing_group".
func dumpKey(name string) string {
	model, group := splitPartition(name)
	return model + ":" + group
}

// dumpEvents writes one partition's RouterEvents, numbering them.
type dumpEvents struct {
	w *bufio.Writer
	n uint64
	b []byte
}

// dynTierNames are Dynamo's storage_tier names, by kvevent.Tier.
var dynTierNames = [kvevent.NumTiers]string{"device", "host_pinned", "disk", "external"}

// begin starts an event of worker id's rank storing blocks of tier chained onto parent.
func (d *dumpEvents) begin(id uint64, rank uint32, tier kvevent.Tier, parent uint64, hasParent bool) {
	b := d.b[:0]
	if d.n > 0 {
		b = append(b, ',')
	}
	b = append(b, `{"worker_id":`...)
	b = strconv.AppendUint(b, id, 10)
	b = append(b, `,"storage_tier":"`...)
	b = append(b, dynTierNames[tier]...)
	b = append(b, `","event":{"event_id":`...)
	b = strconv.AppendUint(b, d.n, 10)
	b = append(b, `,"dp_rank":`...)
	b = strconv.AppendUint(b, uint64(rank), 10)
	b = append(b, `,"data":{"stored":{"parent_hash":`...)
	if hasParent {
		b = strconv.AppendUint(b, parent, 10)
	} else {
		b = append(b, "null"...)
	}
	d.b = append(b, `,"blocks":[`...)
	d.n++
}

func (d *dumpEvents) block(first bool, engine, tokens uint64) {
	if !first {
		d.b = append(d.b, ',')
	}
	d.b = append(d.b, `{"block_hash":`...)
	d.b = strconv.AppendUint(d.b, engine, 10)
	d.b = append(d.b, `,"tokens_hash":`...)
	d.b = strconv.AppendUint(d.b, tokens, 10)
	d.b = append(d.b, '}')
}

func (d *dumpEvents) end() {
	d.w.Write(append(d.b, "]}}}}"...))
}

// tree writes a worker's blocks (DumpTree's order: each rank's device tier, then its lower
// tiers, tagged with their storage_tier as Dynamo's dump tags its lower-tier indexers' events):
// a run of blocks of one tier each chained onto the one before it is one event, as an engine
// would have stored them.
func (d *dumpEvents) tree(id uint64, blocks []shard.TreeBlock) {
	for i := 0; i < len(blocks); {
		b := blocks[i]
		d.begin(id, b.Rank, b.Tier, b.Parent, b.HasParent)
		d.block(true, b.Engine, b.Local)
		j := i + 1
		for ; j < len(blocks) && blocks[j].Rank == b.Rank && blocks[j].Tier == b.Tier && blocks[j].HasParent && blocks[j].Parent == blocks[j-1].Engine; j++ {
			d.block(false, blocks[j].Engine, blocks[j].Local)
		}
		d.end()
		i = j
	}
}

// sequence writes a worker's blocks by sequence hash, one event per rank.
func (d *dumpEvents) sequence(id uint64, blocks []router.DumpedBlock) {
	for i := 0; i < len(blocks); {
		d.begin(id, blocks[i].Rank, kvevent.Device, 0, false)
		j := i
		for ; j < len(blocks) && blocks[j].Rank == blocks[i].Rank; j++ {
			d.block(j == i, blocks[j].Engine, blocks[j].Seq)
		}
		d.end()
		i = j
	}
}

type dynPeer struct {
	URL *string `json:"url"`
}

// dynamoPeer adds (201) or removes (200; 404 if unknown) a peer URL, as Dynamo's
// /register_peer and /deregister_peer do: the list is informational, recovery uses --peers.
func (s *Server) dynamoPeer(ctx *fasthttp.RequestCtx, add bool) {
	path := "/deregister_peer"
	if add {
		path = "/register_peer"
	}
	var j dynPeer
	if !s.dynamoJSON(ctx, path, &j, "url") {
		return
	}
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	if add {
		if s.peers == nil {
			s.peers = map[string]struct{}{}
		}
		if len(s.peers) >= maxPeers {
			s.dynamoError(ctx, fasthttp.StatusBadRequest, "too_many", "url", fmt.Sprintf("at most %d peers", maxPeers))
			return
		}
		s.peers[*j.URL] = struct{}{}
		ctx.SetStatusCode(fasthttp.StatusCreated)
		s.writeJSON(ctx, map[string]string{"status": "ok"})
		return
	}
	if _, ok := s.peers[*j.URL]; !ok {
		s.dynamoError(ctx, fasthttp.StatusNotFound, "unknown_peer", "url", "peer not found")
		return
	}
	delete(s.peers, *j.URL)
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

// maxPeers bounds the peer list, whatever clients register.
const maxPeers = 1024

// dynamoPeers lists the peer URLs, sorted.
func (s *Server) dynamoPeers(ctx *fasthttp.RequestCtx) {
	s.peersMu.Lock()
	list := slices.Sorted(maps.Keys(s.peers))
	s.peersMu.Unlock()
	if list == nil {
		list = []string{}
	}
	s.writeJSON(ctx, list)
}

// reopenLogs reopens the log file (Config.ReopenLogs), as Dynamo's /reopen_logs does its
// access log after a rotation: 200, also when the daemon logs to no file; 500 if it cannot.
func (s *Server) reopenLogs(ctx *fasthttp.RequestCtx) {
	if s.cfg.ReopenLogs != nil {
		if err := s.cfg.ReopenLogs(); err != nil {
			s.dynamoError(ctx, fasthttp.StatusInternalServerError, "io", "", err.Error())
			return
		}
	}
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

// RecoveryStats is what RecoverFromPeers did.
type RecoveryStats struct {
	Peer       string // the peer recovered from; "" if none answered
	Partitions int
	Workers    int
	Events     int
	Refused    int // events the index refused or skipped (an unknown parent, ...)
}

// RecoverFromPeers seeds the index from the first of peers whose /dump answers, as a Dynamo
// indexer does at start (recovery.rs): each partition's workers are registered and their events
// applied through Config.Changes, so that every replica reading the stream has them. A dump in
// Dynamo's form rebuilds the index from its local hashes, whether a Dynamo indexer or a
// kvrouterd with --keep-block-tree wrote it. The peers join the /peers list. It returns an error
// only if no peer could be recovered from (the daemon then starts empty, as Dynamo does).
// Called once, before the server serves.
func (s *Server) RecoverFromPeers(ctx context.Context, peers []string, timeout time.Duration) (RecoveryStats, error) {
	defer func() {
		s.peersMu.Lock()
		if s.peers == nil {
			s.peers = map[string]struct{}{}
		}
		for _, p := range peers {
			s.peers[p] = struct{}{}
		}
		s.peersMu.Unlock()
	}()
	var errs []error
	for _, p := range peers {
		if ctx.Err() != nil {
			return RecoveryStats{}, ctx.Err()
		}
		st, err := s.recoverFrom(p, timeout)
		if err == nil {
			s.log.Info("recovered the index from a peer's /dump", "peer", p, "partitions", st.Partitions,
				"workers", st.Workers, "events", st.Events, "refused", st.Refused)
			return st, nil
		}
		s.log.Warn("recovery from a peer failed", "peer", p, "err", err)
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
	}
	return RecoveryStats{}, fmt.Errorf("no reachable peers, starting with empty state: %w", errors.Join(errs...))
}

// dynDumpPartition and dynRouterEvent are a Dynamo dump's JSON (protocols.rs RouterEvent).
type dynDumpPartition struct {
	BlockSize int              `json:"block_size"`
	Events    []dynRouterEvent `json:"events"`
	Error     *string          `json:"error"`
}

type dynRouterEvent struct {
	Worker uint64 `json:"worker_id"`
	Tier   string `json:"storage_tier"`
	Event  struct {
		Rank uint32          `json:"dp_rank"`
		Data json.RawMessage `json:"data"`
	} `json:"event"`
}

type dynEventData struct {
	Stored *struct {
		Parent *uint64 `json:"parent_hash"`
		Blocks []struct {
			Engine uint64 `json:"block_hash"`
			Tokens uint64 `json:"tokens_hash"`
		} `json:"blocks"`
	} `json:"stored"`
	Removed *struct {
		Hashes []uint64 `json:"block_hashes"`
	} `json:"removed"`
}

func (s *Server) recoverFrom(peer string, timeout time.Duration) (RecoveryStats, error) {
	st := RecoveryStats{Peer: peer}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(strings.TrimRight(peer, "/") + "/dump")
	c := &fasthttp.Client{MaxResponseBodySize: math.MaxInt, ReadTimeout: timeout}
	if err := c.DoTimeout(req, resp, timeout); err != nil {
		return st, err
	}
	if code := resp.StatusCode(); code < 200 || code > 299 {
		return st, fmt.Errorf("peer returned status %d", code)
	}
	var dump map[string]dynDumpPartition
	if err := json.Unmarshal(resp.Body(), &dump); err != nil {
		return st, fmt.Errorf("the dump is not Dynamo's: %w", err)
	}
	for _, key := range slices.Sorted(maps.Keys(dump)) {
		if p := dump[key]; p.Error != nil {
			return st, fmt.Errorf("partition %q: %s", key, *p.Error)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(dump)) {
		model, group, ok := strings.Cut(key, ":")
		if !ok {
			return st, fmt.Errorf("invalid dump key format: %s", key)
		}
		if err := s.recoverPartition(partition(model, group), dump[key], &st); err != nil {
			return st, fmt.Errorf("partition %q: %w", key, err)
		}
		st.Partitions++
	}
	return st, nil
}

// recoverPartition registers the workers of one partition's dump and applies their events, in
// the dump's order, in batches the stream carries.
func (s *Server) recoverPartition(model string, p dynDumpPartition, st *RecoveryStats) error {
	if have, ok := s.r.ModelBlockSize(model); ok && have != p.BlockSize {
		s.log.Warn("recovery: the dump's block size differs from the model's; the model's is kept",
			"model", model, "dump", p.BlockSize, "model_block_size", have)
	}
	// Each worker's ranks, to register it with.
	ranks := map[uint64][]uint32{}
	for _, e := range p.Events {
		if !slices.Contains(ranks[e.Worker], e.Event.Rank) {
			ranks[e.Worker] = append(ranks[e.Worker], e.Event.Rank)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(ranks)) {
		rs := ranks[id]
		slices.Sort(rs)
		if m, ok := s.r.WorkerModel(id); ok {
			if m != model {
				return fmt.Errorf("worker %d is registered for %q here", id, m)
			}
			for _, r := range rs {
				if !s.r.HasRank(id, r) {
					return fmt.Errorf("worker %d has no rank %d here", id, r)
				}
			}
			continue
		}
		if err := s.ch.Register(router.Registration{ID: id, Model: model, BlockSize: p.BlockSize, Ranks: rs, KeepRole: true}); err != nil {
			return fmt.Errorf("worker %d: %w", id, err)
		}
		st.Workers++
	}
	var b wire.EventBatch
	var out []shard.Outcome
	blocks := 0
	flush := func() error {
		if len(b.Events) == 0 {
			return nil
		}
		var err error
		if out, err = s.ch.ApplyEvents(&b, out[:0]); err != nil {
			return fmt.Errorf("worker %d: %w", b.Worker, err)
		}
		for _, o := range out {
			if o.Status != shard.OK {
				st.Refused++
			}
		}
		st.Events += len(b.Events)
		b.Events, blocks = b.Events[:0], 0
		return nil
	}
	for i := range p.Events {
		e := &p.Events[i]
		if e.Worker != b.Worker || len(b.Events) >= 4096 || blocks >= 16384 {
			if err := flush(); err != nil {
				return err
			}
			b.Worker, b.Model = e.Worker, model
		}
		ev, err := dynEvent(e)
		if err != nil {
			return fmt.Errorf("events[%d]: %w", i, err)
		}
		blocks += len(ev.Hashes)
		b.Events = append(b.Events, ev)
	}
	return flush()
}

// dynEvent converts one of a dump's RouterEvents; unnumbered, so that the dump's event ids
// (its own count) are not read as the worker's stream.
func dynEvent(e *dynRouterEvent) (kvevent.Event, error) {
	ev := kvevent.Event{Rank: e.Event.Rank}
	switch e.Tier {
	case "", "device":
		ev.Tier = kvevent.Device
	case "host_pinned":
		ev.Tier = kvevent.Host
	case "disk":
		ev.Tier = kvevent.Disk
	case "external":
		ev.Tier = kvevent.External
	default:
		return ev, fmt.Errorf("storage_tier %q", e.Tier)
	}
	var name string
	if json.Unmarshal(e.Event.Data, &name) == nil {
		if name != "cleared" {
			return ev, fmt.Errorf("data %q", name)
		}
		ev.Kind = kvevent.Cleared
		return ev, nil
	}
	var d dynEventData
	if err := json.Unmarshal(e.Event.Data, &d); err != nil {
		return ev, fmt.Errorf("data: %w", err)
	}
	switch {
	case d.Stored != nil:
		ev.Kind = kvevent.Stored
		if d.Stored.Parent != nil {
			ev.Parent, ev.HasParent = *d.Stored.Parent, true
		}
		ev.Hashes = make([]uint64, len(d.Stored.Blocks))
		ev.Locals = make([]uint64, len(d.Stored.Blocks))
		for i, blk := range d.Stored.Blocks {
			ev.Hashes[i], ev.Locals[i] = blk.Engine, blk.Tokens
		}
	case d.Removed != nil:
		ev.Kind, ev.Hashes = kvevent.Removed, d.Removed.Hashes
	default:
		return ev, errors.New("data: neither stored, removed nor cleared")
	}
	return ev, nil // a lower tier's event goes to that tier's index
}
