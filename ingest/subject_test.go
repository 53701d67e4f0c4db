package ingest

import (
	"strings"
	"testing"
)

func TestSubjects(t *testing.T) {
	for _, model := range []string{"m", "meta-llama/Llama-3.1-8B", "a b*c>d%e.f", "é"} {
		s := EventSubject("kvr", model, 42)
		if strings.Count(s, ".") != 3 || strings.ContainsAny(s, " *>") {
			t.Fatalf("%q: subject %q is not four plain tokens", model, s)
		}
		kind, m, w, err := ParseSubject("kvr", s)
		if err != nil || kind != "events" || m != model || w != 42 {
			t.Fatalf("%q: parsed %q %q %d %v", s, kind, m, w, err)
		}
		if kind, m, _, err = ParseSubject("kvr", LoadSubject("kvr", model, 1)); err != nil || kind != "load" || m != model {
			t.Fatalf("load subject of %q: %q %q %v", model, kind, m, err)
		}
	}
	if got := ModelToken("meta-llama/Llama-3.1-8B"); got != "meta-llama%2FLlama-3%2E1-8B" {
		t.Errorf("token %q", got)
	}
	for _, bad := range []string{"x.events.m.1", "kvr.events.m", "kvr.events.m.one", "kvr.other.m.1", "kvr.events.%4.1", "kvr.events.%zz.1", "kvr.events..1"} {
		if _, _, _, err := ParseSubject("kvr", bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
