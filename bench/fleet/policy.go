package fleet

import "github.com/kvrouterd/kvrouterd/scoring"

// Policy is one of kvrouterd's cost configurations for the kv mode, by the name the simulator
// and the report give it: kv, the daemon's default, and Dynamo's formulas and presets, so that
// each can be compared with the others and with the peers. A plain value.
type Policy struct {
	Name          string
	Cost          scoring.CostModel
	Terms         scoring.Terms // CostMain's
	Weight        float64       // CostV1's overlap score weight
	NoAssumeReuse bool          // Dynamo's router_assume_kv_reuse=false
}

// Policies lists them, kv first:
//   - kv: kvrouterd's default, --router-cost ttft (the daemon's Defaults; a test holds them
//     equal);
//   - dynamo_v1: Dynamo's v1 releases, overlap weight 1;
//   - dynamo_main: Dynamo main's formula with its default terms;
//   - dynamo_agentic: Dynamo main's --agentic preset (credit 2, prefill load scale 4, 64 blocks
//     per active request);
//   - dynamo_load_aware: Dynamo's --load-aware preset (no overlap credit, bookings without
//     assumed reuse).
var Policies = []Policy{
	{Name: "kv", Cost: scoring.CostTTFT, Terms: scoring.DefaultTerms(), Weight: 1},
	{Name: "dynamo_v1", Cost: scoring.CostV1, Terms: scoring.DefaultTerms(), Weight: 1},
	{Name: "dynamo_main", Cost: scoring.CostMain, Terms: scoring.DefaultTerms(), Weight: 1},
	{Name: "dynamo_agentic", Cost: scoring.CostMain, Terms: scoring.Terms{Credit: 2, LoadScale: 4, RequestWeight: 64}, Weight: 1},
	{Name: "dynamo_load_aware", Cost: scoring.CostMain, Terms: scoring.Terms{Credit: 0, LoadScale: 1}, Weight: 1, NoAssumeReuse: true},
}

// ParsePolicy returns the policy named name.
func ParsePolicy(name string) (Policy, bool) {
	for _, p := range Policies {
		if p.Name == name {
			return p, true
		}
	}
	return Policy{}, false
}

// Apply sets c to route by p: mode kv with p's cost settings.
func (p Policy) Apply(c *Config) {
	t := p.Terms
	c.Mode, c.Cost, c.Terms, c.OverlapWeight, c.NoAssumeReuse = scoring.KV, p.Cost, &t, p.Weight, p.NoAssumeReuse
}
