// Package extbin finds the programs outside Go that some tests drive — nats-server, chromium,
// prometheus, from the Debian packages of those names — and holds the one rule for a test
// whose program is missing: it skips, saying which package to install, unless the variable
// KVR_REQUIRE_EXTERNAL is 1, when it fails. .ci/run sets it once it has installed the packages,
// so that a test which cannot find its program is a failure there rather than a silent skip.
// Only tests import it; Find is safe for concurrent use.
package extbin

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// Require is the variable that turns a missing program from a skip into a failure.
const Require = "KVR_REQUIRE_EXTERNAL"

// Find returns the path of the first of names found (a name with a slash is taken as a path;
// none: the package's own name). Without any, it skips t, naming the Debian package pkg and what
// goes untested, or fails it when Require is 1 (or a bad value).
func Find(t testing.TB, pkg, untested string, names ...string) string {
	t.Helper()
	path, msg, fail := lookup(os.Getenv(Require), exec.LookPath, pkg, untested, names)
	switch {
	case fail:
		t.Fatal(msg)
	case path == "":
		t.Skip(msg)
	}
	return path
}

// lookup is Find's decision: the program's path, or what to say and whether to fail.
func lookup(require string, look func(string) (string, error), pkg, untested string, names []string) (path, msg string, fail bool) {
	required, err := strconv.ParseBool(require)
	if require != "" && err != nil {
		return "", fmt.Sprintf("%s=%q: want 1 (a missing program fails the test) or 0 (it skips)", Require, require), true
	}
	if len(names) == 0 {
		names = []string{pkg}
	}
	for _, name := range names {
		if p, err := look(name); err == nil {
			return p, "", false
		}
	}
	if required {
		return "", fmt.Sprintf("%s is not installed and %s=%s requires it (Debian: apt-get install %s); %s", names[0], Require, require, pkg, untested), true
	}
	return "", fmt.Sprintf("%s is not installed (Debian: apt-get install %s; .ci/run installs it): %s", names[0], pkg, untested), false
}
