package router

import (
	"errors"
	"fmt"
	"math"
)

// Worker roles and disaggregated prefill/decode.
//
// A worker registers with a role: it prefills and decodes (RoleBoth, every worker before roles
// existed), only prefills (RolePrefill: it takes a disaggregated request's prompt, generates one
// token and hands the KV blocks over) or only decodes (RoleDecode: it takes requests whose KV
// blocks come from a prefill worker, and aggregated requests). The pools, as Dynamo keeps them
// apart by component:
//
//   - a disaggregated request's prefill stage goes to a RolePrefill worker, chosen by KV cost
//     (its cached prefix, the prefill load), its prompt tokens booked;
//   - its decode stage goes to a RoleDecode or RoleBoth worker, chosen by load alone (overlap
//     weight 0, no own-prefill charge, its blocks booked under random hashes): Dynamo's plain
//     decode routing;
//   - an aggregated request (one that does not ask for a disaggregated decision, one whose
//     model has no prefill worker, or one that conditional disaggregation keeps whole) goes to a
//     RoleDecode or RoleBoth worker, by the router's full cost: Dynamo routes a request to the
//     decode workers whenever its prefill router is not active. A RolePrefill worker never
//     serves an aggregated request: it would stop after one token.

// Role is a worker's part in serving a model; a plain value.
type Role uint8

const (
	// RoleBoth prefills and decodes: an aggregated worker (the zero value).
	RoleBoth Role = iota
	// RolePrefill only prefills: it serves the prefill stage of disaggregated requests.
	RolePrefill
	// RoleDecode only decodes: the decode stage of disaggregated requests, and aggregated
	// requests.
	RoleDecode
)

