package daemon

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo says what a binary was built from: kvrouterd --version prints it, and the daemon
// exports it as kvrouterd_build_info. A plain value.
type BuildInfo struct {
	// Version is the release: the one set at link time (-ldflags "-X main.version=v1.2.3"),
	// else the module's version (go install …@v1.2.3), else "devel".
	Version string
	// Revision and Time are the VCS commit and its time, "unknown" when the build did not
	// record them (go run, -buildvcs=false, go install of a module). Modified: the work tree
	// had changes the commit does not.
	Revision string
	Time     string
	Modified bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// ReadBuild returns the running binary's BuildInfo; linked is the version set at link time
// ("" when none was).
func ReadBuild(linked string) BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return buildFrom(linked, bi)
}

// buildFrom is ReadBuild over bi, which may be nil (a binary built without module support).
func buildFrom(linked string, bi *debug.BuildInfo) BuildInfo {
	b := BuildInfo{Version: linked, Revision: "unknown", Time: "unknown", GoVersion: "unknown"}
	if bi == nil {
		if b.Version == "" {
			b.Version = "devel"
		}
		return b
	}
	if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	if bi.GoVersion != "" {
		b.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is what kvrouterd --version prints: one line per item, "name: value".
func (b BuildInfo) String() string {
	rev := b.Revision
	if b.Modified {
		rev += " (modified)"
	}
	return fmt.Sprintf("kvrouterd %s\ngo:       %s\nrevision: %s\ntime:     %s\n", b.Version, b.GoVersion, rev, b.Time)
}

// collector exports b as the gauge kvrouterd_build_info{version,revision,goversion} 1, the
// Prometheus convention for joining a build's identity to any series.
func (b BuildInfo) collector() prometheus.Collector {
	rev := b.Revision
	if b.Modified {
		rev += "-modified"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "kvrouterd_build_info",
		Help:        "Always 1: the version, VCS revision and Go version kvrouterd was built from (kvrouterd --version).",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": rev, "goversion": strings.TrimSpace(b.GoVersion)},
	})
	g.Set(1)
	return g
}
