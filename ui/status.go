package ui

import (
	"runtime/metrics"
	"strconv"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
)

// Status is the document of GET /ui/status.json: the daemon's state at Time. Counters are totals
// since the start (the page takes rates from two documents); ages are the server's clock's.
type Status struct {
	Time          time.Time      `json:"time"`
	UptimeSeconds float64        `json:"uptime_seconds"`
	Index         IndexStatus    `json:"index"`
	Memory        MemoryStatus   `json:"memory"`
	Routes        RouteStatus    `json:"routes"`
	Events        EventStatus    `json:"events"`
	Queues        QueueStatus    `json:"queues"`
	Snapshot      SnapshotStatus `json:"snapshot"`
	Models        []ModelStatus  `json:"models"`
	// WorkerIDs counts the registered workers, WorkersTotal their ranks; Workers lists the
	// first MaxWorkers ranks, by model, worker and rank.
	WorkerIDs    int            `json:"worker_ids"`
	WorkersTotal int            `json:"workers_total"`
	Workers      []WorkerStatus `json:"workers"`
}

// IndexStatus is the size of every model's index together: distinct blocks and (block, worker)
// pairs of the device tier, and the pairs of the lower tiers (host, disk, external).
type IndexStatus struct {
	Blocks          int64 `json:"blocks"`
	Residencies     int64 `json:"residencies"`
	LowerTierBlocks int64 `json:"lower_tier_residencies"`
}

// MemoryStatus is the daemon's memory as the Go runtime counts it (the index is most of it):
// HeapBytes the heap's objects, live or not yet swept; RuntimeBytes all the runtime holds from
// the operating system.
type MemoryStatus struct {
	HeapBytes    uint64 `json:"heap_bytes"`
	RuntimeBytes uint64 `json:"runtime_bytes"`
}

// RouteStatus counts requests: routed and matched, routed and not completed yet (Active), and
// the hit rate as dynamo_component_router_kv_hit_rate observes it — HitRateSum over
// HitRateRequests is the mean share of a routed request's blocks cached on the worker chosen.
type RouteStatus struct {
	Routed          int64   `json:"routed"`
	Matched         int64   `json:"matched"`
	Active          int64   `json:"active"`
	HitRateSum      float64 `json:"hit_rate_sum"`
	HitRateRequests uint64  `json:"hit_rate_requests"`
}

// EventStatus counts KV events: Processed (applied or not), Applied (in full), and the gaps in
// event ids.
type EventStatus struct {
	Processed int64 `json:"processed"`
	Applied   int64 `json:"applied"`
	Gaps      int64 `json:"gaps"`
}

// QueueStatus is what waits now: requests in the router queue (every model's; RouterEnabled
// false without --router-queue-threshold) and event batches in the shard queues.
type QueueStatus struct {
	RouterEnabled bool  `json:"router_enabled"`
	Router        int64 `json:"router"`
	Events        int64 `json:"events"`
}

// SnapshotStatus is the newest snapshot written or restored: when it was taken and how long ago.
// Enabled is false with --no-snapshots; Last is absent before the first.
type SnapshotStatus struct {
	Enabled    bool      `json:"enabled"`
	Last       time.Time `json:"last,omitzero"`
	AgeSeconds *float64  `json:"age_seconds,omitempty"`
}

// ModelStatus is one model's index.
type ModelStatus struct {
	Model       string `json:"model"`
	BlockSize   int    `json:"block_size"`
	Workers     int    `json:"workers"`
	Blocks      int64  `json:"blocks"`
	Residencies int64  `json:"residencies"`
}

// WorkerStatus is one registered (worker, dp rank). WorkerID is a decimal string: worker ids
// are 64-bit and JavaScript's numbers keep 53 bits.
type WorkerStatus struct {
	WorkerID       string             `json:"worker_id"`
	Rank           uint32             `json:"dp_rank"`
	Model          string             `json:"model"`
	Role           string             `json:"role"`
	State          router.SourceState `json:"state,omitempty"`
	LastEventAt    time.Time          `json:"last_event_at,omitzero"`
	LastEventAge   *float64           `json:"last_event_age_seconds,omitempty"`
	LastEventID    uint64             `json:"last_event_id"`
	CachedBlocks   int64              `json:"cached_blocks"`
	ActiveBlocks   int64              `json:"active_blocks"`
	ActiveRequests int64              `json:"active_requests"`
	EventLag       int64              `json:"event_lag"`
	Endpoint       string             `json:"endpoint,omitempty"`
	HTTPEndpoint   string             `json:"http_endpoint,omitempty"`
	Problems       []string           `json:"problems,omitempty"`
	// Health is the rank's standing with the outlier ejection (router.WorkerInfo.Health): ok,
	// suspect or ejected; an ejected rank's EjectedForSeconds is how long until its time is up
	// (its health is probed then), Ejections its ejection multiplier.
	Health            string   `json:"health"`
	EjectedForSeconds *float64 `json:"ejected_for_seconds,omitempty"`
	Ejections         int      `json:"ejections,omitempty"`
}