// String returns the role's API name.
func (r Role) String() string {
	switch r {
	case RoleBoth:
		return "both"
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// valid reports whether r is one of the three roles.
func (r Role) valid() bool { return r <= RoleDecode }

// decodes reports whether a worker of role r may serve decode stages and aggregated requests.
func (r Role) decodes() bool { return r != RolePrefill }

// ParseRole parses a role's API name: "prefill", "decode", or "both" (also "" and Dynamo's
// "aggregated"). Anything else is an ErrInvalid naming field "role".
func ParseRole(s string) (Role, error) {
	switch s {
	case "", "both", "aggregated":
		return RoleBoth, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	}
	return RoleBoth, fieldErr(ErrInvalid, "role", "%q: want prefill, decode or both", s)
}

// DisaggPolicy is the conditional disaggregation policy: which disaggregated requests skip the
// prefill stage and are served whole by a decode worker (Dynamo's conditional_disagg_policy); a
// plain value.
type DisaggPolicy uint8

const (
	// DisaggNone splits every disaggregated request while its model has a prefill worker.
	DisaggNone DisaggPolicy = iota
	// DisaggISLBounding keeps a request whole when its effective input length, the prompt
	// tokens not cached on the decode worker the router would pick, is both below
	// EffISLThreshold tokens and below EffISLRatioThreshold of the prompt (Dynamo's
	// isl_bounding: short and mostly cached).
	DisaggISLBounding
	// DisaggPrefillLoad keeps a request whole when the prefill worker the router would pick
	// is busy: its active prefill tokens above PrefillBusyThreshold × its max batched tokens
	// (Dynamo's prefill_load).
	DisaggPrefillLoad
	// DisaggISLOrLoad keeps a request whole when either of the two above would (Dynamo's
	// isl_or_load).
	DisaggISLOrLoad
)

// String returns the policy's name, Dynamo's ("none" for DisaggNone).
func (p DisaggPolicy) String() string {
	switch p {
	case DisaggNone:
		return "none"
	case DisaggISLBounding:
		return "isl_bounding"
	case DisaggPrefillLoad:
		return "prefill_load"
	case DisaggISLOrLoad:
		return "isl_or_load"
	}
	return fmt.Sprintf("DisaggPolicy(%d)", uint8(p))
}

// ParseDisaggPolicy parses a policy's name: none (or ""), isl_bounding, prefill_load,
// isl_or_load.
func ParseDisaggPolicy(s string) (DisaggPolicy, error) {
	switch s {
	case "", "none":
		return DisaggNone, nil
	case "isl_bounding":
		return DisaggISLBounding, nil
	case "prefill_load":
		return DisaggPrefillLoad, nil
	case "isl_or_load":
		return DisaggISLOrLoad, nil
	}
	return DisaggNone, fmt.Errorf("conditional disaggregation policy %q: want none, isl_bounding, prefill_load or isl_or_load", s)
}

// Dynamo's conditional disaggregation defaults (lib/kv-router conditional_disagg.rs).
const (
	// DefaultEffISLThreshold is isl_bounding's effective input length bound, in tokens: a
	// request keeps its prefill stage from this many uncached tokens on.
	DefaultEffISLThreshold = 2048
	// DefaultEffISLRatioThreshold is isl_bounding's bound on uncached tokens / prompt tokens:
	// a request keeps its prefill stage from this fraction on.
	DefaultEffISLRatioThreshold = 0.7
)

// DisaggConfig configures disaggregated routing (Config.Disagg); a plain value. nil means: a
// disaggregated request is split whenever its model has a prefill worker, with no conditional
// policy, and served whole when it has none.
type DisaggConfig struct {
	// Policy decides per request whether a disaggregated request skips its prefill stage
	// (conditional disaggregation, Dynamo's --router-conditional-disagg).
	Policy DisaggPolicy
	// EffISLThreshold (tokens) and EffISLRatioThreshold (a fraction) bound isl_bounding (and
	// isl_or_load); 0 takes Dynamo's defaults, 2,048 and 0.7.
	EffISLThreshold      int
	EffISLRatioThreshold float64
	// PrefillBusyThreshold is prefill_load's (and isl_or_load's) line, a fraction of the
	// chosen prefill worker's max batched tokens; Dynamo's prefill_busy_threshold, which
	// defaults to --router-queue-threshold. prefill_load needs it set.
	PrefillBusyThreshold    float64
	HasPrefillBusyThreshold bool
	// DecodeBusyThreshold, if set, gates every bypass: a request is kept whole only if the
	// decode worker chosen for it stays at or below this fraction of its KV capacity with
	// the request's blocks counted (never while its capacity is unknown); Dynamo's
	// decode_busy_threshold.
	DecodeBusyThreshold    float64
	HasDecodeBusyThreshold bool
	// Enforce refuses a disaggregated request whose model has no prefill worker (with
	// ErrNoPrefill) instead of serving it whole: Dynamo's --enforce-disagg.
	Enforce bool
}

// ErrNoPrefill refuses a disaggregated request, under DisaggConfig.Enforce, whose model has no
// prefill worker. The HTTP API answers 503.
var ErrNoPrefill = errors.New("router: no prefill worker")

// withDefaults returns c with Dynamo's defaults in place of its zero thresholds.
func (c DisaggConfig) withDefaults() DisaggConfig {
	if c.EffISLThreshold == 0 {
		c.EffISLThreshold = DefaultEffISLThreshold
	}
	if c.EffISLRatioThreshold == 0 {
		c.EffISLRatioThreshold = DefaultEffISLRatioThreshold
	}
	return c
}

// Check says what is wrong with c, naming Dynamo's field.
func (c DisaggConfig) Check() error {
	switch {
	case c.Policy > DisaggISLOrLoad:
		return fmt.Errorf("conditional disaggregation: unknown policy %d", c.Policy)
	case c.EffISLThreshold < 0:
		return fmt.Errorf("conditional disaggregation: eff_isl_threshold %d is negative", c.EffISLThreshold)
	case !(c.EffISLRatioThreshold >= 0) || math.IsInf(c.EffISLRatioThreshold, 1):
		return fmt.Errorf("conditional disaggregation: eff_isl_ratio_threshold %v is not a finite number ≥ 0", c.EffISLRatioThreshold)
	case c.HasPrefillBusyThreshold && (!(c.PrefillBusyThreshold >= 0) || math.IsInf(c.PrefillBusyThreshold, 1)):
		return fmt.Errorf("conditional disaggregation: prefill_busy_threshold %v is not a finite number ≥ 0", c.PrefillBusyThreshold)
	case c.HasDecodeBusyThreshold && (!(c.DecodeBusyThreshold >= 0) || math.IsInf(c.DecodeBusyThreshold, 1)):
		return fmt.Errorf("conditional disaggregation: decode_busy_threshold %v is not a finite number ≥ 0", c.DecodeBusyThreshold)
	case (c.Policy == DisaggPrefillLoad || c.Policy == DisaggISLOrLoad) && !c.HasPrefillBusyThreshold:
		return fmt.Errorf("conditional disaggregation: policy %s needs prefill_busy_threshold (or --router-queue-threshold)", c.Policy)
	}
	return nil
}

// getRole returns the worker's role.
func (reg *registration) getRole() Role { return Role(reg.role.Load()) }
