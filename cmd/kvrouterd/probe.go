package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// probeMain runs `kvrouterd probe URL...`, the container's health check: a minimal image has no
// curl, so the binary it already holds asks its own /healthz and /readyz. It GETs each URL in
// turn and returns 0 if every one answers 200, else 1 with the first failure on stderr (2 for bad
// usage). It keeps no state and may run beside the daemon as often as the engine likes.
func probeMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvrouterd probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 3*time.Second, "time allowed for each URL, connection to last byte")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "kvrouterd probe: exit 0 if every URL answers 200 to a GET, else 1 (a health check for images without curl).\n\n"+
			"Usage: kvrouterd probe [--timeout 3s] http://127.0.0.1:8090/healthz http://127.0.0.1:8090/readyz")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "kvrouterd probe: name at least one URL")
		return 2
	}
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	for _, u := range fs.Args() {
		if err := probe(client, u); err != nil {
			fmt.Fprintf(stderr, "kvrouterd probe: %s: %v\n", u, err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: ok\n", u)
	}
	return 0
}

// probe GETs url and says why it is not healthy: no answer, or a status other than 200 (with
// the first line of the body, which says what /readyz waits for).
func probe(client *http.Client, url string) error {
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return fmt.Errorf("want an http:// or https:// URL")
	}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
		return fmt.Errorf("%s: %s", resp.Status, line)
	}
	return nil
}
