package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouterd/kvrouterd/daemon"
)

const envPrefix = "KVR_"

// envName is the environment twin of a flag: KVR_ and the name upper-cased, dashes as
// underscores (--http-addr → KVR_HTTP_ADDR).
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseConfig fills a daemon configuration from env (a lookup such as os.LookupEnv) and args,
// and checks it.
func parseConfig(args []string, env func(string) (string, bool), out io.Writer) (daemon.Config, error) {
	c, err := parseUnchecked(args, env, out)
	if err != nil {
		return c, err
	}
	return c, c.Check()
}

// parseUnchecked is parseConfig without the check of the whole.
func parseUnchecked(args []string, env func(string) (string, bool), out io.Writer) (daemon.Config, error) {
	c := daemon.Defaults()
	fs := flag.NewFlagSet("kvrouterd", flag.ContinueOnError)
	fs.SetOutput(out)
	c.Flags(fs)
	dynEnvs := defineDynamoFlags(fs)
	var ignored ignoredSet
	for name, vars := range defineIgnored(fs, &ignored) {
		dynEnvs[name] = append(dynEnvs[name], vars...)
	}
	// Dynamo's switch that clears the three busy thresholds (an older router's; main ignores it).
	noAdmission := fs.Bool("no-admission-control", false, "Dynamo's: clear --active-decode-blocks-threshold, --active-prefill-tokens-threshold and --active-prefill-tokens-threshold-frac")
	dynEnvs["no-admission-control"] = []string{"DYN_NO_ADMISSION_CONTROL"}
	if v, ok := env("DYN_NO_ADMISSION_CONTROL"); ok {
		*noAdmission = dynTrue(v)
	}
	if err := dynamoEnv(fs, env); err != nil {
		return c, err
	}
	ignoredEnv(env, &ignored)
	if err := parseFlags(fs, args, env, out, "kvrouterd: a KV-cache-aware router for LLM inference workers.\n\n"+helpExamples+"\n"+
		"Usage: kvrouterd [flags]\n       kvrouterd bridge [flags]   (kvrouterd bridge --help)\n"+
		"       kvrouterd --version        (version, Go version, VCS revision and time)\n\n"+
		"Dynamo's frontend and router flags and DYN_ variables are accepted: for the kvrouterd flags that mean\n"+
		"the same, and the others with a warning that they have no effect (docs/dynamo.md lists them all).\n"+
		"kvrouterd's own (KVR_) variables win over Dynamo's, and flags over both.", dynEnvs); err != nil {
		return c, err
	}
	if *noAdmission {
		c.ActiveDecodeBlocksThreshold = daemon.OptFloat{}
		c.ActivePrefillTokensThreshold = daemon.OptUint{}
		c.ActivePrefillTokensThresholdFrac = daemon.OptFloat{}
	}
	c.DynamoIgnored = ignored.list
	return c, nil
}

// parseFlags sets fs's flags from their environment variables (see envName), then from args,
// and refuses positional arguments. --help prints title and every flag with its variable.
// A bad flag is one line that names it (and the flag probably meant), not the whole usage: the
// usage is for --help.
//
// dynEnvs lists Dynamo's variables by flag name: a flag in it that is an alias of another (its
// value is no value of its own) has no KVR_ variable.
func parseFlags(fs *flag.FlagSet, args []string, env func(string) (string, bool), out io.Writer, title string, dynEnvs map[string][]string) error {
	alias := func(f *flag.Flag) bool {
		switch f.Value.(type) {
		case aliasValue, ignoredValue:
			return true
		}
		return f.Name == "no-admission-control"
	}
	usage := func() { writeUsage(out, fs, title, dynEnvs, alias) }
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	unitless := wrapDurations(fs)
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if alias(f) {
			return
		}
		if v, ok := env(envName(f.Name)); ok && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %v", envName(f.Name), v, e)
			}
		}
	})
	if err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return err
		}
		if *unitless != nil {
			return *unitless
		}
		return badFlag(fs, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// badFlag is the one-line error for a flag fs refused; for an unknown flag it names the defined
// one closest to it, if any is within two edits.
func badFlag(fs *flag.FlagSet, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: ")
	if !ok {
		return fmt.Errorf("%s (--help lists every flag)", doubleDash(err.Error()))
	}
	name = strings.TrimLeft(name, "-")
	best, bestD := "", 3 // farther than two edits is no suggestion
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) || strings.HasPrefix(name, f.Name) {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" {
		return fmt.Errorf("unknown flag --%s (--help lists every flag)", name)
	}
	return fmt.Errorf("unknown flag --%s: did you mean --%s? (--help lists every flag)", name, best)
}

// doubleDash writes the flag a message of the flag package names with two dashes, as the
// help and the documentation write flags: "flag needs an argument: -http-addr" becomes
// "flag needs an argument: --http-addr".
func doubleDash(msg string) string {
	for _, p := range []string{"flag needs an argument: -", " for flag -", " for -"} {
		if i := strings.Index(msg, p); i >= 0 && !strings.HasPrefix(msg[i+len(p):], "-") {
			return msg[:i+len(p)] + "-" + msg[i+len(p):]
		}
	}
	return msg
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// unitDuration is a duration flag that refuses a number without a unit with the fix: Go's
// durations need one, and "--snapshot-interval 30" would otherwise be a parse error that does not
// say so. A bare 0 is a duration.
type unitDuration struct {
	flag.Getter
	name string
	// unitless is where Set leaves the whole message for a flag on the command line, which the
	// flag package would bury in its own.
	unitless *error
}

func (u unitDuration) Set(v string) error {
	s := strings.TrimSpace(v)
	if _, err := strconv.ParseFloat(s, 64); err == nil && s != "0" {
		*u.unitless = fmt.Errorf("--%s: %s has no unit; write %ss", u.name, s, s)
		return fmt.Errorf("%s has no unit; write %ss", s, s)
	}
	return u.Getter.Set(v)
}

// wrapDurations makes every duration flag of fs a unitDuration, and returns where their
// command-line refusals go.
func wrapDurations(fs *flag.FlagSet) *error {
	unitless := new(error)
	fs.VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, ok := g.Get().(time.Duration); ok {
				f.Value = unitDuration{Getter: g, name: f.Name, unitless: unitless}
			}
		}
	})
	return unitless
}
