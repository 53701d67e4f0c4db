package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// helpExamples open kvrouterd's --help.
const helpExamples = `Examples:
  kvrouterd                                    the daemon with its embedded NATS server, on :8090
  kvrouterd --shards 32 --frontend-addr :8000  32 event shards, and the OpenAI-compatible front door
  kvrouterd --zmq worker=1,model=llama,endpoint=tcp://10.0.0.5:5557   read a vLLM engine's KV events
  kvrouterd --nats-url nats://nats:4222 --data-dir ./data-b           a second replica on one NATS
  kvrouterd help                               this text (docs/configuration.md has every flag by topic)
  kvrouterd help nats                          the flags of one topic (help x lists the topics)
`

// helpGroup is one topic of --help: its title and the flags it holds, by name.
type helpGroup struct {
	title string
	match func(name string) bool
}

func prefixes(ps ...string) func(string) bool {
	return func(name string) bool {
		for _, p := range ps {
			if name == p || strings.HasSuffix(p, "-") && strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
}

// helpGroups are --help's topics in the order printed, as docs/configuration.md groups them; a
// flag goes to the first that matches (TestHelpGroups: every flag of the daemon has one).
var helpGroups = []helpGroup{
	{"Listeners and storage", prefixes("http-", "admin-addr", "selection-", "slot-tracker-addr", "data-dir", "shards",
		"max-body-bytes", "shutdown-timeout", "transparent-huge-pages", "min-free-disk", "kv-indexer-test-endpoints")},
	{"Front door", prefixes("frontend-", "worker-eject", "worker-eject-", "worker-api-keys-file", "worker-timeout", "tokenizer",
		"migration-limit")},
	{"Router queue and overload", prefixes("router-queue-", "router-policy-config", "ttft-slo", "overload-status",
		"waiting-requests-threshold", "active-", "queue-len")},
	{"Disaggregation and storage tiers", prefixes("enforce-disagg", "router-conditional-disagg", "router-conditional-disagg-",
		"router-host-cache-hit-weight", "router-disk-cache-hit-weight")},
	{"Routing", prefixes("router-", "approx-", "agentic", "load-aware", "max-candidates", "request-expiry", "block-size",
		"max-index-bytes", "max-blocks", "keep-block-tree", "no-kv-events", "no-router-assume-kv-reuse", "overlap-score-weight",
		"track-prefill-tokens")},
	{"Engines and KV events", prefixes("zmq", "zmq-", "events-", "control-", "clear-on-gap")},
	{"NATS", prefixes("nats-")},
	{"Replicas and snapshots", prefixes("peers", "indexer-peers", "replica-id", "share-load", "bootstrap-from", "snapshot-",
		"no-snapshots")},
	{"Security", prefixes("tls-", "auth-")},
	{"Logs and metrics", prefixes("log-", "metrics-prefix")},
}

// The titles of --help's two lists of Dynamo's flags.
const (
	dynamoNamesTitle   = "Dynamo's names"
	dynamoIgnoredTitle = "Dynamo's flags accepted without effect"
)

// groupOf returns the title of name's --help topic, "" for none.
func groupOf(name string) string {
	for _, g := range helpGroups {
		if g.match(name) {
			return g.title
		}
	}
	return ""
}

// helpTopic, if set (`kvrouterd help TOPIC`), limits --help to the topics whose title holds it
// (case aside): "dynamo" for Dynamo's names and its flags without effect.
var helpTopic string

// shown reports whether --help prints the topic titled title.
func shown(title string) bool {
	return helpTopic == "" || strings.Contains(strings.ToLower(title), strings.ToLower(helpTopic))
}

// writeUsage prints fs's help: title, then kvrouterd's own flags by topic (each with its
// variables and default), then Dynamo's names for them, then Dynamo's flags accepted without
// effect, by name alone; with helpTopic, the matching topics alone, or the topics' titles when
// none matches. dynEnvs and alias are parseFlags'.
func writeUsage(out io.Writer, fs *flag.FlagSet, title string, dynEnvs map[string][]string, alias func(*flag.Flag) bool) {
	if helpTopic != "" {
		any := false
		for _, g := range append(helpGroups, helpGroup{title: dynamoNamesTitle}, helpGroup{title: dynamoIgnoredTitle}) {
			any = any || shown(g.title)
		}
		if !any {
			fmt.Fprintf(out, "kvrouterd help: no topic %q; the topics:\n", helpTopic)
			for _, g := range helpGroups {
				fmt.Fprintf(out, "  %s\n", g.title)
			}
			fmt.Fprintf(out, "  %s\n  %s\n", dynamoNamesTitle, dynamoIgnoredTitle)
			return
		}
	} else {
		fmt.Fprintf(out, "%s\n\nEvery flag can also be set by an environment variable, %s plus its\n"+
			"name in upper case with underscores (e.g. KVR_SHARDS=32); flags win.\n", title, envPrefix)
	}
	vars := func(f *flag.Flag) string {
		var envs []string
		if !alias(f) {
			envs = append(envs, envName(f.Name))
		}
		envs = append(envs, dynEnvs[f.Name]...)
		if len(envs) == 0 {
			return "no variable"
		}
		return "env " + strings.Join(envs, ", ")
	}
	var own, aliases, ignored []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		switch f.Value.(type) {
		case ignoredValue:
			ignored = append(ignored, f)
		case aliasValue:
			aliases = append(aliases, f)
		default:
			if alias(f) {
				aliases = append(aliases, f)
			} else {
				own = append(own, f)
			}
		}
	})
	printOwn := func(title string, fs []*flag.Flag) {
		if len(fs) == 0 || !shown(title) {
			return
		}
		if title != "" {
			fmt.Fprintf(out, "\n%s:\n", title)
		} else {
			fmt.Fprintln(out)
		}
		for _, f := range fs {
			fmt.Fprintf(out, "  --%s (%s, default %q)\n    \t%s\n", f.Name, vars(f), f.DefValue, f.Usage)
		}
	}
	byGroup := map[string][]*flag.Flag{}
	for _, f := range own {
		g := groupOf(f.Name)
		byGroup[g] = append(byGroup[g], f)
	}
	for _, g := range helpGroups {
		printOwn(g.title, byGroup[g.title])
	}
	other := "Other"
	if len(byGroup[""]) == len(own) {
		other = "" // a command whose flags have no topics (kvrouterd bridge)
	}
	printOwn(other, byGroup[""])
	if len(aliases) > 0 && shown(dynamoNamesTitle) {
		fmt.Fprintf(out, "\n%s (each sets the kvrouterd setting it names):\n", dynamoNamesTitle)
		for _, f := range aliases {
			fmt.Fprintf(out, "  --%s (%s)\n    \t%s\n", f.Name, vars(f), f.Usage)
		}
	}
	if len(ignored) > 0 && shown(dynamoIgnoredTitle) {
		fmt.Fprintf(out, "\n%s (each logs one warning; docs/dynamo.md says why):\n", dynamoIgnoredTitle)
		line := " "
		for _, f := range ignored {
			if len(line)+len(f.Name)+3 > 100 {
				fmt.Fprintln(out, line)
				line = " "
			}
			line += " --" + f.Name
		}
		fmt.Fprintln(out, line)
	}
}
