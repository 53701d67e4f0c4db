package scoring

import (
	"errors"
	"math"
)

// StepModel is what CostTTFT knows of a model's workers: the time of one engine step as a
// function of its batch, the step's token budget and the KV capacity. A step that computes T
// prompt tokens and decodes at KV usage u lasts prefill(T) + decode(u) (both parts when it does
// both: the timing model of Dynamo's mocker, reference.md §5). It is the prior CostTTFT starts
// from; a plain value.
type StepModel struct {
	// Prefill ms = P2·T² + P1·T + P0 for T > 0 prompt tokens in a step.
	P2, P1, P0 float64
	// Decode ms = max(Floor, D2·u² + D1·u + D0) at KV usage u (0…1).
	D2, D1, D0, Floor float64
	// MaxBatched is a step's token budget (vLLM's max_num_batched_tokens); Capacity a
	// worker's KV cache in blocks (0: unknown, the decode part then taken at an empty cache).
	MaxBatched int64
	Capacity   int64
	// HostMsPerToken is the time to load one token's KV from the host tier onto the device.
	HostMsPerToken float64
	// RequestMs is a request's mean lifetime on a worker, booking to completion (the router
	// sets it from Tracker.MeanLifetime; 0: unknown, no wait for KV capacity predicted).
	RequestMs float64
}

// DefaultStepModel returns the step times of Dynamo's mocker, fitted on one GPU (an 8B model
// on an H100): prefill 4.209989e-7·T² + 1.518344e-2·T + 16.50142 ms, decode −25.74·u² +
// 54.01·u + 5.74 ms (at least 1), with its defaults of 8,192 batched tokens and 16,384 blocks;
// and a host-tier load of 128 KiB of KV per token at 14 GB/s (9.4 µs per token), the onboard
// rate Dynamo's mocker gives KVBM.
func DefaultStepModel() StepModel {
	return StepModel{
		P2: 4.209989e-7, P1: 1.518344e-2, P0: 16.50142,
		D2: -25.74, D1: 54.01, D0: 5.74, Floor: 1,
		MaxBatched: 8192, Capacity: 16384,
		HostMsPerToken: 131072 / 14e9 * 1e3,
	}
}

// ErrStepModel reports a step model CostTTFT cannot predict with.
var ErrStepModel = errors.New("scoring: step model: coefficients must be finite, max batched tokens > 0 and capacity ≥ 0")

// Check reports whether m can predict: finite coefficients, a positive token budget.
func (m *StepModel) Check() error {
	for _, v := range [...]float64{m.P2, m.P1, m.P0, m.D2, m.D1, m.D0, m.Floor, m.HostMsPerToken} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return ErrStepModel
		}
	}
	if m.MaxBatched <= 0 || m.Capacity < 0 || m.HostMsPerToken < 0 {
		return ErrStepModel
	}
	return nil
}

// PrefillMs is the prefill part of a step computing t prompt tokens (0 for none), in ms.
func (m *StepModel) PrefillMs(t float64) float64 {
	if t <= 0 {
		return 0
	}
	return max(0, (m.P2*t+m.P1)*t+m.P0)
}

// DecodeMs is the decode part of a step at KV usage u, in ms.
func (m *StepModel) DecodeMs(u float64) float64 {
	return max(m.Floor, (m.D2*u+m.D1)*u+m.D0)
}

