package sim

import (
	"math"
	"time"
)

// Timing is a worker's step-time model: polynomials in the step's prefill tokens and in the
// KV-cache usage. It is a plain value, safe to copy and share. The zero value is not a valid
// model (every step would take no time); use DefaultTiming.
type Timing struct {
	// Prefill ms = P2·T² + P1·T + P0, T = prompt tokens computed in the step; no prefill term
	// when T is 0, and never negative.
	P2, P1, P0 float64
	// Decode ms = max(DecodeFloor, D2·u² + D1·u + D0), u = fraction of KV capacity held by
	// running sequences.
	D2, D1, D0, DecodeFloor float64
}

// DefaultTiming returns the polynomial step-time model of Dynamo's mocker (its baseline,
// fitted on one GPU): prefill 4.209989e-7·T² + 1.518344e-2·T + 16.50142 ms, decode
// −25.74·u² + 54.01·u + 5.74 ms with a floor of 1 ms.
func DefaultTiming() Timing {
	return Timing{
		P2: 4.209989e-7, P1: 1.518344e-2, P0: 16.50142,
		D2: -25.74, D1: 54.01, D0: 5.74, DecodeFloor: 1,
	}
}

// PrefillMs returns the prefill part of a step computing tokens prompt tokens, in ms: 0 when
// tokens ≤ 0.
func (t Timing) PrefillMs(tokens int) float64 {
	if tokens <= 0 {
		return 0
	}
	x := float64(tokens)
	return max(0, t.P2*x*x+t.P1*x+t.P0)
}

// DecodeMs returns the decode part of a step at KV usage u (0…1), in ms.
func (t Timing) DecodeMs(u float64) float64 {
	return max(t.DecodeFloor, t.D2*u*u+t.D1*u+t.D0)
}

// StepTime returns the duration of one step that computes prefillTokens prompt tokens at KV
// usage u, with decoding set when the step emits at least one token. As in Dynamo's mocker
// (the vLLM scheduler's pass ends at now + prefill time + decode time), the two parts add up:
// a pure prefill step (chunks that finish no prompt, no decoding sequence) costs the prefill
// part only, a pure decode step the decode part only, and a step that does both — including
// a step whose last prefill chunk yields the request's first token — costs the sum. The sum
// is rounded to the nearest nanosecond.
func (t Timing) StepTime(prefillTokens int, u float64, decoding bool) time.Duration {
	ms := t.PrefillMs(prefillTokens)
	if decoding {
		ms += t.DecodeMs(u)
	}
	return time.Duration(math.Round(ms * 1e6))
}

// Slowed returns t with every step taking factor times as long (a worker at 1/factor of the
// speed t models); factor ≤ 0 or 1 returns t.
func (t Timing) Slowed(factor float64) Timing {
	if factor <= 0 || factor == 1 {
		return t
	}
	t.P2, t.P1, t.P0 = t.P2*factor, t.P1*factor, t.P0*factor
	t.D2, t.D1, t.D0, t.DecodeFloor = t.D2*factor, t.D1*factor, t.D0*factor, t.DecodeFloor*factor
	return t
}
