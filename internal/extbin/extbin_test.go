package extbin

import (
	"errors"
	"strings"
	"testing"
)

// TestLookup: a program found is used whatever the variable says; a missing one skips, or fails
// when the variable asks for it; a variable that is no boolean fails rather than skip.
func TestLookup(t *testing.T) {
	have := func(p string) (string, error) {
		if p == "chromium" || p == "/usr/bin/prometheus" {
			return "/usr/bin/" + strings.TrimPrefix(p, "/usr/bin/"), nil
		}
		return "", errors.New("not found")
	}
	f := func(require string, names []string, wantPath, wantMsg string, wantFail bool) {
		t.Helper()
		path, msg, fail := lookup(require, have, names[0], "the thing is not tested", names[1:])
		if path != wantPath || !strings.Contains(msg, wantMsg) || fail != wantFail {
			t.Errorf("lookup(%q, %q) = %q, %q, %v; want %q, a message with %q, %v", require, names, path, msg, fail, wantPath, wantMsg, wantFail)
		}
	}
	f("", []string{"chromium", "/usr/bin/chromium-x", "chromium"}, "/usr/bin/chromium", "", false)
	f("1", []string{"prometheus", "/usr/bin/prometheus"}, "/usr/bin/prometheus", "", false)
	f("", []string{"nats-server"}, "", "apt-get install nats-server; .ci/run installs it): the thing is not tested", false)
	f("0", []string{"nats-server"}, "", "is not installed", false)
	f("1", []string{"nats-server"}, "", "nats-server is not installed and KVR_REQUIRE_EXTERNAL=1 requires it", true)
	f("true", []string{"nats-server"}, "", "requires it", true)
	f("yes", []string{"chromium"}, "", `KVR_REQUIRE_EXTERNAL="yes": want 1`, true)
}
