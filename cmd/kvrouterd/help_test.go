package main

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

// TestHelpGroups: --help lists every flag of the daemon once, kvrouterd's own under a topic
// (none is left to "Other"), opens with examples, and names Dynamo's flags without effect in a
// compact list.
func TestHelpGroups(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, func(string) (string, bool) { return "", false }, &out); err == nil {
		t.Fatal("--help parsed as a configuration")
	}
	help := out.String()
	if !strings.Contains(help, "Examples:\n") || strings.Contains(help, "\nOther:\n") {
		t.Fatalf("examples missing, or flags without a topic:\n%s", help)
	}
	for _, g := range helpGroups {
		if !strings.Contains(help, "\n"+g.title+":\n") {
			t.Errorf("topic %q has no flag", g.title)
		}
	}
	// Every flag appears once: as "  --name (" with its variables, or by name in the list of
	// Dynamo's flags without effect.
	fs := flag.NewFlagSet("kvrouterd", flag.ContinueOnError)
	n := 0
	for _, line := range strings.Split(help, "\n") {
		if strings.HasPrefix(line, "  --") {
			for _, w := range strings.Fields(line) {
				if strings.HasPrefix(w, "--") {
					name := strings.TrimPrefix(w, "--")
					if fs.Lookup(name) != nil {
						t.Errorf("--%s listed twice", name)
					}
					fs.Bool(name, false, "")
					n++
				}
				if strings.HasSuffix(w, "(") || strings.HasPrefix(w, "(") {
					break // the rest of the line is the flag's variables
				}
			}
		}
	}
	if lines := strings.Count(help, "\n"); n < 100 || lines > 450 {
		t.Errorf("%d flags in %d lines", n, lines)
	}
}
