package scoring

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync/atomic"
)

// Candidate is one worker (id, data-parallel rank) considered for a request: its inputs, filled by
// the caller, and the scores Score computes. A slice of candidates belongs to one goroutine.
type Candidate struct {
	Worker uint64
	Rank   uint32

	// Cached is the number of leading blocks of the request the worker holds (its contiguous
	// cached prefix, from the index).
	Cached int32
	// Ext is how far the lower storage tiers extend that prefix (zero without them); credited
	// by Params.Tiers.
	Ext TierExt
	// Shared is the number of leading full blocks of the request already active on the worker
	// (booked by concurrent requests with the same prefix, from the Tracker).
	Shared int32
	// Tree is the number of blocks the worker holds in all; it breaks ties.
	Tree int64
	// ActiveBlocks and ActivePrefill are the worker's booked load: blocks, and prefill tokens
	// not yet done.
	ActiveBlocks   int64
	ActivePrefill  int64
	ActiveRequests int64
	// Pending is the worker's booked requests whose prefill is not done (Load.Pending).
	Pending int64
	// Slow is how long the worker's steps take relative to the model's (Load.SlownessStep),
	// which CostTTFT's predicted time is multiplied by; 0 counts as 1.
	Slow float64
	// DeviceWeight is the worker's capacity relative to the others' for DeviceAwareWeighted
	// (0 counts as 1).
	DeviceWeight float64

	// PrefillTokens is what the worker would prefill: its active prefill tokens (if tracked) and
	// this request's uncached tokens.
	PrefillTokens int64
	// DecodeBlocks is the worker's active blocks with this request added.
	DecodeBlocks int64
	// Logit is the cost (see Params.Cost). Lower is better.
	Logit float64

	weight float64 // softmax scratch
}

// Params are the per-request inputs of Score and Choose. A Params value is plain data.
type Params struct {
	Mode        Mode
	BlockSize   int
	ISL         int // prompt length in tokens
	Blocks      int // full blocks of the prompt (ISL / BlockSize, or the hashes given)
	Weight      float64
	Temperature float64
	// TrackPrefill charges the request's own uncached tokens as prefill (and the router books
	// them); off, they are neither charged nor booked, as in Dynamo, so that routing sees only
	// the workers' load (a decode stage's routing). A worker's active prefill counts either way.
	TrackPrefill bool

	// Formula is the cost formula; CostMain reads Terms (Weight is CostV1's alone).
	Formula CostModel
	Terms
	// Tiers weighs the lower-tier extensions of a candidate's prefix (Candidate.Ext) in both
	// formulas; see CostExt.
	Tiers TierCredit
	// MinActivePrefill is the least active prefill among the request's candidates, which
	// CostMain's credit decay measures backlogs from; set it when NeedsMinPrefill.
	MinActivePrefill int64
	// Step is CostTTFT's model of the workers' steps (and PredictTTFT's).
	Step StepModel
	// CacheWeight is CostTTFT's price of a computed prompt token beyond its own prefill time,
	// in multiples of it: a computed block is a second copy of a prefix cached elsewhere or
	// a new one, and either pushes blocks other requests would hit out of the worker's cache.
	CacheWeight float64
	// Backlog is the fleet's requests waiting for their first token per worker, which
	// CostTTFT adds to CacheWeight; Score sets it from the candidates (see Backlog).
	Backlog float64
	// Decay says the caller decayed the candidates' active prefill (StepModel.Decayed) to
	// Now, a reading of the Tracker's clock (ns): always under CostTTFT.
	Decay bool
	Now   int64
}

// Errors of Choose.
var (
	ErrNoWorkers   = errors.New("scoring: no worker to route to")
	ErrTemperature = errors.New("scoring: temperature must be a finite number ≥ 0")
	ErrWeight      = errors.New("scoring: overlap score weight must be a finite number ≥ 0")
	ErrCacheWeight = errors.New("scoring: cache weight must be a finite number ≥ 0")
)

