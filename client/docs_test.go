package client_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// exampleRef is the line above a Go snippet in the Markdown that names the Example running it.
var exampleRef = regexp.MustCompile("^`(Example\\w*)` in `([\\w./-]+_test\\.go)` runs this code")

// A snippet is one ```go block of a Markdown file.
type snippet struct {
	file    string   // relative to the module root
	line    int      // of the opening fence
	ref     string   // the last non-blank line before the fence
	code    []string // the block's lines
	printed string   // the first non-blank line after the block, if it starts with "It prints"
}

// TestDocSnippetsAreExamples: every Go snippet in the module's Markdown names, on the line above
// it, an Example with an Output comment, so that go test compiles and runs it; the snippet's
// lines must appear, in order, in that Example's body, and what the text after it says the code
// prints must be in the Output. A snippet edited without its Example fails here.
func TestDocSnippetsAreExamples(t *testing.T) {
	const root = ".."
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module root is not the parent of the client package: %v", err)
	}
	snippets := markdownSnippets(t, root)
	if len(snippets) == 0 {
		t.Fatal("no Go snippet found in the Markdown: is the walk looking in the right place?")
	}
	for _, s := range snippets {
		where := fmt.Sprintf("%s:%d", s.file, s.line)
		m := exampleRef.FindStringSubmatch(s.ref)
		if m == nil {
			t.Errorf("%s: a Go snippet must follow a line \"`ExampleX` in `pkg/example_test.go` runs this code\", "+
				"naming the Example that runs it; the line before it is %q", where, s.ref)
			continue
		}
		name, src := m[1], m[2]
		body, output, err := exampleSource(filepath.Join(root, filepath.FromSlash(src)), name)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if missing, n := notInOrder(s.code, body); missing != "" {
			t.Errorf("%s: snippet line %d, %q, is not in %s (%s), or not after the lines before it: "+
				"change the Example and the snippet together", where, n, missing, name, src)
		}
		for _, quoted := range backquoted(s.printed) {
			if !strings.Contains(output, quoted) {
				t.Errorf("%s: the text says the code prints %q, which %s's Output does not have:\n%s", where, quoted, name, output)
			}
		}
	}
}

// markdownSnippets returns the Go snippets of every Markdown file under root, hidden directories
// left out.
func markdownSnippets(t *testing.T, root string) []snippet {
	t.Helper()
	var out []snippet
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.EqualFold(filepath.Ext(path), ".md") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		out = append(out, parseSnippets(filepath.ToSlash(rel), text)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// parseSnippets returns the ```go blocks of one Markdown file.
func parseSnippets(file string, text []byte) []snippet {
	var (
		out     []snippet
		cur     *snippet // the Go block being read
		inFence bool     // inside any fenced block
		last    string   // the last non-blank line outside fences
		after   *snippet // a block just closed, waiting for the line after it
	)
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence, ok := strings.CutPrefix(trimmed, "```"); ok {
			if !inFence {
				inFence = true
				if lang, _, _ := strings.Cut(strings.TrimSpace(fence), " "); strings.EqualFold(lang, "go") {
					cur = &snippet{file: file, line: n, ref: last}
				}
			} else {
				inFence = false
				if cur != nil {
					out = append(out, *cur)
					after, cur = &out[len(out)-1], nil
				}
				last = ""
			}
			continue
		}
		switch {
		case cur != nil:
			cur.code = append(cur.code, line)
		case inFence || trimmed == "":
		default:
			if after != nil && strings.HasPrefix(trimmed, "It prints") {
				after.printed = trimmed
			}
			after, last = nil, trimmed
		}
	}
	return out
}

// exampleSource returns the source of the body of the Example called name in the file at path,
// and its Output; an Example without an Output comment is compiled but never run, so it is an
// error.
func exampleSource(path, name string) (body, output string, err error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return "", "", err
	}
	for _, ex := range doc.Examples(f) {
		if "Example"+ex.Name != name {
			continue
		}
		if ex.Output == "" && !ex.EmptyOutput {
			return "", "", fmt.Errorf("%s in %s has no Output comment: go test would not run it", name, path)
		}
		from, to := fset.Position(ex.Code.Pos()).Offset, fset.Position(ex.Code.End()).Offset
		return string(src[from:to]), ex.Output, nil
	}
	return "", "", fmt.Errorf("%s has no Example named %s", path, name)
}

// notInOrder returns the first non-blank line of code that is not found in body after the lines
// before it, and its number in the snippet, or "" when all are found. Lines compare with their
// runs of white space made one space, so gofmt's alignment does not matter.
func notInOrder(code []string, body string) (string, int) {
	lines := strings.Split(body, "\n")
	at := 0
	for n, line := range code {
		want := strings.Join(strings.Fields(line), " ")
		if want == "" {
			continue
		}
		for at < len(lines) && strings.Join(strings.Fields(lines[at]), " ") != want {
			at++
		}
		if at == len(lines) {
			return line, n + 1
		}
		at++
	}
	return "", 0
}

// backquoted returns the `…` spans of s.
func backquoted(s string) []string {
	parts := strings.Split(s, "`")
	var out []string
	for i := 1; i+1 < len(parts); i += 2 {
		out = append(out, parts[i])
	}
	return out
}
