package frontdoor

import (
	"bufio"
	"cmp"
	"encoding/json"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/valyala/fasthttp"
)

// GET /v1/kv-cache/stats/stream, as Dynamo's frontend serves it (lib/llm http/service
// kv_stats.rs on ai-dynamo/dynamo main): newline-delimited JSON (application/x-ndjson, not
// server-sent events), no query parameters, one kv_stats_snapshot line at once and then one a
// second until the client leaves or the server shuts down. Each snapshot lists every model with
// workers, one pool per worker role, from the Router's own view: the ranks registered
// (expected_ranks), those whose KV capacity is known (observed_ranks), the blocks the index
// holds on them (used_blocks) and the load booked on them.

const kvStatsInterval = time.Second

// kvStatsIDs numbers the snapshots of every stream, as Dynamo's process-wide counter does.
var kvStatsIDs atomic.Uint64

type kvStatsSnapshot struct {
	V          int            `json:"v"`
	Type       string         `json:"type"`
	SnapshotID uint64         `json:"snapshot_id"`
	ObservedAt int64          `json:"observed_at_unix_ms"`
	Models     []kvModelStats `json:"models"`
}

type kvModelStats struct {
	Model        string          `json:"model"`
	Aliases      []string        `json:"aliases"`
	RoutingCache *kvRoutingCache `json:"routing_cache,omitempty"`
	Pools        []*kvPoolStats  `json:"pools"`
}

type kvRoutingCache struct {
	Role     string `json:"role"`
	Capacity uint64 `json:"capacity_tokens"`
	Used     uint64 `json:"used_tokens"`
	Free     uint64 `json:"free_tokens"`
	Complete bool   `json:"complete"`
}

type kvPoolStats struct {
	Namespace     string  `json:"namespace"`
	Component     string  `json:"component"`
	Endpoint      string  `json:"endpoint"`
	Role          string  `json:"role"`
	StorageTier   string  `json:"storage_tier"`
	BlockSize     uint32  `json:"block_size_tokens"`
	ExpectedRanks uint64  `json:"expected_ranks"`
	ObservedRanks uint64  `json:"observed_ranks"`
	Capacity      *uint64 `json:"capacity_blocks,omitempty"`
	Used          *uint64 `json:"used_blocks,omitempty"`
	Free          *uint64 `json:"free_blocks,omitempty"`
	ActiveDecode  *uint64 `json:"active_decode_blocks,omitempty"`
	ActivePrefill *uint64 `json:"active_prefill_tokens,omitempty"`
	Complete      bool    `json:"complete"`

	capacity, used, decode, prefill uint64
}

// Dynamo names a pool by the workers' endpoint; kvrouterd's workers have none, so a pool is
// named as a Dynamo worker is by default (namespace dynamo, component backend, endpoint
// generate) and told apart by its role.
const (
	kvNamespace = "dynamo"
	kvComponent = "backend"
	kvEndpoint  = "generate"
)

// dynamoRole is Dynamo's WorkerType name of a role: both stages are "aggregated".
func dynamoRole(role string) string {
	if role == router.RoleBoth.String() {
		return "aggregated"
	}
	return role
}

// kvStats builds one snapshot.
func (d *Door) kvStats(now time.Time) kvStatsSnapshot {
	snap := kvStatsSnapshot{V: 1, Type: "kv_stats_snapshot", SnapshotID: kvStatsIDs.Add(1), ObservedAt: now.UnixMilli(), Models: []kvModelStats{}}
	byModel := map[string]*kvModelStats{}
	for _, w := range d.r.Workers() {
		m := byModel[w.Model]
		if m == nil {
			m = &kvModelStats{Model: w.Model, Aliases: []string{}}
			byModel[w.Model] = m
		}
		role := dynamoRole(w.Role)
		i := slices.IndexFunc(m.Pools, func(p *kvPoolStats) bool { return p.Role == role })
		if i < 0 {
			m.Pools = append(m.Pools, &kvPoolStats{Namespace: kvNamespace, Component: kvComponent, Endpoint: kvEndpoint, Role: role,
				StorageTier: "device", BlockSize: uint32(w.BlockSize)})
			i = len(m.Pools) - 1
		}
		p := m.Pools[i]
		p.ExpectedRanks++
		if w.Capacity > 0 {
			p.ObservedRanks++
			p.capacity += uint64(w.Capacity)
			p.used += uint64(min(max(w.CachedBlocks, 0), w.Capacity))
		}
		p.decode += uint64(max(w.ActiveBlocks, 0))
		p.prefill += uint64(max(w.ActivePrefill, 0))
	}
	for _, m := range byModel {
		for _, p := range m.Pools {
			p.Complete = p.ObservedRanks == p.ExpectedRanks
			p.ActiveDecode, p.ActivePrefill = &p.decode, &p.prefill
			if p.Complete {
				// Capacity and occupancy only once every rank has told its capacity: a part of
				// the pool is no figure for the whole.
				free := p.capacity - p.used
				p.Capacity, p.Used, p.Free = &p.capacity, &p.used, &free
			}
		}
		slices.SortFunc(m.Pools, func(a, b *kvPoolStats) int { return cmp.Compare(a.Role, b.Role) })
		m.RoutingCache = routingCache(m.Pools)
		snap.Models = append(snap.Models, *m)
	}
	slices.SortFunc(snap.Models, func(a, b kvModelStats) int { return cmp.Compare(a.Model, b.Model) })
	return snap
}

// routingCache is the capacity the router's cache decisions draw on, in tokens, as Dynamo
// sums it: the aggregated pools if any, else the decode pools; only if all of them are
// complete and their capacity is not zero.
func routingCache(pools []*kvPoolStats) *kvRoutingCache {
	role := ""
	for _, want := range []string{"aggregated", "decode"} {
		if slices.ContainsFunc(pools, func(p *kvPoolStats) bool { return p.Role == want }) {
			role = want
			break
		}
	}
	if role == "" {
		return nil
	}
	rc := &kvRoutingCache{Role: role, Complete: true}
	for _, p := range pools {
		if p.Role != role {
			continue
		}
		if !p.Complete {
			return nil
		}
		bs := uint64(p.BlockSize)
		rc.Capacity += p.capacity * bs
		rc.Used += p.used * bs
		rc.Free += (p.capacity - p.used) * bs
	}
	if rc.Capacity == 0 {
		return nil
	}
	return rc
}

// kvStatsStream answers GET /v1/kv-cache/stats/stream.
func (d *Door) kvStatsStream(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		ctx.Response.Header.Set("Allow", "GET")
		d.fail(ctx, "other", fasthttp.StatusMethodNotAllowed, "method_not_allowed", "", "use GET")
		return
	}
	ctx.SetContentType("application/x-ndjson")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	shutdown := ctx.Done()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		t := time.NewTicker(kvStatsInterval)
		defer t.Stop()
		enc := json.NewEncoder(w) // one line per value
		for {
			if enc.Encode(d.kvStats(time.Now())) != nil || w.Flush() != nil {
				return // the client left
			}
			select {
			case <-shutdown:
				return
			case <-t.C:
			}
		}
	})
}
