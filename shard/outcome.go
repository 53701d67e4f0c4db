package shard

import (
	"fmt"
	"sync/atomic"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// Status says why an event was not applied in full.
type Status uint8

const (
	OK Status = iota
	// Duplicate: the event's id is not after the (worker, rank) cursor; dropped.
	Duplicate
	// UnknownParent: a stored event chains onto a block the worker does not hold here, which
	// means an event was missed; dropped whole rather than applied at the wrong depth.
	UnknownParent
	// BadBlockSize: the event states a block size other than its model's; dropped.
	BadBlockSize
	// BadTokens: a stored event's token count is not blocks × block size; dropped.
	BadTokens
	// BadKind: the event kind is not one of Stored, Removed, Cleared; dropped.
	BadKind
	// OverBudget: the residency budget was reached; Skipped trailing blocks were not stored.
	OverBudget
	// UnknownBlocks: a removal named Skipped blocks the worker does not hold; the rest applied.
	UnknownBlocks
	// OtherTier: the event names a storage tier beyond those the index keeps (device, host,
	// disk, external); skipped. Decoders refuse such tiers, so it counts only direct callers.
	OtherTier
	// WrongModel: the worker's events went to another model's index before; dropped.
	WrongModel
	// NoSlot: the model's index has no free worker slot; dropped.
	NoSlot
	numStatus
)

var statusNames = [numStatus]string{"ok", "duplicate", "unknown_parent", "bad_block_size",
	"bad_tokens", "bad_kind", "over_budget", "unknown_blocks", "other_tier", "wrong_model", "no_slot"}

func (s Status) String() string {
	if s < numStatus {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// NumKinds bounds the Kind index of Stats.ByKind.
const NumKinds = int(Cleared) + 1

// NumStatus is the number of Status values.
const NumStatus = int(numStatus)

// Outcome is what applying one event did.
type Outcome struct {
	Worker  uint64
	Rank    uint32
	EventID uint64
	Kind    Kind
	Status  Status
	// Gap is the number of event ids missing right before this one (the event itself was
	// applied): the caller should repair the worker (replay, or clear and resync).
	Gap uint64
	// Cleared is the residencies of the event's rank dropped before applying it, to repair a gap
	// (Applier.ClearOnGap).
	Cleared int
	Applied int // blocks stored or removed
	Skipped int // blocks named by the event but not applied (see Status)
}

// Anomalous reports whether the outcome needs a caller's attention.
func (o Outcome) Anomalous() bool { return o.Status != OK || o.Gap != 0 }

func (o Outcome) String() string {
	s := fmt.Sprintf("worker %d rank %d event %d %s: %s applied=%d skipped=%d",
		o.Worker, o.Rank, o.EventID, o.Kind, o.Status, o.Applied, o.Skipped)
	if o.Gap != 0 {
		s += fmt.Sprintf(" gap=%d", o.Gap)
	}
	return s
}

// Observer receives the anomalous outcomes (gaps, duplicates, unknown parents, …). It is called
// on the shard goroutine that applied the event and must return quickly; implementations are
// called concurrently from all shards.
type Observer interface {
	Observe(Outcome)
}

// Stats are cumulative counters of event application. Read with Set.Stats or Applier.Stats.
type Stats struct {
	Batches       int64
	Events        int64 // events processed, applied or not
	StoredBlocks  int64 // residencies added
	RemovedBlocks int64 // residencies removed, by removals, clears and worker removal
	Clears        int64
	Gaps          int64 // events that arrived after a gap in ids
	MissedIDs     int64 // ids missing in those gaps
	GapClears     int64 // ranks cleared to repair a gap (Config.ClearOnGap)
	// ByStatus counts events per Status (ByStatus[OK] are events applied in full).
	ByStatus [numStatus]int64
	// ByKind counts events per Kind (index: Stored, Removed, Cleared; 0 for any other) and
	// Status; each ByStatus is the sum over kinds.
	ByKind [NumKinds][numStatus]int64
	// SkippedBlocks counts blocks named by events but not applied.
	SkippedBlocks  int64
	WorkersRemoved int64
	EnqueueWaits   int64 // Enqueue calls that found the queue full and waited
	QueueDepth     int64 // batches waiting now, over all shards
	Residencies    int64 // (block, worker) pairs held now, over all shards and every tier
	// TierResidencies splits Residencies by storage tier (kvevent.Tier).
	TierResidencies [kvevent.NumTiers]int64
	// Evicted counts the residencies dropped to make room under the budget (Config.Evict),
	// also counted in RemovedBlocks.
	Evicted int64
}

// counters is the atomic form of Stats kept by each shard: written by its goroutine, read by
// anyone.
type counters struct {
	batches, events, stored, removed, clears, gaps, missed atomic.Int64
	gapClears                                              atomic.Int64
	byKind                                                 [NumKinds][numStatus]atomic.Int64
	skipped, workersRemoved, enqueueWaits, residencies     atomic.Int64
	tierResidencies                                        [kvevent.NumTiers]atomic.Int64 // lower tiers only
	evicted                                                atomic.Int64
}

func (c *counters) addTo(s *Stats) {
	s.Batches += c.batches.Load()
	s.Events += c.events.Load()
	s.StoredBlocks += c.stored.Load()
	s.RemovedBlocks += c.removed.Load()
	s.Clears += c.clears.Load()
	s.Gaps += c.gaps.Load()
	s.MissedIDs += c.missed.Load()
	s.GapClears += c.gapClears.Load()
	for k := range c.byKind {
		for i := range c.byKind[k] {
			n := c.byKind[k][i].Load()
			s.ByKind[k][i] += n
			s.ByStatus[i] += n
		}
	}
	s.SkippedBlocks += c.skipped.Load()
	s.Evicted += c.evicted.Load()
	s.WorkersRemoved += c.workersRemoved.Load()
	s.EnqueueWaits += c.enqueueWaits.Load()
	res := c.residencies.Load()
	s.Residencies += res
	for t := 1; t < kvevent.NumTiers; t++ {
		n := c.tierResidencies[t].Load()
		s.TierResidencies[t] += n
		res -= n
	}
	s.TierResidencies[kvevent.Device] += res
}
