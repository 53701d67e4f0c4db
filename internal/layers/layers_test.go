package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// layer places every package of the module, by its path inside the module; a package imports
// only packages of lower layers, save the pairs in sameLayer.
var layer = map[string]int{
	"internal/bearer":   1,
	"internal/extbin":   1,
	"internal/freelist": 1,
	"internal/striped":  1,
	"internal/freeport": 1,
	"internal/syncbuf":  1,
	"internal/hostile":  1,
	"internal/layers":   1,
	"internal/lograte":  1,
	"internal/memstat":  1,
	"internal/natstest": 1,
	"internal/panics":   1,
	"internal/pause":    1,
	"internal/peer":     1,
	"internal/prefetch": 1,
	"internal/testsum":  1,
	"internal/tlscert":  1,
	"internal/u64map":   1,
	"kvevent":           1,

	"approx":   2,
	"radix":    2,
	"scoring":  2,
	"snapshot": 2,
	"wire":     2,

	"internal/enginetest": 3, // a fake engine for tests: writes its payloads with wire, so it sits above it
	"router":              3,
	"shard":               3,

	"client":            4,
	"frontdoor":         4,
	"ingest":            4,
	"internal/refmodel": 4, // models radix and shard for their tests, so it sits above them
	"replica":           4,
	"server":            4,
	"ui":                4, // the status page: reads the router; the daemon hands it to the server

	"daemon": 5,

	"cmd/kvrouterd": 6,

	"bench/azuretrace": 7,
	"bench/burstgpt":   7,
	"bench/demo":       7,
	"bench/e2e":        7,
	"bench/fleet":      7,
	"bench/fleetsim":   7,
	"bench/kvrload":    7,
	"bench/loadgen":    7,
	"bench/mocker":     7,
	"bench/replay":     7,
	"bench/report":     7,
	"bench/sim":        7,
	"bench/soak":       7,
	"bench/tracegen":   7,
	"bench/trace":      7,
	"bench/tracecsv":   7,
	"cmd/kvr-mocker":   7, // the mock engine's command: a bench tool, out of the daemon's tree
	"deploy":           7, // tests only: the image, manifests and dashboard against a whole daemon
	"fuzz":             7, // cross-package fuzz targets: drive server, router, ingest and wire together
}

// sameLayer names the imports within one layer that the design allows, with the reason; a to
// ending in "/" stands for every package under it.
var sameLayer = []struct{ from, to, why string }{
	{"internal/u64map", "internal/prefetch", "helpers may build on helpers"},
	{"internal/natstest", "internal/extbin", "helpers may build on helpers"},
	{"internal/natstest", "internal/freeport", "helpers may build on helpers"},
	{"approx", "radix", "the approximate index answers in the index's terms"},
	{"scoring", "radix", "scoring decides on the index's matches"},
	{"router", "shard", "a request's path books into the applier's index"},
	{"bench/", "bench/", "the benchmarks build on one another"},
	{"cmd/kvr-mocker", "bench/", "the mock engine's command runs bench/mocker, which shares bench/sim's worker model with the fleet simulations"},
}

