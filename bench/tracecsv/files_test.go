package tracecsv

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// outputNow is a summary that says what the output file holds when it is written.
type outputNow string

func (o outputNow) String() string {
	b, err := os.ReadFile(string(o))
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%q written", b)
}

// TestConvertFiles: the output file holds what convert wrote; the summary goes to standard error
// after the flush, also on an error; convert's errors come back prefixed with the input's path,
// the os package's as they are, and then there is no summary.
func TestConvertFiles(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.csv"), filepath.Join(dir, "out.jsonl")
	if err := os.WriteFile(in, []byte("a\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer func(saved *os.File) { os.Stderr = saved }(os.Stderr)
	os.Stderr = stderr

	upper := func(r io.Reader, w io.Writer) (fmt.Stringer, error) {
		b, err := io.ReadAll(r)
		if err != nil {
			return nil, err
		}
		_, err = w.Write([]byte(strings.ToUpper(string(b))))
		return outputNow(out), err
	}
	if err := ConvertFiles(in, out, upper); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "A\nB\n" {
		t.Fatalf("output %q, %v", b, err)
	}

	bad := errors.New("bad row")
	failing := func(r io.Reader, w io.Writer) (fmt.Stringer, error) {
		if _, err := w.Write([]byte("first\n")); err != nil {
			return nil, err
		}
		return outputNow(out), bad
	}
	if err := ConvertFiles(in, out, failing); !errors.Is(err, bad) || err.Error() != in+": bad row" {
		t.Fatalf("error %v", err)
	}

	err = ConvertFiles(filepath.Join(dir, "absent.csv"), out, upper)
	if !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "open ") {
		t.Fatalf("absent input: %v", err)
	}
	err = ConvertFiles(in, filepath.Join(dir, "no", "out.jsonl"), upper)
	if !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "open ") {
		t.Fatalf("output in an absent folder: %v", err)
	}

	b, err := os.ReadFile(stderr.Name())
	if want := "\"A\\nB\\n\" written\n\"first\\n\" written\n"; err != nil || string(b) != want {
		t.Fatalf("standard error %q, %v; want %q", b, err, want)
	}
}
