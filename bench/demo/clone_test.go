//go:build !race && !invariants

// Once per `make test`: the demo is the same program in the race and invariants passes.

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMakeDemoFreshClone: `make demo` on a fresh clone of the repository's last commit — no
// ./traces, nothing beside it (no ../shared) — replays the built-in generated workload, says
// how to get the Mooncake trace, passes ARGS through and draws its plot. It builds kvrouterd
// and kvr-mocker in the clone.
func TestMakeDemoFreshClone(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository and runs make demo")
	}
	for _, p := range []string{"git", "make"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed: make demo on a fresh clone is not tested", p)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--verify", "HEAD").CombinedOutput(); err != nil {
		t.Skipf("%s is not a git checkout with a commit (%v: %s): make demo on a fresh clone is not tested", root, err, out)
	}
	dir := t.TempDir()
	clone := filepath.Join(dir, "kvrouterd")
	if out, err := exec.Command("git", "clone", "--quiet", root, clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "out")
	cmd := exec.Command("make", "demo", "ARGS=--requests 24 --sim-orders 1", "OUT="+out)
	cmd.Dir = clone
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVROUTERD_TRACES=") && !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MFLAGS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	b, err := cmd.CombinedOutput()
	text := string(b)
	if err != nil {
		t.Fatalf("make demo on a fresh clone: %v\n%s", err, text)
	}
	for _, want := range []string{
		"built-in generated workload", "`make traces`", "24 requests of the built-in generated workload",
		"round_robin", "lower is better", "plot: " + filepath.Join(out, "demo.png"),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("make demo's output lacks %q:\n%s", want, text)
		}
	}
	if st, err := os.Stat(filepath.Join(out, "demo.png")); err != nil || st.Size() == 0 {
		t.Errorf("no plot: %v", err)
	}
}
