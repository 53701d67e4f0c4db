package router

import (
	"strconv"

	"github.com/kvrouterd/kvrouterd/scoring"
)

// formatDecision writes one candidate's cost the way Dynamo logs it:
// "worker 1: logit 125.3 = 1.0 × 100.5 + 25.0 (cached blocks 15)".
func formatDecision(c *scoring.Candidate, p *scoring.Params) string {
	b := make([]byte, 0, 96)
	b = append(b, "worker "...)
	b = strconv.AppendUint(b, c.Worker, 10)
	if c.Rank != 0 {
		b = append(b, '/')
		b = strconv.AppendUint(b, uint64(c.Rank), 10)
	}
	b = append(b, ": logit "...)
	b = strconv.AppendFloat(b, c.Logit, 'f', 3, 64)
	if p.Formula == scoring.CostTTFT {
		// "worker 2: logit 71.813 = predicted TTFT 22.3 ms (queued 0 + own 1 tokens) + cache
		// 3.0 × 16.5 ms + backlog 0.0 × 16.5 ms (cached blocks 2)" (TestDaemonOverTCP's)
		ttft, price := p.TTFTParts(c)
		computed := 0.0 // the prefill time of the tokens computed, which the price weighs
		if w := p.CacheWeight + p.Backlog; w > 0 {
			computed = price / w
		}
		b = append(b, " = predicted TTFT "...)
		b = strconv.AppendFloat(b, ttft, 'f', 1, 64)
		b = append(b, " ms (queued "...)
		b = strconv.AppendInt(b, c.ActivePrefill, 10)
		b = append(b, " + own "...)
		b = strconv.AppendInt(b, max(c.PrefillTokens-c.ActivePrefill, 0), 10)
		b = append(b, " tokens) + cache "...)
		b = strconv.AppendFloat(b, p.CacheWeight, 'f', 1, 64)
		b = append(b, " × "...)
		b = strconv.AppendFloat(b, computed, 'f', 1, 64)
		b = append(b, " ms + backlog "...)
		b = strconv.AppendFloat(b, p.Backlog, 'f', 1, 64)
		b = append(b, " × "...)
		b = strconv.AppendFloat(b, computed, 'f', 1, 64)
		b = append(b, " ms (cached blocks "...)
		b = strconv.AppendInt(b, int64(c.Cached), 10)
		b = append(b, ')')
		return string(b)
	}
	if p.Formula == scoring.CostMain {
		// Dynamo main's terms: prefill_load_scale × adjusted prefill blocks + decode blocks +
		// decode_active_request_weight × active requests.
		b = append(b, " = "...)
		b = strconv.AppendFloat(b, p.LoadScale, 'f', 1, 64)
		b = append(b, " × prefill (credit "...)
		b = strconv.AppendFloat(b, p.Credit, 'f', 2, 64)
		b = append(b, ") + "...)
		b = strconv.AppendFloat(b, float64(c.DecodeBlocks), 'f', 1, 64)
		b = append(b, " + "...)
		b = strconv.AppendFloat(b, p.RequestWeight, 'f', 1, 64)
		b = append(b, " × "...)
		b = strconv.AppendInt(b, c.ActiveRequests, 10)
		b = append(b, " requests (cached blocks "...)
		b = strconv.AppendInt(b, int64(c.Cached), 10)
		b = append(b, ')')
		return string(b)
	}
	b = append(b, " = "...)
	b = strconv.AppendFloat(b, p.Weight, 'f', 1, 64)
	b = append(b, " × "...)
	b = strconv.AppendFloat(b, float64(c.PrefillTokens)/float64(p.BlockSize), 'f', 3, 64)
	b = append(b, " + "...)
	b = strconv.AppendFloat(b, float64(c.DecodeBlocks), 'f', 1, 64)
	b = append(b, " (cached blocks "...)
	b = strconv.AppendInt(b, int64(c.Cached), 10)
	b = append(b, ')')
	return string(b)
}
