package main

import (
	"bytes"
	"flag"
	"os"
	"regexp"
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

// TestConfigurationDocListsEveryFlag: docs/configuration.md names every flag of kvrouterd's
// own that --help lists, and every Dynamo name for one is in it or in docs/dynamo.md, so that
// neither falls behind the flag set.
func TestConfigurationDocListsEveryFlag(t *testing.T) {
	helpTopic = ""
	var out bytes.Buffer
	parseConfig([]string{"--help"}, func(string) (string, bool) { return "", false }, &out)
	conf, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := os.ReadFile("../../docs/dynamo.md")
	if err != nil {
		t.Fatal(err)
	}
	// The docs write a flag's forms together: --[no-]x is --x and --no-x, --x[-config] is --x
	// and --x-config.
	expand := func(doc []byte) []byte {
		s := string(doc)
		for _, r := range [][2]string{{"--[no-]", "--no-"}, {"--[no-]", "--"}, {"--[router-]", "--router-"}, {"--[router-]", "--"}} {
			s += "\n" + strings.ReplaceAll(s, r[0], r[1])
		}
		s += "\n" + regexp.MustCompile(`\[(-[a-z-]+)\]`).ReplaceAllString(s, "$1")
		return []byte(s)
	}
	conf, dyn = expand(conf), expand(dyn)
	named := func(doc []byte, name string) bool {
		return regexp.MustCompile(`--` + regexp.QuoteMeta(name) + `([^a-z0-9-]|$)`).Match(doc)
	}
	section, n := "", 0
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " ") {
			section = line
		}
		if !strings.HasPrefix(line, "  --") || !strings.Contains(line, " (") {
			continue
		}
		name := strings.TrimPrefix(strings.Fields(line)[0], "--")
		n++
		switch {
		case strings.HasPrefix(section, dynamoNamesTitle):
			if !named(conf, name) && !named(dyn, name) {
				t.Errorf("Dynamo's --%s is in neither docs/configuration.md nor docs/dynamo.md", name)
			}
		case !named(conf, name):
			t.Errorf("--%s (%s) is not in docs/configuration.md", name, strings.TrimSuffix(section, ":"))
		}
	}
	if n < 100 {
		t.Fatalf("%d flags read from --help", n)
	}
}
