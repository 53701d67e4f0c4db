package bearer

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	tokW = "w-0123456789abcdef"
	tokR = "r-0123456789abcdef"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, "# gateways\n"+tokW+"\n\n  read "+tokR+"  \nwrite w2-0123456789abcdef\n")
	tk, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Len() != 3 {
		t.Fatalf("%d tokens, want 3", tk.Len())
	}
	f := func(header string, want Class) {
		t.Helper()
		if got := tk.Check([]byte(header)); got != want {
			t.Errorf("Check(%q) = %v, want %v", header, got, want)
		}
	}
	f("Bearer "+tokW, Write)
	f("bearer "+tokW, Write)
	f("BEARER  "+tokW+" ", Write)
	f("Bearer w2-0123456789abcdef", Write)
	f("Bearer "+tokR, Read)
	f("", None)
	f("Bearer", None)
	f("Bearer ", None)
	f(tokW, None)                         // no scheme
	f("Basic "+tokW, None)                // another scheme
	f("Bearer "+tokW[:len(tokW)-1], None) // a prefix of a token
	f("Bearer "+tokW+"x", None)
}

func TestParseErrors(t *testing.T) {
	f := func(text, want string) {
		t.Helper()
		_, err := parse([]byte(text))
		if err == nil || !errors.Is(err, ErrFile) || !strings.Contains(err.Error(), want) {
			t.Errorf("parse(%q) = %v, want an error naming %q", text, err, want)
		}
	}
	f("", "no token")
	f("# only a comment\n\n", "no token")
	f("short", "line 1: a token of 5 bytes: want at least 16")
	f(tokW+"\nadmin "+tokR, `line 2: class "admin"`)
	f("read a b c", "line 1: want [read|write] TOKEN")
	f("read 0123456789abcdef\x01", "not printable ASCII")
}

func TestReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, tokW+"\n")
	tk, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := tk.Reload(); changed || err != nil {
		t.Fatalf("Reload of an unchanged file: %v %v", changed, err)
	}
	// A new token replaces the old; the modification time moves on so that the change shows
	// even within the file system's time granularity.
	write(t, path, "read "+tokR+"\n")
	later := time.Now().Add(2 * time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if changed, err := tk.Reload(); !changed || err != nil {
		t.Fatalf("Reload of a changed file: %v %v", changed, err)
	}
	if tk.Check([]byte("Bearer "+tokW)) != None || tk.Check([]byte("Bearer "+tokR)) != Read {
		t.Fatal("the reloaded tokens are not in force")
	}
	// A broken file keeps the tokens in force.
	write(t, path, "oops\n")
	later = later.Add(2 * time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if changed, err := tk.Reload(); changed || err == nil {
		t.Fatalf("Reload of a broken file: %v %v", changed, err)
	}
	if tk.Check([]byte("Bearer "+tokR)) != Read {
		t.Fatal("a broken file dropped the tokens in force")
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
}

func TestCheckAllocs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, tokW+"\nread "+tokR+"\n")
	tk, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	h := []byte("Bearer " + tokR)
	if n := testing.AllocsPerRun(100, func() { tk.Check(h) }); n != 0 {
		t.Fatalf("Check allocates %v times", n)
	}
}

func BenchmarkTokensCheck(b *testing.B) {
	path := filepath.Join(b.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(tokW+"\nread "+tokR+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	tk, err := Load(path)
	if err != nil {
		b.Fatal(err)
	}
	h := []byte("Bearer " + tokR)
	b.ReportAllocs()
	for b.Loop() {
		tk.Check(h)
	}
}

func TestRefusal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, tokW+"\nread "+tokR+"\n")
	tk, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	f := func(header string, need Class, want int) {
		t.Helper()
		status, msg := tk.Refusal([]byte(header), need)
		if status != want || (status != 0) != strings.Contains(msg, "--auth-token-file") {
			t.Errorf("Refusal(%q, %v) = %d %q, want %d", header, need, status, msg, want)
		}
	}
	f("", None, 0)
	f("", Read, 401)
	f("Bearer nope-0123456789abcdef", Read, 401)
	f("Bearer "+tokR, Read, 0)
	f("Bearer "+tokR, Write, 403)
	f("Bearer "+tokW, Write, 0)
}
