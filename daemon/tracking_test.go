package daemon

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestTrackingFlags: public-xxh3-v1 is the default and has no key; keyed-xxh3-v1 loads its key
// and id; every bad combination refuses the start with Dynamo's message.
func TestTrackingFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(good, bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, make([]byte, 31), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) (*Config, error) {
		t.Helper()
		c := Defaults()
		fs := flag.NewFlagSet("kvrouterd", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.Flags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return &c, c.Check()
	}
	c, err := parse()
	if err != nil || c.RouterTrackingHash != "public-xxh3-v1" {
		t.Fatalf("defaults: %q, %v", c.RouterTrackingHash, err)
	}
	if k, _ := c.trackingKey(); k != nil {
		t.Fatal("public-xxh3-v1 has a key")
	}
	c, err = parse("--router-tracking-hash", "keyed-xxh3-v1", "--router-tracking-key-file", good, "--router-tracking-key-id", "2026-01")
	if err != nil {
		t.Fatal(err)
	}
	if k, err := c.trackingKey(); err != nil || k == nil || k.ID() != "2026-01" {
		t.Fatalf("keyed: %v, %v", k, err)
	}
	f := func(want string, args ...string) {
		t.Helper()
		if _, err := parse(args...); err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
	keyed := "keyed-xxh3-v1"
	f(`router_tracking_hash must be public-xxh3-v1 or keyed-xxh3-v1, got "keyed"`, "--router-tracking-hash", "keyed")
	f("router tracking key options require router_tracking_hash=keyed-xxh3-v1", "--router-tracking-key-file", good)
	f("router tracking key options require router_tracking_hash=keyed-xxh3-v1", "--router-tracking-key-id", "e1")
	f("keyed-xxh3-v1 requires a nonempty router_tracking_key_id", "--router-tracking-hash", keyed, "--router-tracking-key-file", good)
	f("keyed-xxh3-v1 requires a nonempty router_tracking_key_id", "--router-tracking-hash", keyed, "--router-tracking-key-file", good, "--router-tracking-key-id", " e1")
	f("keyed-xxh3-v1 requires router_tracking_key_file", "--router-tracking-hash", keyed, "--router-tracking-key-id", "e1")
	f("router tracking key file must contain exactly 32 raw bytes; found 31", "--router-tracking-hash", keyed, "--router-tracking-key-file", short, "--router-tracking-key-id", "e1")
	missing := filepath.Join(dir, "missing")
	_, err = parse("--router-tracking-hash", keyed, "--router-tracking-key-file", missing, "--router-tracking-key-id", "e1")
	if err == nil || !bytes.HasPrefix([]byte(err.Error()), []byte("failed to read router tracking key file: ")) {
		t.Errorf("missing file: %v", err)
	}
}
