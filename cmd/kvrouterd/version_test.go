package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// TestVersion: a binary linked with -X main.version (as release builds are) prints that version,
// the Go version, the VCS revision and time for --version, before any other flag is looked at,
// and exports the same as kvrouterd_build_info{version,revision,goversion} 1.
func TestVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := filepath.Join(t.TempDir(), "kvrouterd")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.Command(gobin, "build", "-ldflags", "-X main.version=v9.8.7-test", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"--version"}, {"-version"}, {"--shards", "nope", "--version"}, {"bridge", "--version"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		got := string(out)
		if err != nil || !strings.HasPrefix(got, "kvrouterd v9.8.7-test\n") || !strings.Contains(got, "go:       "+runtime.Version()+"\n") ||
			!strings.Contains(got, "\nrevision: ") || !strings.Contains(got, "\ntime:     ") {
			t.Fatalf("%q: %v\n%s", args, err, got)
		}
	}
	if versionAsked([]string{"--", "--version"}) {
		t.Fatal(`--version after "--" is no flag`)
	}

	d := startDaemon(t, bin, "--no-kv-events", "--no-snapshots", "--data-dir", t.TempDir())
	defer func() {
		d.cmd.Process.Signal(syscall.SIGTERM)
		d.cmd.Wait()
	}()
	page := scrape(d.addr)
	var line string
	for l := range strings.SplitSeq(page, "\n") {
		if strings.HasPrefix(l, "kvrouterd_build_info{") {
			line = l
		}
	}
	if !strings.Contains(line, `version="v9.8.7-test"`) || !strings.Contains(line, `goversion="`+runtime.Version()+`"`) ||
		!strings.Contains(line, `revision="`) || !strings.HasSuffix(line, "} 1") {
		t.Fatalf("kvrouterd_build_info: %q", line)
	}
	if !strings.Contains(d.log(), "version=v9.8.7-test") {
		t.Fatalf("the ready line names no version:\n%s", d.log())
	}
}
