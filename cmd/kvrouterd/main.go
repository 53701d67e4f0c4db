// Command kvrouterd is the KV-cache-aware router daemon: it keeps a global index of which
// inference worker holds which KV blocks and answers route and match requests over HTTP.
// Run kvrouterd --help for its configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvrouterd/kvrouterd/daemon"
)

// version is the release this binary is, set at link time: go build -ldflags "-X
// main.version=v1.2.3". Without it, --version and kvrouterd_build_info take the module's version
// (go install …@v1.2.3), else "devel".
var version string

func main() {
	os.Args = append(os.Args[:1], helpArgs(os.Args[1:])...)
	if versionAsked(os.Args[1:]) {
		fmt.Print(daemon.ReadBuild(version))
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "bridge" {
		bridgeMain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		os.Exit(probeMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	c, err := parseConfig(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvrouterd:", err)
		os.Exit(2)
	}
	c.Build = daemon.ReadBuild(version)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := daemon.Run(ctx, c, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvrouterd:", err)
		os.Exit(1)
	}
}

// bridgeMain runs `kvrouterd bridge` until SIGTERM or SIGINT.
func bridgeMain(args []string) {
	c, err := parseBridgeConfig(args, os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvrouterd bridge:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := runBridge(ctx, c, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvrouterd bridge:", err)
		os.Exit(1)
	}
}

// versionAsked reports whether args (of kvrouterd or kvrouterd bridge) ask for --version, before
// any "--" that ends the flags. The other flags are not parsed: --version answers whatever they
// say, and has no environment variable.
func versionAsked(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--version", "-version":
			return true
		}
	}
	return false
}

// helpArgs turns `kvrouterd help`, as a newcomer types it, into --help: `help bridge` and `help
// probe` into those commands' --help, `help TOPIC` into kvrouterd's for that topic alone
// (helpTopic), `help` alone into kvrouterd's whole.
func helpArgs(args []string) []string {
	if len(args) == 0 || args[0] != "help" {
		return args
	}
	if len(args) > 1 && (args[1] == "bridge" || args[1] == "probe") {
		return []string{args[1], "--help"}
	}
	if len(args) > 1 {
		helpTopic = strings.Join(args[1:], " ")
	}
	return []string{"--help"}
}
