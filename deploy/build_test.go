package deploy

import (
	"bytes"
	"debug/elf"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestBuildScript runs deploy/build.sh, the build the Dockerfile runs, and checks what the
// image needs of the binary: static (an image without a C library runs it), no path of the
// build machine in it (-trimpath), the version stamped in when package main has the variable,
// --help answering, and the probe subcommand the image's health check calls.
func TestBuildScript(t *testing.T) {
	bin, version := buildImageBinary(t)
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS == "linux" {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("the binary has a %v program header: dynamically linked, it cannot run on a static image", p.Type)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("the binary needs %q", libs)
		}
	}
	for _, dir := range []string{root, runtime.GOROOT()} {
		if bytes.Contains(data, []byte(dir+string(filepath.Separator))) {
			t.Errorf("the binary holds the build machine's path %s: built without -trimpath", dir)
		}
	}
	if hasVersionVar(t) {
		if !bytes.Contains(data, []byte(version)) {
			t.Errorf("VERSION=%s is not in the binary: build.sh's -X main.version does not reach package main's version", version)
		}
	} else {
		t.Logf("package main has no version variable yet: the stamp is not checked")
	}

	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: kvrouterd") {
		t.Fatalf("kvrouterd --help: %v\n%s", err, out)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.Error(w, "catching up: event stream applied to sequence 1 of 2", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	f := func(path string, wantExit int) {
		t.Helper()
		out, err := exec.Command(bin, "probe", srv.URL+path).CombinedOutput()
		code := 0
		if e, ok := err.(*exec.ExitError); ok {
			code = e.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != wantExit {
			t.Errorf("kvrouterd probe %s: exit %d, want %d\n%s", path, code, wantExit, out)
		}
	}
	f("/healthz", 0)
	f("/readyz", 1)
}

// hasVersionVar says whether package main of cmd/kvrouterd declares a package-level version,
// the variable build.sh's -X sets (the linker ignores -X of a variable that does not exist).
func hasVersionVar(t *testing.T) bool {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), filepath.Join(root, "cmd", "kvrouterd"), func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range pkgs["main"].Files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					if n.Name == "version" {
						return true
					}
				}
			}
		}
	}
	return false
}

// TestOnlyTestsUseYAML: the YAML library is the tests' and the policy-class file's alone: of
// the daemon's own packages only router imports it (Dynamo's --router-policy-config is YAML),
// and the deploy package itself has no code to import anything.
func TestOnlyTestsUseYAML(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "../cmd/kvrouterd").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 50 {
		t.Fatalf("go list -deps ../cmd/kvrouterd: %d packages, expected the daemon's hundreds", len(lines))
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if strings.Contains(f[0], "yaml") {
			continue // the library itself
		}
		for _, imp := range f[1:] {
			if strings.Contains(imp, "yaml") && f[0] != "github.com/kvrouterd/kvrouterd/router" {
				t.Errorf("%s imports %s: only router's policy-class file may", f[0], imp)
			}
		}
	}
	out, err = exec.Command(gobin, "list", "-f", "{{join .Imports \" \"}}", ".").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("package deploy imports %q (%v): it holds tests only", out, err)
	}
}
