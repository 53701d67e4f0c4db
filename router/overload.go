package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
)

// This file is the overload filter, Dynamo's busy thresholds (its worker monitor): a worker
// whose every data-parallel rank is over a model's thresholds leaves the candidate set, and a
// request that finds every eligible worker overloaded is refused with ErrOverloaded.
//
// A rank is overloaded when any threshold set fires:
//
//   - active_prefill_tokens_threshold: its active prefill tokens (the router's bookings) >
//     the threshold;
//   - active_prefill_tokens_threshold_frac: its active prefill tokens > frac × the worker's
//     max_batched_tokens (10,000,000 while unknown, so never in practice, as Dynamo);
//   - active_decode_blocks_threshold: one of its block counts > threshold × the worker's
//     capacity_blocks (never while the capacity is unknown): the blocks the router booked, the
//     active blocks of its last load report, and the blocks in use by that report
//     (kv_usage × capacity). Dynamo latches the decode check: set by any of its signals, it
//     clears only when each signal's latest value is below the threshold. The latest values
//     are what the router holds, so the latch is their disjunction and needs no state of its
//     own: a low booking does not clear an overload a worker's report shows.
//
// A worker is overloaded only when all its ranks are (one busy rank does not take a worker out).
// The checks run on the route path, lock-free, only for a model whose thresholds are set; a
// model without takes the same path as before, the kv fast path included.

// ErrOverloaded refuses a request whose eligible workers are all overloaded, or whose pinned
// worker is (Dynamo's AllEligibleWorkersOverloaded and PinnedWorkerOverloaded). The HTTP API
// answers 529 by default.
var ErrOverloaded = errors.New("router: overloaded")

// Thresholds are a model's busy thresholds, Dynamo's LoadThresholdConfig; a plain value. Each
// is set only when its Has field is true; an unset one never fires.
type Thresholds struct {
	// DecodeBlocks is a fraction (0 to 1) of a worker's capacity_blocks.
	DecodeBlocks    float64
	HasDecodeBlocks bool
	// PrefillTokens is an absolute count of active prefill tokens.
	PrefillTokens    uint64
	HasPrefillTokens bool
	// PrefillFrac is a fraction (≥ 0) of a worker's max_batched_tokens.
	PrefillFrac    float64
	HasPrefillFrac bool
	// WaitingRequests is a count of requests waiting in the engine's own queue, from its load
	// reports (kvrouterd's; Dynamo has no such threshold): an engine that queues requests
	// already has more than it can run.
	WaitingRequests    uint64
	HasWaitingRequests bool
}

// Configured reports whether any threshold is set.
func (t Thresholds) Configured() bool {
	return t.HasDecodeBlocks || t.HasPrefillTokens || t.HasPrefillFrac || t.HasWaitingRequests
}

// Check says what is wrong with the set thresholds, in Dynamo's words, as an ErrInvalid.
func (t Thresholds) Check() error {
	if t.HasDecodeBlocks && !(t.DecodeBlocks >= 0 && t.DecodeBlocks <= 1) {
		return fieldErr(ErrInvalid, "active_decode_blocks_threshold", "active_decode_blocks_threshold must be between 0.0 and 1.0, got %v", t.DecodeBlocks)
	}
	if t.HasPrefillFrac && (!(t.PrefillFrac >= 0) || math.IsInf(t.PrefillFrac, 1)) {
		return fieldErr(ErrInvalid, "active_prefill_tokens_threshold_frac", "active_prefill_tokens_threshold_frac must be a finite value greater than or equal to 0.0, got %v", t.PrefillFrac)
	}
	return nil
}

// merge returns t with the thresholds set in u replacing t's (Dynamo's update: only the fields
// given change).
func (t Thresholds) merge(u Thresholds) Thresholds {
	if u.HasDecodeBlocks {
		t.DecodeBlocks, t.HasDecodeBlocks = u.DecodeBlocks, true
	}
	if u.HasPrefillTokens {
		t.PrefillTokens, t.HasPrefillTokens = u.PrefillTokens, true
	}
	if u.HasPrefillFrac {
		t.PrefillFrac, t.HasPrefillFrac = u.PrefillFrac, true
	}
	if u.HasWaitingRequests {
		t.WaitingRequests, t.HasWaitingRequests = u.WaitingRequests, true
	}
	return t
}

