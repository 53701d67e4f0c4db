package router

import (
	"slices"
	"strconv"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// MaxEventsPerBatch bounds one batch of events.
const MaxEventsPerBatch = 1 << 16

// ApplyEvents checks a batch of one worker's events and applies it, waiting until it is applied,
// and appends one outcome per event to dst. A batch that fails the checks (unknown worker or
// rank, another model, a block size or token count that disagrees with the model, a bad kind or
// tier) is refused whole with a FieldError and changes nothing. Stream anomalies — a gap or
// duplicate in event ids, an unknown parent — are not input errors: they are applied as
// package shard defines and reported in the outcomes.
func (r *Router) ApplyEvents(b *wire.EventBatch, dst []shard.Outcome) ([]shard.Outcome, error) {
	reg, ranks := r.ranksOf(b.Worker)
	if reg == nil {
		return dst, fieldErr(ErrUnknownWorker, "worker_id", "worker %d is not registered", b.Worker)
	}
	m := reg.model
	if b.Model != "" && b.Model != m.name {
		return dst, fieldErr(ErrConflict, "model", "worker %d serves model %q, not %q", b.Worker, m.name, b.Model)
	}
	if err := checkEvents(b.Events, m.blockSize, ranks); err != nil {
		return dst, err
	}
	reg.received.Add(int64(len(b.Events)))
	reg.lastSeen.Store(r.cfg.Now())
	err := r.set.Do(b.Worker, func(a *shard.Applier) {
		for i := range b.Events {
			dst = append(dst, a.Apply(m.ix, b.Worker, &b.Events[i]))
		}
	})
	if err != nil {
		return dst, ErrClosed
	}
	reg.applied.Add(int64(len(b.Events)))
	if len(b.Events) > 0 {
		reg.lastEvent.Store(time.Now().UnixNano())
	}
	return dst, nil
}

// ranksOf returns worker id's registration and its ranks, ascending; nil if it is not
// registered.
func (r *Router) ranksOf(id uint64) (*registration, []uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg := r.workers[id]
	if reg == nil {
		return nil, nil
	}
	ranks := make([]uint32, len(reg.ranks))
	for i, w := range reg.ranks {
		ranks[i] = w.key.Rank
	}
	return reg, ranks
}

// checkEvents checks a batch for a model of block size bs whose worker has ranks (ascending):
// the checks that refuse it whole.
func checkEvents(evs []kvevent.Event, bs int, ranks []uint32) error {
	if len(evs) > MaxEventsPerBatch {
		return fieldErr(ErrInvalid, "events", "%d events, at most %d per batch", len(evs), MaxEventsPerBatch)
	}
	for i := range evs {
		if err := checkEvent(&evs[i], i, bs, ranks); err != nil {
			return err
		}
	}
	return nil
}

// checkEvent checks one event; with ranks nil, any rank passes.
func checkEvent(ev *kvevent.Event, i, bs int, ranks []uint32) error {
	if _, ok := slices.BinarySearch(ranks, ev.Rank); !ok && ranks != nil {
		return fieldErr(ErrUnknownWorker, evField(i, "dp_rank"), "rank %d is not registered for this worker", ev.Rank)
	}
	if ev.Tier > kvevent.External {
		return fieldErr(ErrInvalid, evField(i, "medium"), "unknown storage tier %d", ev.Tier)
	}
	switch ev.Kind {
	case kvevent.Stored:
		if ev.BlockSize != 0 && ev.BlockSize != bs {
			return fieldErr(ErrInvalid, evField(i, "block_size"), "%d disagrees with the model's block size %d", ev.BlockSize, bs)
		}
		if len(ev.Hashes) == 0 {
			return fieldErr(ErrInvalid, evField(i, "block_hashes"), "a stored event needs at least one block")
		}
		if ev.Locals != nil {
			// Local hashes instead of tokens (a Dynamo dump's events).
			if len(ev.Locals) != len(ev.Hashes) || len(ev.Tokens) != 0 {
				return fieldErr(ErrInvalid, evField(i, "local_hashes"), "%d local hashes and %d token ids for %d blocks, want one local hash per block and no tokens",
					len(ev.Locals), len(ev.Tokens), len(ev.Hashes))
			}
			break
		}
		// Every tier is indexed, so a lower tier's copies need their tokens as the device's do.
		if len(ev.Tokens) != len(ev.Hashes)*bs {
			return fieldErr(ErrInvalid, evField(i, "token_ids"), "%d token ids for %d blocks of %d tokens", len(ev.Tokens), len(ev.Hashes), bs)
		}
		if ev.MM != nil && len(ev.MM) != len(ev.Hashes) {
			return fieldErr(ErrInvalid, evField(i, "mm_hashes"), "%d entries for %d blocks", len(ev.MM), len(ev.Hashes))
		}
	case kvevent.Removed:
		if len(ev.Hashes) == 0 {
			return fieldErr(ErrInvalid, evField(i, "block_hashes"), "a removed event needs at least one block")
		}
	case kvevent.Cleared:
	default:
		return fieldErr(ErrInvalid, evField(i, "kind"), "unknown event kind %d", ev.Kind)
	}
	return nil
}

func evField(i int, name string) string {
	return "events[" + strconv.Itoa(i) + "]." + name
}