// TTFT predicts, in ms, the time to first token of a request whose own prompt leaves own
// tokens to compute, on a worker with ahead prompt tokens queued before it, requests active
// and blocks held with the request's added. When those blocks exceed the KV capacity, the
// request waits for active ones to finish: RequestMs × the excess over the capacity. The prompt-side work, ahead and own, is cut into
// steps of the budget the decoding requests leave (at least half of MaxBatched); each step
// pays its prefill part and, while anything decodes, the decode part at the worker's KV usage.
// The last step, which yields the first token, always pays it.
func (m *StepModel) TTFT(own, ahead, requests, blocks int64) float64 {
	work := float64(max(ahead, 0) + max(own, 1))
	budget := float64(max(m.MaxBatched-requests, m.MaxBatched/2, 1))
	steps := math.Ceil(work / budget)
	full := steps - 1
	ms := full*m.PrefillMs(budget) + m.PrefillMs(work-full*budget)
	u := 0.0
	if m.Capacity > 0 {
		u = min(1, float64(max(blocks, 0))/float64(m.Capacity))
	}
	if m.Capacity > 0 && blocks > m.Capacity && m.RequestMs > 0 {
		// The KV cache cannot hold the request with the ones active: it waits for enough of
		// them to finish, which they do over their lifetime.
		ms += m.RequestMs * float64(blocks-m.Capacity) / float64(m.Capacity)
	}
	if requests > 0 {
		// A request arrives during a step, on average halfway through it; it waits for the
		// step's end.
		return ms + (steps+0.5)*m.DecodeMs(u)
	}
	return ms + m.DecodeMs(u)
}

// Decayed returns active prompt tokens booked on a worker less what it has computed of them
// since since (ns, the clock of now): the worker is taken to have prefilled at the rate of its
// steps from the moment its oldest prefill not yet done started, each step computing the budget
// its requests active leave and decoding at the usage of blocks (TTFT's steps), and taking slow
// times the model's time (its learned slowness; 0 counts as 1). Dynamo main's
// prefill load model decays a worker's oldest prefill by elapsed time the same way.
func (m *StepModel) Decayed(active, since, now, requests, blocks int64, slow float64) int64 {
	if active <= 0 || since <= 0 || now <= since {
		return active
	}
	budget := float64(max(m.MaxBatched-requests, m.MaxBatched/2, 1))
	u := 0.0
	if m.Capacity > 0 {
		u = min(1, float64(max(blocks, 0))/float64(m.Capacity))
	}
	step := m.PrefillMs(budget)
	if requests > 0 {
		step += m.DecodeMs(u)
	}
	if slow > 0 {
		step *= slow
	}
	return max(active-int64(float64(now-since)/1e6*budget/step), 0)
}

// DefaultCacheWeight is CostTTFT's cache weight: how many times more a computed prompt token
// costs the fleet than its own prefill time. See Params.CacheWeight and docs/decisions.md.
const DefaultCacheWeight = 1

// ttftOwn is the prompt tokens a worker with cached blocks, shared active ones (booked by
// requests ahead of this one, computed before it), and lower-tier credit lower (blocks, loaded
// rather than computed) leaves this request to compute.
func (p *Params) ttftOwn(cached, shared int32, lower float64) float64 {
	if !p.TrackPrefill {
		return 0
	}
	have := max(float64(cached)+lower, float64(shared))
	return max(float64(p.ISL)-have*float64(p.BlockSize), 0)
}

// ttftLogit is CostTTFT's logit: the predicted time to first token plus (CacheWeight +
// Backlog) × the prefill time of the tokens computed, in ms.
func (p *Params) ttftLogit(cached, shared int32, ext TierExt, decode, activePrefill, activeRequests int64) float64 {
	return p.ttftLogitSlow(cached, shared, ext, decode, activePrefill, activeRequests, 1)
}

// ttftLogitSlow is ttftLogit on a worker whose steps take slow times the model's: its
// predicted time is, its prices of the fleet's cache and queue are not.
func (p *Params) ttftLogitSlow(cached, shared int32, ext TierExt, decode, activePrefill, activeRequests int64, slow float64) float64 {
	ttft, price := p.ttftParts(cached, shared, ext, decode, activePrefill, activeRequests, slow)
	return ttft + price
}

