package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWorkerKeys: the keys file by worker id and by http_endpoint, an id's line winning over
// its endpoint's; bad lines named without their key; a rewritten file reloaded, a broken one
// leaving the keys in force.
func TestWorkerKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("# workers' own keys\n\n7 sk-seven\n  http://10.0.0.5:8000/ sk-by-endpoint  \nhttps://w9:8443 sk-nine\n")
	k, err := loadWorkerKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	f := func(id uint64, endpoint, want string) {
		t.Helper()
		got, ok := k.Lookup(id, endpoint)
		if got != want || ok != (want != "") {
			t.Errorf("Lookup(%d, %q) = %q %v, want %q", id, endpoint, got, ok, want)
		}
	}
	f(7, "http://10.0.0.5:8000", "sk-seven") // the id wins
	f(8, "http://10.0.0.5:8000", "sk-by-endpoint")
	f(8, "http://10.0.0.5:8000/", "sk-by-endpoint")
	f(9, "https://w9:8443", "sk-nine")
	f(10, "http://w10:8000", "")
	if k.Len() != 3 {
		t.Errorf("Len %d, want 3", k.Len())
	}

	for _, bad := range []string{"7\n", "7 sk-a sk-b\n", "tcp://w:1 sk-secret\n", "w1:8000 sk-secret\n", "7 sk-a\n007 sk-secret\n", "7 sk-\x7fsecret\n"} {
		_, err := parseWorkerKeys([]byte(bad))
		if !errors.Is(err, errKeysFile) || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q: %v, want an error naming the line", bad, err)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error quotes the key: %v", bad, err)
		}
	}
	if _, err := parseWorkerKeys(nil); err != nil {
		t.Errorf("an empty file: %v", err)
	}

	// A rewrite (another size, a later time) is reloaded; a broken one keeps the keys.
	write("7 sk-seven-renewed\n")
	later := time.Now().Add(time.Minute)
	os.Chtimes(path, later, later)
	if changed, err := k.Reload(); !changed || err != nil {
		t.Fatalf("Reload: %v %v", changed, err)
	}
	f(7, "", "sk-seven-renewed")
	f(8, "http://10.0.0.5:8000", "")
	write("7\n")
	os.Chtimes(path, later.Add(time.Minute), later.Add(time.Minute))
	if _, err := k.Reload(); err == nil {
		t.Fatal("a broken file reloaded")
	}
	f(7, "", "sk-seven-renewed")
}
