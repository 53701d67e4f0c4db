package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/kvrouterd/kvrouterd/router"
)

// disaggJSON is --router-conditional-disagg-config, Dynamo's object; a field given replaces the
// single flag's value.
type disaggJSON struct {
	Policy               *string  `json:"policy"`
	EffISLThreshold      *int     `json:"eff_isl_threshold"`
	EffISLRatioThreshold *float64 `json:"eff_isl_ratio_threshold"`
	PrefillBusyThreshold *float64 `json:"prefill_busy_threshold"`
	DecodeBusyThreshold  *float64 `json:"decode_busy_threshold"`
}

// disagg is the router's disaggregation configuration: --enforce-disagg, and conditional
// disaggregation as its flags and JSON config say, resolved as Dynamo resolves them (a
// load-aware policy's prefill busy threshold defaults to --router-queue-threshold). Check
// reports its error.
func (c *Config) disagg() (*router.DisaggConfig, error) {
	d := &router.DisaggConfig{Enforce: c.EnforceDisagg}
	if c.ConditionalDisaggConfig != "" && !c.ConditionalDisagg {
		return nil, fmt.Errorf("--router-conditional-disagg-config requires --router-conditional-disagg")
	}
	if !c.ConditionalDisagg {
		return d, nil
	}
	policy := c.ConditionalDisaggPolicy
	prefill, decode := c.ConditionalDisaggPrefillThreshold, c.ConditionalDisaggDecodeThreshold
	if c.ConditionalDisaggConfig != "" {
		var j disaggJSON
		dec := json.NewDecoder(bytes.NewReader([]byte(c.ConditionalDisaggConfig)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&j); err != nil {
			return nil, fmt.Errorf("--router-conditional-disagg-config: %v (want a JSON object of policy, eff_isl_threshold, eff_isl_ratio_threshold, prefill_busy_threshold, decode_busy_threshold)", err)
		}
		if j.Policy != nil {
			policy = *j.Policy
		}
		if j.EffISLThreshold != nil {
			if *j.EffISLThreshold <= 0 {
				return nil, fmt.Errorf("--router-conditional-disagg-config: eff_isl_threshold %d: want a positive token count", *j.EffISLThreshold)
			}
			d.EffISLThreshold = *j.EffISLThreshold
		}
		if j.EffISLRatioThreshold != nil {
			if !(*j.EffISLRatioThreshold > 0) || math.IsInf(*j.EffISLRatioThreshold, 1) {
				return nil, fmt.Errorf("--router-conditional-disagg-config: eff_isl_ratio_threshold %v: want a finite number > 0", *j.EffISLRatioThreshold)
			}
			d.EffISLRatioThreshold = *j.EffISLRatioThreshold
		}
		if j.PrefillBusyThreshold != nil {
			prefill = OptFloat{V: *j.PrefillBusyThreshold, On: true}
		}
		if j.DecodeBusyThreshold != nil {
			decode = OptFloat{V: *j.DecodeBusyThreshold, On: true}
		}
	}
	p, err := router.ParseDisaggPolicy(policy)
	if err != nil || p == router.DisaggNone {
		return nil, fmt.Errorf("--router-conditional-disagg-policy %q: want isl_bounding, prefill_load or isl_or_load", policy)
	}
	d.Policy = p
	if !prefill.On && c.RouterQueueThreshold.On && (p == router.DisaggPrefillLoad || p == router.DisaggISLOrLoad) {
		prefill = c.RouterQueueThreshold // Dynamo's default for the load-aware policies
	}
	d.PrefillBusyThreshold, d.HasPrefillBusyThreshold = prefill.V, prefill.On
	d.DecodeBusyThreshold, d.HasDecodeBusyThreshold = decode.V, decode.On
	if err := d.Check(); err != nil {
		return nil, fmt.Errorf("--router-conditional-disagg: %w", err)
	}
	return d, nil
}
