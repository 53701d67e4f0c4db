package tracecsv

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConvertFiles: the output file holds what convert wrote, report runs after the flush,
// convert's errors come back prefixed with the input's path, the os package's as they are.
func TestConvertFiles(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.csv"), filepath.Join(dir, "out.jsonl")
	if err := os.WriteFile(in, []byte("a\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	upper := func(r io.Reader, w io.Writer) error {
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		_, err = w.Write([]byte(strings.ToUpper(string(b))))
		return err
	}
	var reported string
	report := func() {
		b, _ := os.ReadFile(out)
		reported = string(b)
	}
	if err := ConvertFiles(in, out, upper, report); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "A\nB\n" || reported != "A\nB\n" {
		t.Fatalf("output %q, %v; %q when reported", b, err, reported)
	}

	bad := errors.New("bad row")
	failing := func(r io.Reader, w io.Writer) error {
		if _, err := w.Write([]byte("first\n")); err != nil {
			return err
		}
		return bad
	}
	reported = "not yet"
	if err := ConvertFiles(in, out, failing, report); !errors.Is(err, bad) || err.Error() != in+": bad row" {
		t.Fatalf("error %v", err)
	}
	if reported != "first\n" {
		t.Fatalf("reported with %q written, want the rows before the error", reported)
	}

	calls := 0
	count := func() { calls++ }
	err := ConvertFiles(filepath.Join(dir, "absent.csv"), out, upper, count)
	if !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "open ") || calls != 0 {
		t.Fatalf("absent input: %v, %d reports", err, calls)
	}
	err = ConvertFiles(in, filepath.Join(dir, "no", "out.jsonl"), upper, count)
	if !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "open ") || calls != 0 {
		t.Fatalf("output in an absent folder: %v, %d reports", err, calls)
	}
}
