package scoring

import (
	"errors"
	"fmt"
	"math"
)

// CostModel is the formula Params.Cost computes a logit with. The zero value is CostV1.
type CostModel uint8

const (
	// CostV1 is the formula of Dynamo's v1 releases, kvrouterd's default:
	// overlap_score_weight × prefill_blocks + decode_blocks.
	CostV1 CostModel = iota
	// CostMain is the formula of Dynamo's main branch (lib/kv-router/src/scheduling/selector/
	// default.rs, worker_logit): cached blocks are a credit against the prompt's blocks, decayed
	// for a worker whose prefill backlog exceeds the least loaded one's, the adjusted prefill
	// scaled, and each active request weighed on top of the decode blocks. See Terms.
	CostMain
	// CostTTFT is kvrouterd's own (costtime.go): the request's predicted time to first token
	// on the worker, in ms, from the prompt-side work queued there (decayed by the time since
	// it started) and its own uncached prompt, plus CacheWeight × the prefill time of the
	// prompt tokens it computes there.
	CostTTFT
	numCosts
)

var costNames = [numCosts]string{"v1", "main", "ttft"}

func (c CostModel) String() string {
	if c < numCosts {
		return costNames[c]
	}
	return fmt.Sprintf("cost(%d)", uint8(c))
}

// ErrCost reports an unknown cost formula.
var ErrCost = errors.New("scoring: unknown cost formula")

// ParseCost parses a formula's name: v1, main or ttft.
func ParseCost(s string) (CostModel, error) {
	for i, n := range costNames {
		if n == s {
			return CostModel(i), nil
		}
	}
	return 0, fmt.Errorf("%w %q (want v1, main or ttft)", ErrCost, s)
}

// Terms are the weights of CostMain, a plain value. Dynamo main's names and defaults
// (lib/kv-router/src/scheduling/config.rs, KvRouterConfig): overlap_score_credit 1.0,
// overlap_score_credit_decay 0.0, prefill_load_scale 1.0, decode_active_request_weight 0.0.
type Terms struct {
	// Credit is the share of a cached block taken off the prompt's prefill blocks, ≥ 0 (Dynamo
	// main took 0 to 1 until its agentic preset's credit of 2).
	Credit float64
	// CreditDecay shrinks the credit of a worker with more active prefill than the least
	// loaded candidate: credit / (1 + decay × excess prefill blocks / request blocks). 0: none.
	CreditDecay float64
	// LoadScale multiplies the prefill blocks left after the credit.
	LoadScale float64
	// RequestWeight is the cost, in blocks, of each request active on a worker.
	RequestWeight float64
}

// DefaultTerms returns Dynamo main's defaults.
func DefaultTerms() Terms {
	return Terms{Credit: 1, LoadScale: 1}
}

// Errors of Terms.Check, named by Dynamo's field names.
var (
	ErrCredit        = errors.New("scoring: overlap_score_credit must be a finite number ≥ 0")
	ErrCreditDecay   = errors.New("scoring: overlap_score_credit_decay must be a finite number ≥ 0")
	ErrLoadScale     = errors.New("scoring: prefill_load_scale must be a finite number ≥ 0")
	ErrRequestWeight = errors.New("scoring: decode_active_request_weight must be a finite number ≥ 0")
)

// Check reports the first weight of t out of range.
func (t *Terms) Check() error {
	switch {
	case !finiteNonNeg(t.Credit):
		return ErrCredit
	case !finiteNonNeg(t.CreditDecay):
		return ErrCreditDecay
	case !finiteNonNeg(t.LoadScale):
		return ErrLoadScale
	case !finiteNonNeg(t.RequestWeight):
		return ErrRequestWeight
	}
	return nil
}

func finiteNonNeg(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// NeedsMinPrefill reports whether p's logits depend on Params.MinActivePrefill: the caller must
// set it to the least active prefill among the candidates before scoring.
func (p *Params) NeedsMinPrefill() bool {
	return p.Formula == CostMain && p.TrackPrefill && p.CreditDecay > 0
}

// mainLogit is CostMain's logit, each operation in the order of Dynamo main's worker_logit
// (selector/default.rs) and WorkerSelectionInput::row (selector/mod.rs), so that the numbers
// agree to the last bit:
//
//	raw_prefill_blocks = (active_prefill + max(isl, cached × block_size)) / block_size
//	                     (0 when the request's prefill is not tracked)
//	decay              = 1 / (1 + credit_decay × (max(active_prefill − min_active_prefill, 0) /
//	                     block_size) / ⌈isl / block_size⌉)   (1 untracked or without decay)
//	adjusted           = max(raw_prefill_blocks − (credit × decay × cached + lower), 0)
//	logit              = prefill_load_scale × adjusted + decode_blocks
//	                     + decode_active_request_weight × active_requests
//
// lower is the lower tiers' credit (TierCredit.of: host_cache_hit_weight × host extension +
// disk_cache_hit_weight × disk and external extensions), 0 without any. Dynamo's shared-cache
// credit has no counterpart, nor has its branch for a decode-only worker pool.
func (p *Params) mainLogit(cached int32, lower float64, decode, activePrefill, activeRequests int64) float64 {
	bs := int64(p.BlockSize)
	raw, credit := 0.0, p.Credit
	if p.TrackPrefill {
		isl := int64(p.ISL)
		raw = float64(activePrefill+max(isl, int64(cached)*bs)) / float64(bs)
		if p.CreditDecay > 0 {
			excess := float64(max(activePrefill-p.MinActivePrefill, 0)) / float64(bs)
			credit *= 1 / (1 + p.CreditDecay*(excess/float64((isl+bs-1)/bs)))
		}
	}
	adjusted := max(raw-(credit*float64(cached)+lower), 0)
	return p.LoadScale*adjusted + float64(decode) + p.RequestWeight*float64(activeRequests)
}

// TierCredit weighs a worker's blocks in the lower storage tiers, beyond its device prefix, as
// a share of a cached block: Dynamo's host_cache_hit_weight and disk_cache_hit_weight (the disk
// weight also credits the external tier, as Dynamo's disk overlap counts it). A plain value.
type TierCredit struct {
	Host, Disk float64
}

// DefaultTierCredit returns Dynamo's defaults: 0.75 for the host tier, 0.25 for disk and external.
func DefaultTierCredit() TierCredit { return TierCredit{Host: 0.75, Disk: 0.25} }

// Errors of TierCredit.Check, named by Dynamo's field names.
var (
	ErrHostWeight = errors.New("scoring: host_cache_hit_weight must be a finite number ≥ 0")
	ErrDiskWeight = errors.New("scoring: disk_cache_hit_weight must be a finite number ≥ 0")
)

// Check reports the first weight of c out of range.
func (c *TierCredit) Check() error {
	switch {
	case !finiteNonNeg(c.Host):
		return ErrHostWeight
	case !finiteNonNeg(c.Disk):
		return ErrDiskWeight
	}
	return nil
}

// of returns the credit, in blocks, of the lower-tier extensions e.
func (c *TierCredit) of(e TierExt) float64 {
	return c.Host*float64(e.Host) + c.Disk*float64(e.Disk+e.External)
}

// TierExt is how many blocks the lower tiers add to a worker's device prefix, tier after tier
// (radix.TierMatch): the host extension starts at the device depth, the disk extension after
// the host's, the external after the disk's. A plain value.
type TierExt struct {
	Host, Disk, External int32
}

// Blocks returns the blocks of all the extensions.
func (e TierExt) Blocks() int32 { return e.Host + e.Disk + e.External }
