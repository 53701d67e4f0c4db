// Command kvr-mocker is a mock inference engine: one simulated vLLM worker (bench/mocker) with
// vLLM's OpenAI API, /tokenize and KV events on ZMQ, that registers with kvrouterd. Run
// kvr-mocker --help for its flags; each has a KVR_MOCKER_ environment twin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvrouterd/kvrouterd/bench/mocker"
)

const envPrefix = "KVR_MOCKER_"

func main() {
	c, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvr-mocker:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := mocker.Run(ctx, c, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvr-mocker:", err)
		if errors.Is(err, mocker.ErrDied) {
			os.Exit(3) // --die-after: a crash a test asked for, told apart from a failure
		}
		os.Exit(1)
	}
}

// envName is a flag's environment twin: --block-size → KVR_MOCKER_BLOCK_SIZE.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseConfig fills a mocker configuration from env (a lookup such as os.LookupEnv), then args
// (flags win), and checks it.
func parseConfig(args []string, env func(string) (string, bool), out io.Writer) (mocker.Config, error) {
	c := mocker.Defaults()
	fs := flag.NewFlagSet("kvr-mocker", flag.ContinueOnError)
	c.Flags(fs)
	fs.SetOutput(io.Discard)
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := env(envName(f.Name)); ok && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %v", envName(f.Name), v, e)
			}
		}
	})
	if err != nil {
		return c, err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(out, "kvr-mocker: a mock vLLM engine (simulated KV cache and step times) for kvrouterd.\n\n"+
				"Usage: kvr-mocker [flags]\n\nEvery flag can also be set by an environment variable, %s plus its\n"+
				"name in upper case with underscores (e.g. %s=4); flags win.\n\n", envPrefix, envName("worker-id"))
			fs.VisitAll(func(f *flag.Flag) {
				fmt.Fprintf(out, "  --%s (env %s, default %q)\n    \t%s\n", f.Name, envName(f.Name), f.DefValue, f.Usage)
			})
			return c, err
		}
		return c, fmt.Errorf("%v (--help lists every flag)", err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, c.Check()
}