// Check reports whether the numbers in p can be scored.
func (p *Params) Check() error {
	if !(p.Temperature >= 0) || math.IsInf(p.Temperature, 1) {
		return ErrTemperature
	}
	if !(p.Weight >= 0) || math.IsInf(p.Weight, 1) {
		return ErrWeight
	}
	if p.BlockSize <= 0 || p.ISL < 0 || p.Blocks < 0 {
		return errors.New("scoring: block size, isl and blocks must be positive")
	}
	if err := p.Tiers.Check(); err != nil {
		return err
	}
	if p.Formula == CostMain {
		return p.Terms.Check()
	}
	if p.Formula == CostTTFT {
		if !finiteNonNeg(p.CacheWeight) || !finiteNonNeg(p.Backlog) {
			return ErrCacheWeight
		}
		return p.Step.Check()
	}
	if p.Formula >= numCosts {
		return ErrCost
	}
	return nil
}

// Score computes PrefillTokens, DecodeBlocks and Logit for every candidate; for a formula that
// needs them, it sets p.MinActivePrefill or p.Backlog from c first (c being every candidate
// of the request).
func Score(c []Candidate, p *Params) {
	if p.NeedsMinPrefill() {
		p.MinActivePrefill = MinPrefill(c)
	}
	if p.Formula == CostTTFT {
		p.Backlog = Backlog(c)
	}
	for i := range c {
		x := &c[i]
		x.PrefillTokens, x.DecodeBlocks, x.Logit = p.CostAt(x)
	}
}

// MinPrefill returns the least ActivePrefill of c (0 for none): Params.MinActivePrefill.
func MinPrefill(c []Candidate) int64 {
	if len(c) == 0 {
		return 0
	}
	lo := c[0].ActivePrefill
	for i := range c[1:] {
		lo = min(lo, c[i+1].ActivePrefill)
	}
	return lo
}

// Cost is the cost function for one worker: from the request's blocks it holds (cached) and has
// active (shared), and its booked load, the tokens it would prefill, its active blocks with the
// request added, and the logit: with CostV1, Weight × prefill/BlockSize + decode blocks; with
// CostMain, Dynamo main's formula (see mainLogit). Score is Cost for each candidate; a caller
// that scores workers its own way calls Cost, so that its numbers are Score's to the bit.
func (p *Params) Cost(cached, shared int32, activeBlocks, activePrefill, activeRequests int64) (prefill, decode int64, logit float64) {
	prefill, decode, logit = p.CostV1(cached, shared, activeBlocks, activePrefill)
	switch p.Formula {
	case CostMain:
		logit = p.mainLogit(cached, 0, decode, activePrefill, activeRequests)
	case CostTTFT:
		logit = p.ttftLogit(cached, shared, TierExt{}, decode, activePrefill, activeRequests)
	}
	return prefill, decode, logit
}

// CostExt is Cost for a worker whose device prefix of cached blocks the lower storage tiers
// extend by ext: the logit credits each extension block by its tier's weight (p.Tiers). Under
// CostMain that is Dynamo main's formula (see mainLogit: the credit adds to the device's).
// Under CostV1, Dynamo v1's formula with the credited blocks counted as overlap:
//
//	overlap = cached + host_weight × ext.Host + disk_weight × (ext.Disk + ext.External)
//	logit   = Weight × (active_prefill + max(ISL − overlap × block_size, 0)) / block_size
//	          + decode_blocks
//
// prefill and decode are Cost's: the tokens the worker's device prefix leaves to compute, and
// its blocks with the request added, which is also what the router books; a reload from a
// lower tier is work the engine does, but not prefill.
func (p *Params) CostExt(cached int32, ext TierExt, shared int32, activeBlocks, activePrefill, activeRequests int64) (prefill, decode int64, logit float64) {
	prefill, decode, logit = p.CostV1(cached, shared, activeBlocks, activePrefill)
	if p.Formula == CostTTFT {
		return prefill, decode, p.ttftLogit(cached, shared, ext, decode, activePrefill, activeRequests)
	}
	if ext == (TierExt{}) && p.Formula != CostMain {
		return prefill, decode, logit
	}
	lower := p.Tiers.of(ext)
	if p.Formula == CostMain {
		return prefill, decode, p.mainLogit(cached, lower, decode, activePrefill, activeRequests)
	}
	bs := float64(p.BlockSize)
	tokens := float64(activePrefill)
	if p.TrackPrefill {
		tokens += max(float64(p.ISL)-(float64(cached)+lower)*bs, 0)
	}
	return prefill, decode, p.Weight*tokens/bs + float64(decode)
}

