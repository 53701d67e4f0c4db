package router

import (
	"strings"
	"testing"
)

// TestParsePolicyConfig: Dynamo main's flat schema parses, YAML or JSON; a bad file is refused
// with an error naming the field at fault.
func TestParsePolicyConfig(t *testing.T) {
	c, err := ParsePolicyConfig([]byte(`{"default_policy_class":"b","policy_classes":[{"name":"a","slo_ms":1,"quantum":2,"prefill_busy_threshold_frac":0.5},{"name":"b","slo_ms":3,"quantum":4}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Profile("any"); p == nil || len(p.Classes) != 2 || p.Default != 1 || p.resolve("") != 1 || p.resolve("a") != 0 || p.resolve("A") != -1 ||
		!p.Classes[0].queues() || p.Classes[1].queues() || p.Classes[0].Quantum != 2 {
		t.Fatalf("parsed %+v", c.Root)
	}
	f := func(doc, want string) {
		t.Helper()
		_, err := ParsePolicyConfig([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want an error with %q", doc, err, want)
		}
	}
	f(``, "empty")
	f(`{}`, "defines no policy_classes")
	f(`default_policy_class: a`, "go together")
	f(`{"default_policy_class":"a","policy_classes":[{"name":"a","slo_ms":1,"quantum":0}]}`, "policy_classes[0].quantum: 0")
	f(`{"default_policy_class":"a","policy_classes":[{"name":"a","quantum":1}]}`, "policy_classes[0].slo_ms: required")
	f(`{"default_policy_class":"a","policy_classes":[{"name":"a b","slo_ms":1,"quantum":1}]}`, "policy_classes[0].name")
	f(`{"default_policy_class":"a","policy_classes":[{"name":"a","slo_ms":1,"quantum":1},{"name":"a","slo_ms":1,"quantum":1}]}`, "policy_classes[1].name: class \"a\" defined twice")
	f(`{"default_policy_class":"z","policy_classes":[{"name":"a","slo_ms":1,"quantum":1}]}`, "default_policy_class: \"z\" names no class")
	f(`{"default_policy_class":"a","policy_classes":[{"name":"a","slo_ms":1,"quantum":1,"prefill_busy_threshold_frac":-1}]}`, "prefill_busy_threshold_frac")
	f(`{"default_policy_class":"a","policy_classes":[{"name":"a","slo_ms":1,"quantum":1,"request_queue_limit_per_worker":-2}]}`, "request_queue_limit_per_worker")
	f(`{"default_policy_class":"a","policy_classes":[{"name":"a","slo_ms":1,"quantum":1,"weight":3}]}`, "weight")
	f(`{"models":{"m":{"default_policy_class":"a","policy_classes":[{"name":"a","slo_ms":1,"quantum":-1}]}}}`, "models.m.policy_classes[0].quantum")
}