// onlyImports bounds what the design lets a package depend on within the module, transitively;
// a value ending in "/" stands for every package under it.
var onlyImports = map[string][]string{
	"kvevent": {"internal/"},
	"wire":    {"kvevent", "internal/"},
	"client":  {"wire", "kvevent", "internal/"},
}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func TestLayers(t *testing.T) {
	mod, pkgs := list(t, "")
	_, tagged := list(t, "invariants") // some files build only under the tag
	for p, q := range tagged {
		if have, ok := pkgs[p]; ok {
			have.Imports = union(have.Imports, q.Imports)
			have.Deps = union(have.Deps, q.Deps)
			pkgs[p] = have
		}
	}

	rel := func(path string) (string, bool) {
		if path == mod {
			return ".", true
		}
		r, ok := strings.CutPrefix(path, mod+"/")
		return r, ok
	}
	for _, p := range pkgs {
		from, _ := rel(p.ImportPath)
		lf, ok := layer[from]
		if !ok {
			t.Errorf("%s has no layer: add it to the table in internal/layers/layers_test.go, in the layer "+
				"the design (bottom to top: internal/ and kvevent, index and codecs, shard and router, "+
				"services, the daemon, bench) gives it", from)
			continue
		}
		for _, imp := range p.Imports {
			to, ok := rel(imp)
			if !ok {
				continue
			}
			lt, known := layer[to]
			switch {
			case !known:
				// Reported as the imported package's own error.
			case lt < lf:
			case lt == lf && allowedSameLayer(from, to):
			case lt == lf:
				t.Errorf("%s (layer %d) imports %s of its own layer: allowed only for the pairs in sameLayer", from, lf, to)
			default:
				t.Errorf("%s (layer %d) imports %s of layer %d above it", from, lf, to, lt)
			}
		}
	}
	for p := range layer {
		if _, ok := pkgs[mod+"/"+p]; !ok {
			t.Errorf("the table names %s, which the module no longer has: remove it", p)
		}
	}

	for from, allowed := range onlyImports {
		p, ok := pkgs[mod+"/"+from]
		if !ok {
			continue
		}
		for _, d := range p.Deps {
			to, ok := rel(d)
			if ok && !slices.ContainsFunc(allowed, func(a string) bool { return matches(a, to) }) {
				t.Errorf("%s depends on %s: the design lets it depend on %v only", from, to, allowed)
			}
		}
	}
}

// TestClientLinksNoIndex: a gateway that imports the client compiles the codecs and nothing of
// the index or the applier.
func TestClientLinksNoIndex(t *testing.T) {
	mod, pkgs := list(t, "")
	for _, d := range pkgs[mod+"/client"].Deps {
		if d == mod+"/shard" || d == mod+"/radix" {
			t.Errorf("client depends on %s", d)
		}
	}
}

// TestDaemonLinksNoBench: the daemon's dependency tree holds neither the benchmarks nor their
// plotting libraries, nor the browser driver of the status page's test.
func TestDaemonLinksNoBench(t *testing.T) {
	mod, pkgs := list(t, "")
	p, ok := pkgs[mod+"/cmd/kvrouterd"]
	if !ok {
		t.Fatal("go list does not report cmd/kvrouterd")
	}
	for _, d := range p.Deps {
		if strings.HasPrefix(d, mod+"/bench/") || strings.HasPrefix(d, "gonum.org/") ||
			strings.Contains(strings.ToLower(d), "plot") || strings.HasPrefix(d, "github.com/chromedp/") {
			t.Errorf("cmd/kvrouterd depends on %s", d)
		}
	}
}

func union(a, b []string) []string {
	u := slices.Concat(a, b)
	slices.Sort(u)
	return slices.Compact(u)
}

func allowedSameLayer(from, to string) bool {
	for _, s := range sameLayer {
		if matches(s.from, from) && matches(s.to, to) {
			return true
		}
	}
	return false
}

// matches reports whether pattern (a package, or a folder ending in "/") covers p.
func matches(pattern, p string) bool {
	if strings.HasSuffix(pattern, "/") {
		return strings.HasPrefix(p, pattern)
	}
	return p == pattern
}

// list runs go list over the module with the build tags given and returns the module path and
// its packages by import path; it skips the test when the go command cannot run.
func list(t *testing.T, tags string) (string, map[string]pkg) {
	t.Helper()
	gocmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gocmd); err != nil {
		if gocmd, err = exec.LookPath("go"); err != nil {
			t.Skipf("no go command to list the packages with: %v", err)
		}
	}
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(gocmd, args...)
		cmd.Dir = filepath.Join("..", "..")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
		}
		return out
	}
	mod := strings.TrimSpace(string(run("list", "-m")))
	args := []string{"list", "-e", "-json=ImportPath,Imports,Deps"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	dec := json.NewDecoder(bytes.NewReader(run(append(args, "./...")...)))
	pkgs := make(map[string]pkg)
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading go list: %v", err)
		}
		pkgs[p.ImportPath] = p
	}
	return mod, pkgs
}