// CostV1 is Cost under CostV1 (whatever p.Formula says): small enough for the compiler to
// inline into the router's loops over workers, which call it when p.Formula is CostV1.
func (p *Params) CostV1(cached, shared int32, activeBlocks, activePrefill int64) (prefill, decode int64, logit float64) {
	bs := int64(p.BlockSize)
	prefill = activePrefill
	if p.TrackPrefill {
		prefill += max(int64(p.ISL)-int64(cached)*bs, 0)
	}
	decode = activeBlocks + int64(p.Blocks) - int64(shared)
	return prefill, decode, p.Weight*float64(prefill)/float64(bs) + float64(decode)
}

// Select returns the position of the chosen candidate by logit: the lowest at temperature 0 (ties
// broken by TieBreak: the smallest Tree, then at random), a softmax sample over range-normalised
// logits above 0. c must not be empty; rng may be nil (the runtime's source is used then).
func Select(c []Candidate, temperature float64, rng *rand.Rand) int {
	if temperature > 0 {
		return sample(c, temperature, rng)
	}
	// The lowest logit and its ties in one pass; a second pass finds the one drawn only when
	// several are equal in tree too.
	var tb TieBreak
	lo := math.Inf(1)
	for i := range c {
		switch l := c[i].Logit; {
		case l < lo:
			lo = l
			tb.Reset()
			tb.Add(i, c[i].Tree)
		case l == lo:
			tb.Add(i, c[i].Tree)
		}
	}
	first, only := tb.Draw(rng)
	if only {
		return first
	}
	for i := range c {
		if c[i].Logit == lo && tb.Take(c[i].Tree) {
			return i
		}
	}
	panic("scoring: no candidate at the lowest logit") // unreachable: Add counted them
}

// sample draws a candidate with probability ∝ exp(−(logit − min) / ((max − min) · temperature)),
// uniformly when all logits are equal.
func sample(c []Candidate, temperature float64, rng *rand.Rand) int {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range c {
		lo = min(lo, c[i].Logit)
		hi = max(hi, c[i].Logit)
	}
	if hi == lo {
		return intn(rng, len(c))
	}
	scale := 1 / ((hi - lo) * temperature)
	sum := 0.0
	for i := range c {
		w := math.Exp(-(c[i].Logit - lo) * scale)
		c[i].weight = w
		sum += w
	}
	u := float64frac(rng) * sum
	for i := range c {
		u -= c[i].weight
		if u < 0 {
			return i
		}
	}
	return len(c) - 1
}

// Chooser applies a routing mode. It keeps the round-robin position; safe for concurrent use.
type Chooser struct {
	next     atomic.Uint64
	weighted atomic.Uint64 // DeviceAwareWeighted's round-robin start (mode.go)
}

// Choose scores the candidates (every mode fills the scores, so callers can show them) and returns
// the position of the one p.Mode picks. Direct mode expects the caller to pass only the named
// worker. rng may be nil.
func (ch *Chooser) Choose(c []Candidate, p *Params, rng *rand.Rand) (int, error) {
	if len(c) == 0 {
		return 0, ErrNoWorkers
	}
	if err := p.Check(); err != nil {
		return 0, err
	}
	Score(c, p)
	switch p.Mode {
	case RoundRobin:
		return int((ch.next.Add(1) - 1) % uint64(len(c))), nil
	case Random:
		return intn(rng, len(c)), nil
	case LeastLoaded:
		return leastLoaded(c, rng), nil
	case Direct:
		return 0, nil
	case PowerOfTwo:
		return powerOfTwo(c, rng), nil
	case DeviceAwareWeighted:
		return ch.deviceAware(c), nil
	case KV, Default:
		return Select(c, p.Temperature, rng), nil
	}
	return 0, ErrMode
}

// leastLoaded picks the fewest active requests, ties at random.
func leastLoaded(c []Candidate, rng *rand.Rand) int {
	lo, n := int64(math.MaxInt64), 0
	for i := range c {
		switch l := c[i].ActiveRequests; {
		case l < lo:
			lo, n = l, 1
		case l == lo:
			n++
		}
	}
	k := intn(rng, n)
	for i := range c {
		if c[i].ActiveRequests == lo {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return 0
}

func intn(rng *rand.Rand, n int) int {
	if rng == nil {
		return rand.IntN(n)
	}
	return rng.IntN(n)
}

func float64frac(rng *rand.Rand) float64 {
	if rng == nil {
		return rand.Float64()
	}
	return rng.Float64()
}
