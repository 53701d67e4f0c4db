package daemon

import (
	"flag"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/router"
)

func disaggFlags(t *testing.T, args ...string) (*router.DisaggConfig, error) {
	t.Helper()
	c := Defaults()
	fs := flag.NewFlagSet("kvrouterd", flag.ContinueOnError)
	c.Flags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(); err != nil {
		return nil, err
	}
	return c.disagg()
}

// TestDisaggFlags: --enforce-disagg and conditional disaggregation's flags and JSON config
// resolve as Dynamo resolves them, and what Dynamo refuses is refused naming the flag.
func TestDisaggFlags(t *testing.T) {
	d, err := disaggFlags(t)
	if err != nil || *d != (router.DisaggConfig{}) {
		t.Fatalf("defaults: %+v %v", d, err)
	}
	d, err = disaggFlags(t, "--enforce-disagg", "--router-conditional-disagg")
	if err != nil || !d.Enforce || d.Policy != router.DisaggISLBounding {
		t.Fatalf("enforced, isl_bounding by default: %+v %v", d, err)
	}
	d, err = disaggFlags(t, "--router-conditional-disagg", "--router-conditional-disagg-config",
		`{"policy":"isl_or_load","eff_isl_threshold":4096,"eff_isl_ratio_threshold":0.8,"prefill_busy_threshold":16,"decode_busy_threshold":0.9}`)
	want := router.DisaggConfig{Policy: router.DisaggISLOrLoad, EffISLThreshold: 4096, EffISLRatioThreshold: 0.8,
		PrefillBusyThreshold: 16, HasPrefillBusyThreshold: true, DecodeBusyThreshold: 0.9, HasDecodeBusyThreshold: true}
	if err != nil || *d != want {
		t.Fatalf("JSON config: %+v %v", d, err)
	}
	// A load-aware policy takes the router queue's threshold when it has none of its own.
	d, err = disaggFlags(t, "--router-conditional-disagg", "--router-conditional-disagg-policy", "prefill_load", "--router-queue-threshold", "0.25")
	if err != nil || !d.HasPrefillBusyThreshold || d.PrefillBusyThreshold != 0.25 {
		t.Fatalf("prefill_load with the queue threshold: %+v %v", d, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--router-conditional-disagg-config", `{"policy":"isl_bounding"}`}, "requires --router-conditional-disagg"},
		{[]string{"--router-conditional-disagg", "--router-conditional-disagg-config", `{"threshold":1}`}, "unknown field"},
		{[]string{"--router-conditional-disagg", "--router-conditional-disagg-config", `{"eff_isl_threshold":"big"}`}, "router-conditional-disagg-config"},
		{[]string{"--router-conditional-disagg", "--router-conditional-disagg-policy", "always"}, "--router-conditional-disagg-policy"},
		{[]string{"--router-conditional-disagg", "--router-conditional-disagg-policy", "prefill_load"}, "needs prefill_busy_threshold"},
		{[]string{"--router-conditional-disagg", "--router-conditional-disagg-decode-busy-threshold", "-1"}, "decode_busy_threshold"},
	} {
		if _, err := disaggFlags(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}
