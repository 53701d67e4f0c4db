// Command testsum runs `go test` so that a skipped test is never silent: it runs the go test
// command line it is given with -json, prints what go test prints without -v (each package's
// ok or FAIL line, build errors, and the whole output of every test that fails), and appends
// each test that skipped, with the reason it gave, to the file of --skips. `testsum --summary
// FILE` then prints those skips as one short block, each test once with the passes it skipped
// in. `make test` runs its three passes through it and ends with the block.
//
//	testsum --skips bench/out/test-skips.txt go test -race -count=1 ./...
//	testsum --summary bench/out/test-skips.txt
//
// Its exit status is go test's.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
)

func main() {
	skips := flag.String("skips", "", "file the skipped tests are appended to (created if missing)")
	summary := flag.String("summary", "", "print the skipped tests of this file as one block, and exit")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: testsum --skips FILE go test [flags] [packages]\n       testsum --summary FILE")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *summary != "" {
		b, err := os.ReadFile(*summary)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fatal(err)
		}
		writeSummary(os.Stdout, parseRecords(string(b)))
		return
	}
	args := flag.Args()
	if len(args) < 2 || args[1] != "test" {
		flag.Usage()
		os.Exit(2)
	}
	cmd := exec.Command(args[0], append([]string{"test", "-json"}, args[2:]...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fatal(err)
	}
	if err := cmd.Start(); err != nil {
		fatal(err)
	}
	f := newFilter(os.Stdout, passLabel(args[2:]))
	if err := f.copy(out); err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
	}
	werr := cmd.Wait()
	if *skips != "" && len(f.skipped) > 0 {
		sf, err := os.OpenFile(*skips, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			fatal(err)
		}
		for _, r := range f.skipped {
			fmt.Fprintf(sf, "%s\t%s\t%s\t%s\n", r.pass, r.pkg, r.test, r.reason)
		}
		if err := sf.Close(); err != nil {
			fatal(err)
		}
	}
	var ee *exec.ExitError
	switch {
	case errors.As(werr, &ee):
		os.Exit(ee.ExitCode())
	case werr != nil:
		fatal(werr)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "testsum:", err)
	os.Exit(2)
}

// passLabel names a pass by its flags other than -count: "-race", "-tags invariants"; a pass
// with no other flag is "plain".
func passLabel(args []string) string {
	var l []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			break
		}
		if strings.HasPrefix(a, "-count") {
			continue
		}
		l = append(l, a)
		if !strings.Contains(a, "=") && (a == "-tags" || a == "-run" || a == "-timeout") && i+1 < len(args) {
			i++
			l = append(l, args[i])
		}
	}
	if len(l) == 0 {
		return "plain"
	}
	return strings.Join(l, " ")
}

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// record is one skipped test.
type record struct{ pass, pkg, test, reason string }

// filter turns go test -json's events into go test's plain output. Not safe for concurrent use.
type filter struct {
	w       io.Writer
	pass    string
	running map[string][]string // package + "\x00" + test: its output so far
	skipped []record
}

func newFilter(w io.Writer, pass string) *filter {
	return &filter{w: w, pass: pass, running: map[string][]string{}}
}

func (f *filter) copy(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			// Not an event (go test printed it itself): pass it on.
			fmt.Fprintln(f.w, sc.Text())
			continue
		}
		f.event(e)
	}
	return sc.Err()
}

func (f *filter) event(e event) {
	key := e.Package + "\x00" + e.Test
	switch {
	case e.Action == "build-output":
		io.WriteString(f.w, e.Output)
	case e.Test == "":
		switch e.Action {
		case "output":
			if strings.HasPrefix(e.Output, "FAIL") {
				f.flushPackage(e.Package)
			}
			if e.Output != "PASS\n" {
				io.WriteString(f.w, e.Output)
			}
		case "fail":
			f.flushPackage(e.Package)
		}
	case e.Action == "run":
		f.running[key] = nil
	case e.Action == "output":
		if !strings.HasPrefix(e.Output, "=== ") {
			f.running[key] = append(f.running[key], e.Output)
		}
	case e.Action == "pass":
		delete(f.running, key)
	case e.Action == "fail":
		f.flush(key)
	case e.Action == "skip":
		f.skipped = append(f.skipped, record{f.pass, e.Package, e.Test, reason(f.running[key])})
		delete(f.running, key)
	}
}

// flushPackage prints what the tests of pkg still running printed: a test that was running when
// its package failed (a panic, a timeout) shows its output.
func (f *filter) flushPackage(pkg string) {
	for _, k := range slices.Sorted(maps.Keys(f.running)) {
		if strings.HasPrefix(k, pkg+"\x00") {
			f.flush(k)
		}
	}
}

func (f *filter) flush(key string) {
	for _, l := range f.running[key] {
		io.WriteString(f.w, l)
	}
	delete(f.running, key)
}

// reason is what a skipped test printed, without the --- SKIP line and the file:line prefix of
// each message, on one line.
func reason(lines []string) string {
	var r []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		if i := strings.Index(l, ".go:"); i > 0 && !strings.ContainsAny(l[:i], " \t") {
			if j := strings.Index(l[i:], ": "); j > 0 {
				l = l[i+j+2:]
			}
		}
		r = append(r, l)
	}
	if len(r) == 0 {
		return "(no reason given)"
	}
	return strings.Join(r, "; ")
}

func parseRecords(s string) []record {
	var rs []record
	for _, l := range strings.Split(s, "\n") {
		p := strings.SplitN(l, "\t", 4)
		if len(p) == 4 {
			rs = append(rs, record{p[0], p[1], p[2], p[3]})
		}
	}
	return rs
}

// writeSummary prints the skipped tests, each once, grouped by the reason they gave and the
// passes they skipped in (named when not all of them).
func writeSummary(w io.Writer, rs []record) {
	var allPasses []string
	passes := map[string][]string{} // package + " " + test + "\x00" + reason: its passes
	for _, r := range rs {
		if !slices.Contains(allPasses, r.pass) {
			allPasses = append(allPasses, r.pass)
		}
		k := shortPkg(r.pkg) + " " + r.test + "\x00" + r.reason
		if !slices.Contains(passes[k], r.pass) {
			passes[k] = append(passes[k], r.pass)
		}
	}
	if len(passes) == 0 {
		fmt.Fprintln(w, "no test skipped")
		return
	}
	groups := map[string][]string{} // "[passes] " + reason: its tests
	for _, k := range slices.Sorted(maps.Keys(passes)) {
		test, reason, _ := strings.Cut(k, "\x00")
		if p := passes[k]; len(p) < len(allPasses) {
			reason = "[" + strings.Join(p, ", ") + "] " + reason
		}
		groups[reason] = append(groups[reason], test)
	}
	noun := "tests"
	if len(passes) == 1 {
		noun = "test"
	}
	fmt.Fprintf(w, "%d %s skipped (go test -v -run NAME ./PACKAGE shows one):\n", len(passes), noun)
	for _, reason := range slices.Sorted(maps.Keys(groups)) {
		fmt.Fprintf(w, "  %s: %s\n", strings.Join(groups[reason], ", "), reason)
	}
}

// shortPkg is a package path without the module's prefix.
func shortPkg(p string) string {
	const module = "github.com/kvrouterd/kvrouterd/"
	if rest, ok := strings.CutPrefix(p, module); ok {
		return rest
	}
	return p
}
