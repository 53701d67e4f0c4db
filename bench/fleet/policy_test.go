package fleet

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/daemon"
	"github.com/kvrouterd/kvrouterd/scoring"
)

// TestPolicyKVIsTheDaemonsDefault: the simulator's kv routes as the daemon does with no flag
// given, whatever that becomes.
func TestPolicyKVIsTheDaemonsDefault(t *testing.T) {
	c := daemon.Defaults()
	cost, terms := c.CostModel()
	kv, ok := ParsePolicy("kv")
	if !ok || kv.Cost != cost || kv.Terms != terms || kv.Weight != c.OverlapScoreWeight || kv.NoAssumeReuse != c.NoAssumeKVReuse {
		t.Fatalf("kv %+v; the daemon's defaults: %v %+v weight %v no reuse %v", kv, cost, terms, c.OverlapScoreWeight, c.NoAssumeKVReuse)
	}
	if c.CacheWeight != scoring.DefaultCacheWeight || !c.TrackPrefillTokens || c.RouterTemperature != 0 || c.RouterMode != "kv" {
		t.Fatalf("the daemon's defaults differ from the router's the simulator builds: %+v", c)
	}
	for _, name := range []string{"dynamo_v1", "dynamo_main", "dynamo_agentic", "dynamo_load_aware"} {
		p, ok := ParsePolicy(name)
		if !ok {
			t.Fatalf("%s: no such policy", name)
		}
		var fc Config
		p.Apply(&fc)
		if fc.Mode != scoring.KV || fc.Cost != p.Cost || *fc.Terms != p.Terms {
			t.Fatalf("%s applied: %+v", name, fc)
		}
	}
	// The presets as the daemon's flags set them.
	for _, c := range []struct {
		name string
		set  func(*daemon.Config)
	}{{"dynamo_agentic", func(c *daemon.Config) { c.Agentic = true }}, {"dynamo_load_aware", func(c *daemon.Config) { c.LoadAware = true }},
		{"dynamo_v1", func(c *daemon.Config) { c.RouterCost = "v1" }}, {"dynamo_main", func(c *daemon.Config) { c.RouterCost = "main" }}} {
		d := daemon.Defaults()
		c.set(&d)
		cost, terms := d.CostModel()
		p, _ := ParsePolicy(c.name)
		if p.Cost != cost || p.Terms != terms || p.NoAssumeReuse != (d.NoAssumeKVReuse || d.LoadAware) {
			t.Errorf("%s: policy %+v; the daemon's flags: %v %+v", c.name, p, cost, terms)
		}
	}
}
