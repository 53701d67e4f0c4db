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
	helpTopic = ""
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

// TestHelpTopic: `kvrouterd help TOPIC` prints that topic alone; an unknown one lists the topics.
func TestHelpTopic(t *testing.T) {
	t.Cleanup(func() { helpTopic = "" })
	help := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		parseConfig(helpArgs(append([]string{"help"}, args...)), func(string) (string, bool) { return "", false }, &out)
		return out.String()
	}
	nats := help("nats")
	if !strings.HasPrefix(nats, "\nNATS:\n") || !strings.Contains(nats, "--nats-url") || strings.Contains(nats, "--router-cost") ||
		strings.Contains(nats, "Examples:") {
		t.Errorf("help nats:\n%s", nats)
	}
	if d := help("dynamo"); !strings.Contains(d, dynamoNamesTitle) || !strings.Contains(d, "--router-valkey-urls") || strings.Contains(d, "--nats-url") {
		t.Errorf("help dynamo:\n%s", d)
	}
	if u := help("no-such-topic"); !strings.Contains(u, `no topic "no-such-topic"`) || !strings.Contains(u, "  Front door\n") {
		t.Errorf("help of an unknown topic:\n%s", u)
	}
}