// memSamples are the runtime/metrics read for MemoryStatus: reading them stops nothing.
var memSamples = [...]string{
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
}

// status builds the document at now.
func (p *Page) status(now time.Time) *Status {
	c := &p.cfg
	r := c.Router
	st := r.Stats()
	doc := &Status{Time: now, UptimeSeconds: now.Sub(c.Started).Seconds()}

	for _, m := range r.Models() {
		doc.Models = append(doc.Models, ModelStatus{Model: m.Name, BlockSize: m.BlockSize, Workers: m.Workers,
			Blocks: m.Blocks, Residencies: m.Residencies})
		doc.Index.Blocks += m.Blocks
		doc.Index.Residencies += m.Residencies
		doc.Index.LowerTierBlocks += m.HostResidencies + m.DiskResidencies + m.ExternalResidencies
	}

	ms := make([]metrics.Sample, len(memSamples))
	for i, name := range memSamples {
		ms[i].Name = name
	}
	metrics.Read(ms)
	if ms[0].Value.Kind() == metrics.KindUint64 {
		doc.Memory.HeapBytes = ms[0].Value.Uint64()
	}
	if ms[1].Value.Kind() == metrics.KindUint64 && ms[2].Value.Kind() == metrics.KindUint64 {
		doc.Memory.RuntimeBytes = ms[1].Value.Uint64() - ms[2].Value.Uint64()
	}

	doc.Routes = RouteStatus{Routed: st.Routed, Matched: st.Matched, Active: st.ActiveRequests}
	if c.HitRate != nil {
		doc.Routes.HitRateSum, doc.Routes.HitRateRequests = c.HitRate()
	}
	doc.Events = EventStatus{Processed: st.Events.Events, Applied: st.Events.ByStatus[shard.OK], Gaps: st.Events.Gaps}

	doc.Queues.Events = st.Events.QueueDepth
	doc.Queues.RouterEnabled = c.RouterQueue
	for _, q := range r.QueueStats(nil) {
		doc.Queues.Router += q.Pending[0] + q.Pending[1]
	}

	if c.LastSnapshot != nil {
		doc.Snapshot.Enabled = true
		if t := c.LastSnapshot(); !t.IsZero() {
			age := max(0, now.Sub(t).Seconds())
			doc.Snapshot.Last, doc.Snapshot.AgeSeconds = t, &age
		}
	}

	ws := r.Workers()
	doc.WorkersTotal = len(ws)
	doc.Workers = make([]WorkerStatus, 0, min(len(ws), c.MaxWorkers))
	var last uint64
	for i := range ws {
		w := &ws[i]
		if i == 0 || w.ID != last { // Workers lists a worker's ranks together
			doc.WorkerIDs++
			last = w.ID
		}
		if len(doc.Workers) == c.MaxWorkers {
			continue
		}
		x := WorkerStatus{
			WorkerID: strconv.FormatUint(w.ID, 10), Rank: w.Rank, Model: w.Model, Role: w.Role, State: w.State,
			LastEventAt: w.LastEventAt, LastEventID: w.LastEventID, CachedBlocks: w.CachedBlocks,
			ActiveBlocks: w.ActiveBlocks, ActiveRequests: w.ActiveRequests, EventLag: w.EventLag,
			Endpoint: w.Endpoint, HTTPEndpoint: w.HTTPEndpoint, Problems: w.Problems,
			Health: w.Health, Ejections: w.Ejections,
		}
		if !w.EjectedUntil.IsZero() {
			left := max(0, w.EjectedUntil.Sub(now).Seconds())
			x.EjectedForSeconds = &left
		}
		if !w.LastEventAt.IsZero() {
			age := max(0, now.Sub(w.LastEventAt).Seconds())
			x.LastEventAge = &age
		}
		doc.Workers = append(doc.Workers, x)
	}
	if doc.Models == nil {
		doc.Models = []ModelStatus{}
	}
	return doc
}
