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
	"syscall"

	"github.com/kvrouterd/kvrouterd/daemon"
)

func main() {
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
