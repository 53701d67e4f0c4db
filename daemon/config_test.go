package daemon

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
)

// TestQueueAndAffinityFlags: the router queue and session affinity are off unless their flags
// are given, and the flags reach the router's configuration; bad values are refused by name.
func TestQueueAndAffinityFlags(t *testing.T) {
	parse := func(args ...string) (*Config, error) {
		c := Defaults()
		fs := flag.NewFlagSet("kvrouterd", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.Flags(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &c, c.Check()
	}
	c, err := parse()
	if err != nil || c.queue() != nil || c.affinity() != nil {
		t.Fatalf("defaults: queue %+v, affinity %+v, %v", c.queue(), c.affinity(), err)
	}
	c, err = parse("--router-queue-threshold", "0", "--router-queue-policy", "wspt", "--router-queue-max-requests", "7",
		"--router-queue-max-wait", "2s", "--router-session-affinity-ttl", "90s", "--router-session-affinity-mode", "soft")
	if err != nil {
		t.Fatal(err)
	}
	if q := c.queue(); q == nil || *q != (router.QueueConfig{Threshold: 0, Policy: router.WSPT, MaxRequests: 7, MaxWait: 2 * time.Second}) {
		t.Fatalf("queue %+v", q)
	}
	if a := c.affinity(); a == nil || *a != (router.AffinityConfig{TTL: 90 * time.Second, Mode: router.AffinitySoft}) {
		t.Fatalf("affinity %+v", a)
	}
	if c, _ := parse("--router-queue-threshold", "none"); c.queue() != nil {
		t.Fatal("none did not leave the queue off")
	}
	for _, bad := range [][]string{
		{"--router-queue-threshold", "-1"},
		{"--router-queue-threshold", "NaN"},
		{"--router-queue-policy", "sjf"},
		{"--router-queue-max-requests", "0"},
		{"--router-queue-max-wait", "0s"},
		{"--router-session-affinity-mode", "sticky"},
		{"--router-session-affinity-ttl", "-1s"},
	} {
		if _, err := parse(bad...); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}
