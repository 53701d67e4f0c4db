package daemon

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBuildFrom: the link-time version wins, then the module's, then "devel"; the VCS settings
// give the revision and time, "unknown" when the build recorded none.
func TestBuildFrom(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-11-27T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}
	f := func(linked string, bi *debug.BuildInfo, want BuildInfo) {
		t.Helper()
		if got := buildFrom(linked, bi); got != want {
			t.Fatalf("buildFrom(%q): %+v, want %+v", linked, got, want)
		}
	}
	f("v1.2.3", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.9.0"}, Settings: vcs},
		BuildInfo{Version: "v1.2.3", Revision: "0123abcd", Time: "2026-11-27T10:00:00Z", Modified: true, GoVersion: "go1.26.8"})
	f("", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.9.0"}},
		BuildInfo{Version: "v0.9.0", Revision: "unknown", Time: "unknown", GoVersion: "go1.26.8"})
	f("", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
		BuildInfo{Version: "devel", Revision: "unknown", Time: "unknown", GoVersion: "go1.26.8"})
	f("", nil, BuildInfo{Version: "devel", Revision: "unknown", Time: "unknown", GoVersion: "unknown"})
}

// TestBuildInfoMetric: kvrouterd_build_info is 1 with the build's version, revision and Go
// version as labels.
func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(BuildInfo{Version: "v1.2.3", Revision: "0123abcd", Time: "t", GoVersion: "go1.26.8"}.collector())
	want := `
# HELP kvrouterd_build_info Always 1: the version, VCS revision and Go version kvrouterd was built from (kvrouterd --version).
# TYPE kvrouterd_build_info gauge
kvrouterd_build_info{goversion="go1.26.8",revision="0123abcd",version="v1.2.3"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouterd_build_info"); err != nil {
		t.Fatal(err)
	}
}
