package daemon

import (
	"testing"

	"github.com/kvrouterd/kvrouterd/scoring"
)

// TestConfigCost: --router-cost auto is kvrouterd's own cost unless a preset or one of
// Dynamo's weights says otherwise; the presets set Dynamo main's terms.
func TestConfigCost(t *testing.T) {
	for _, c := range []struct {
		name  string
		set   func(*Config)
		cost  scoring.CostModel
		terms scoring.Terms
	}{
		{"defaults", func(*Config) {}, scoring.CostTTFT, scoring.DefaultTerms()},
		{"a weight", func(c *Config) { c.OverlapScoreWeight = 2 }, scoring.CostV1, scoring.Terms{Credit: 1, LoadScale: 2}},
		{"a credit", func(c *Config) { c.OverlapScoreCredit = 0.5 }, scoring.CostMain, scoring.Terms{Credit: 0.5, LoadScale: 1}},
		{"a request weight", func(c *Config) { c.DecodeActiveRequestWeight = 8 }, scoring.CostMain, scoring.Terms{Credit: 1, LoadScale: 1, RequestWeight: 8}},
		{"v1 named", func(c *Config) { c.RouterCost = "v1" }, scoring.CostV1, scoring.DefaultTerms()},
		{"ttft named over a weight", func(c *Config) { c.RouterCost, c.OverlapScoreWeight = "ttft", 3 }, scoring.CostTTFT, scoring.Terms{Credit: 1, LoadScale: 3}},
		{"agentic", func(c *Config) { c.Agentic, c.PrefillLoadScale = true, 9 }, scoring.CostMain, scoring.Terms{Credit: 2, LoadScale: 4, RequestWeight: 64}},
		{"load-aware", func(c *Config) { c.LoadAware, c.DecodeActiveRequestWeight = true, 2 }, scoring.CostMain, scoring.Terms{Credit: 0, LoadScale: 1, RequestWeight: 2}},
	} {
		cfg := Defaults()
		c.set(&cfg)
		if err := cfg.Check(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := cfg.cost(); got != c.cost {
			t.Errorf("%s: cost %v, want %v", c.name, got, c.cost)
		}
		if got := cfg.terms(); got != c.terms {
			t.Errorf("%s: terms %+v, want %+v", c.name, got, c.terms)
		}
	}
}