// ttftParts are CostTTFT's logit's two parts: the predicted time to first token (slow times
// the model's, if slow > 0) and the price of the prompt tokens computed, (CacheWeight +
// Backlog) × their prefill time.
func (p *Params) ttftParts(cached, shared int32, ext TierExt, decode, activePrefill, activeRequests int64, slow float64) (ttft, price float64) {
	host := float64(ext.Host)
	if p.Tiers.Host == 0 {
		host = 0 // the host tier indexed, not credited: its blocks are computed
	}
	lower := host + p.Tiers.Disk*float64(ext.Disk+ext.External)
	own := p.ttftOwn(cached, shared, lower)
	ttft = p.Step.TTFT(int64(own), activePrefill, activeRequests, decode) + host*float64(p.BlockSize)*p.Step.HostMsPerToken
	if slow > 0 {
		ttft *= slow
	}
	price = (p.CacheWeight + p.Backlog) * p.Step.PrefillMs(max(own, 1))
	if m := &p.Step; m.Capacity > 0 && m.RequestMs > 0 && decode > m.Capacity && p.Backlog > 0 {
		// Over the KV capacity, the blocks this request adds hold back the requests that
		// will queue behind it for their share of a lifetime, about Backlog of them.
		added := math.Ceil(own / float64(max(p.BlockSize, 1)))
		price += p.Backlog * m.RequestMs * min(added, float64(decode-m.Capacity)) / float64(m.Capacity)
	}
	return ttft, price
}

// TTFTParts returns candidate c's CostTTFT logit in its two parts (their sum): the predicted
// time to first token, its slowness counted, and the price of the prompt tokens it computes.
func (p *Params) TTFTParts(c *Candidate) (ttft, price float64) {
	_, decode, _ := p.CostV1(c.Cached, c.Shared, c.ActiveBlocks, c.ActivePrefill)
	return p.ttftParts(c.Cached, c.Shared, c.Ext, decode, c.ActivePrefill, c.ActiveRequests, c.Slow)
}

// CostAt is Cost, or CostExt, for candidate c, its slowness (Candidate.Slow) counted under
// CostTTFT.
func (p *Params) CostAt(c *Candidate) (prefill, decode int64, logit float64) {
	if p.Formula == CostTTFT && c.Slow > 0 && c.Slow != 1 {
		prefill, decode, _ = p.CostV1(c.Cached, c.Shared, c.ActiveBlocks, c.ActivePrefill)
		return prefill, decode, p.ttftLogitSlow(c.Cached, c.Shared, c.Ext, decode, c.ActivePrefill, c.ActiveRequests, c.Slow)
	}
	if c.Ext == (TierExt{}) {
		return p.Cost(c.Cached, c.Shared, c.ActiveBlocks, c.ActivePrefill, c.ActiveRequests)
	}
	return p.CostExt(c.Cached, c.Ext, c.Shared, c.ActiveBlocks, c.ActivePrefill, c.ActiveRequests)
}

// Backlog is the fleet's prompt-side queue: the requests waiting for their first token
// (Candidate.Pending) per candidate. A request's computed tokens delay the requests that will
// queue behind them at its worker; under load, about this many. CostTTFT weighs the prefill
// time of a request's computed tokens by CacheWeight + Backlog.
func Backlog(c []Candidate) float64 {
	var sum int64
	for i := range c {
		sum += max(c[i].Pending, 0)
	}
	return BacklogOf(sum, len(c))
}

// BacklogOf is Backlog from the candidates' summed pending requests and their count.
func BacklogOf(sum int64, n int) float64 {
	if n <= 0 {
		return 0
	}
	return float64(sum) / float64(n)
}

// PredictTTFT is the time to first token, in ms, CostTTFT predicts for the request on a worker
// with these inputs (Cost's, and its lower-tier extension): its logit without the cache weight.
// Any formula may ask; Step must be set.
func (p *Params) PredictTTFT(cached, shared int32, ext TierExt, activeBlocks, activePrefill, activeRequests int64) float64 {
	q := *p
	q.CacheWeight, q.Backlog = 0, 0
	_, decode, _ := p.CostV1(cached, shared, activeBlocks, activePrefill)
	return q.ttftLogit(cached, shared, ext, decode, activePrefill, activeRequests)
}