// String names the thresholds set, for error messages and logs.
func (t Thresholds) String() string {
	var parts []string
	if t.HasDecodeBlocks {
		parts = append(parts, fmt.Sprintf("active_decode_blocks_threshold %v", t.DecodeBlocks))
	}
	if t.HasPrefillTokens {
		parts = append(parts, fmt.Sprintf("active_prefill_tokens_threshold %d", t.PrefillTokens))
	}
	if t.HasWaitingRequests {
		parts = append(parts, fmt.Sprintf("waiting_requests_threshold %d", t.WaitingRequests))
	}
	if t.HasPrefillFrac {
		parts = append(parts, fmt.Sprintf("active_prefill_tokens_threshold_frac %v", t.PrefillFrac))
	}
	if parts == nil {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// initBusy gives a new model the configured thresholds. REQUIRES r.mu (the model is not
// published yet).
func (r *Router) initBusy(m *model) {
	if r.cfg.Busy.Configured() {
		t := r.cfg.Busy
		m.busy.Store(&t)
	}
}

// ModelThresholds is a model's busy thresholds, for listings.
type ModelThresholds struct {
	Model string
	Thresholds
}

// BusyThresholds returns model's busy thresholds and whether the model exists.
func (r *Router) BusyThresholds(model string) (Thresholds, bool) {
	m := r.model(model)
	if m == nil {
		return Thresholds{}, false
	}
	if t := m.busy.Load(); t != nil {
		return *t, true
	}
	return Thresholds{}, true
}

// ListBusyThresholds returns every model's busy thresholds, by model name (those with none set
// too).
func (r *Router) ListBusyThresholds() []ModelThresholds {
	models := *r.models.Load()
	out := make([]ModelThresholds, 0, len(models))
	for name, m := range models {
		mt := ModelThresholds{Model: name}
		if t := m.busy.Load(); t != nil {
			mt.Thresholds = *t
		}
		out = append(out, mt)
	}
	slices.SortFunc(out, func(a, b ModelThresholds) int { return strings.Compare(a.Model, b.Model) })
	return out
}

// SetBusyThresholds changes model's busy thresholds: those set in t replace the model's, the
// others stay (a threshold once set is not unset, as in Dynamo). The next request routed sees
// them. It returns the model's thresholds after the change. Errors: ErrInvalid (t.Check),
// ErrUnknownModel. This replica's alone: replicas do not share thresholds.
func (r *Router) SetBusyThresholds(model string, t Thresholds) (Thresholds, error) {
	if err := t.Check(); err != nil {
		return Thresholds{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.model(model)
	if m == nil {
		return Thresholds{}, fieldErr(ErrUnknownModel, "model", "Model '%s' not found. Thresholds can only be set for discovered models.", model)
	}
	var cur Thresholds
	if old := m.busy.Load(); old != nil {
		cur = *old
	}
	next := cur.merge(t)
	if next.Configured() {
		m.busy.Store(&next)
	}
	r.log.Info("busy thresholds updated", "model", model, "thresholds", next.String())
	return next, nil
}

// rankOverloaded reports whether the rank w is over t, and if so why, for the decision log.
// Lock-free: it reads the rank's load, its last report and its worker's capacity atomically.
func rankOverloaded(t *Thresholds, w *rankWorker) (bool, string) {
	l := w.load
	prefill := l.ActivePrefill()
	if t.HasPrefillTokens && prefill > 0 && uint64(prefill) > t.PrefillTokens {
		return true, fmt.Sprintf("active prefill tokens %d > active_prefill_tokens_threshold %d", prefill, t.PrefillTokens)
	}
	if t.HasPrefillFrac && prefillOver(prefill, t.PrefillFrac, w) {
		return true, fmt.Sprintf("active prefill tokens %d > %v × max_batched_tokens %d", prefill, t.PrefillFrac, maxTokensOf(w))
	}
	if t.HasWaitingRequests {
		if rep := w.report.Load(); rep != nil && uint64(rep.WaitingRequests) > t.WaitingRequests {
			return true, fmt.Sprintf("reported waiting requests %d > waiting_requests_threshold %d", rep.WaitingRequests, t.WaitingRequests)
		}
	}
	if t.HasDecodeBlocks {
		total := w.reg.capacity.Load()
		if total <= 0 {
			return false, ""
		}
		limit := t.DecodeBlocks * float64(total)
		if b := l.ActiveBlocks(); float64(b) > limit {
			return true, fmt.Sprintf("booked active blocks %d > %v × capacity_blocks %d", b, t.DecodeBlocks, total)
		}
		if rep := w.report.Load(); rep != nil {
			if float64(rep.ActiveBlocks) > limit {
				return true, fmt.Sprintf("reported active blocks %d > %v × capacity_blocks %d", rep.ActiveBlocks, t.DecodeBlocks, total)
			}
			if used := int64(math.Round(rep.KVUsage * float64(total))); float64(used) > limit {
				return true, fmt.Sprintf("reported used blocks %d (kv_usage %v) > %v × capacity_blocks %d", used, rep.KVUsage, t.DecodeBlocks, total)
			}
		}
	}
	return false, ""
}

// markOverloaded sets over[i] for every position of list whose worker is overloaded under t
// (every one of its ranks is), and returns how many workers are. list is sorted by id, so a
// worker's ranks are one run. With log and the debug log on, it writes why each was skipped.
func (r *Router) markOverloaded(t *Thresholds, list *workerList, over []bool, model string, log bool) int {
	n := 0
	debug := log && r.log.Enabled(context.Background(), slog.LevelDebug)
	for lo := 0; lo < len(list.ws); {
		hi := lo + 1
		for hi < len(list.ws) && list.keys[hi].ID == list.keys[lo].ID {
			hi++
		}
		all := true
		for i := lo; i < hi && all; i++ {
			all, _ = rankOverloaded(t, list.ws[i])
		}
		for i := lo; i < hi; i++ {
			over[i] = all
		}
		if all {
			n++
			if debug {
				for i := lo; i < hi; i++ {
					_, why := rankOverloaded(t, list.ws[i])
					r.log.Debug("worker skipped: overloaded", "model", model, "worker", list.keys[i].ID,
						"dp_rank", list.keys[i].Rank, "reason", why)
				}
			}
		}
		lo = hi
	}
	return n
}

// OverloadedWorkers returns, per model with thresholds set, how many of its workers are
// overloaded now, for the metrics.
func (r *Router) OverloadedWorkers() map[string]int {
	out := map[string]int{}
	for name, m := range *r.models.Load() {
		t := m.busy.Load()
		if t == nil {
			continue
		}
		list := m.list.Load()
		out[name] = r.markOverloaded(t, list, make([]bool, len(list.ws)), name, false)
	}
	return out
}

// OverloadRejected returns how many requests were refused with ErrOverloaded.
func (r *Router) OverloadRejected() int64 { return r.overloadRejected.Load() }

// maxTokensOf is rank w's max batched tokens: registered or reported, else Dynamo's default
// (10,000,000: a rank that never said is never busy in practice).
func maxTokensOf(w *rankWorker) int64 {
	if n := w.reg.maxTokens.Load(); n > 0 {
		return n
	}
	return defaultMaxTokens
}

// prefillOver reports whether prefill tokens exceed frac × rank w's max batched tokens: the busy
// measure of the router queue, of soft affinity and of --active-prefill-tokens-threshold-frac.
// Compared as floats, so that no fraction overflows.
func prefillOver(prefill int64, frac float64, w *rankWorker) bool {
	return float64(prefill) > frac*float64(maxTokensOf(w))
}
