package main

import (
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readyz is one answer of d's /readyz; code 0 when nothing answers.
func readyz(d *proc) (int, string) {
	resp, err := http.Get("http://" + d.addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// awaitReadyz polls /readyz until ok accepts an answer, and returns it.
func awaitReadyz(t *testing.T, d *proc, what string, ok func(code int, body string) bool) (int, string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := readyz(d)
		if ok(code, body) {
			return code, body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: /readyz still answers %d %q\n%s", what, code, body, d.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mountTmpfs mounts a tmpfs of size (mount's syntax: "32m") on a new directory, unmounted when
// the test ends. It skips the test where mounting is not allowed (not root, not Linux).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	mount(t, dir, "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir)
	return dir
}

// mount runs mount(8) with args, over dir, unmounted when the test ends; it skips the test if
// mounting is not allowed.
func mount(t *testing.T, dir string, args ...string) {
	t.Helper()
	if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
		t.Skipf("cannot mount (needs root on Linux): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
}

// TestReadyzCatchingUp restarts a daemon while the stream gained many events: /readyz answers
// 200 only once the index holds every one of them, so the first 200 comes with the whole index;
// before it, the only reason given is the replay.
func TestReadyzCatchingUp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	ns, pub, ref := testStream(t)
	bin, dir := buildDaemon(t), t.TempDir()
	args := []string{"--nats-url", ns.ClientURL(), "--data-dir", dir, "--snapshot-interval", "0"}
	d := startDaemon(t, bin, args...) // creates the stream
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := exited(t, d); err != nil {
		t.Fatalf("%v\n%s", err, d.log())
	}
	g := &streamGen{r: rand.New(rand.NewPCG(9, 10)), next: map[uint64]uint64{}, held: map[uint64][]uint64{}}
	const batches = 20000
	for i := range batches {
		b := g.batch(8)
		if _, err := pub.BatchAsync(b); err != nil {
			t.Fatal(err)
		}
		if err := ref.Ingest(b.Worker, b.Model, b.Events); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 || i == batches-1 {
			select {
			case <-pub.PublishAsyncComplete():
			case <-time.After(30 * time.Second):
				t.Fatal("publishing did not complete")
			}
		}
	}
	ref.Flush()
	want, err := state(inProcessGet(ref))
	if err != nil {
		t.Fatal(err)
	}
	d = launchDaemon(t, bin, args...)
	defer func() { d.cmd.Process.Kill(); d.cmd.Wait() }()
	var reasons []string
	awaitReadyz(t, d, "never ready", func(code int, body string) bool {
		if code == http.StatusServiceUnavailable {
			reasons = append(reasons, body)
		}
		return code == http.StatusOK
	})
	got, err := state(httpGet(d.addr))
	if err != nil || got != want {
		t.Fatalf("ready with an index not caught up (err %v):\n%.2000s\nwant\n%.2000s\n%s", err, got, want, d.log())
	}
	for _, r := range reasons {
		if !strings.HasPrefix(r, "catching up: ") || strings.Count(r, "\n") != 1 {
			t.Fatalf("/readyz gave %q while the index was catching up", r)
		}
	}
	t.Logf("%d answers 503 before ready, the last %q", len(reasons), reasons[max(0, len(reasons)-1):])
	// Ready stays ready on an idle daemon.
	for range 20 {
		if code, body := readyz(d); code != http.StatusOK {
			t.Fatalf("an idle, caught-up daemon answers /readyz %d %q", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReadyzSnapshots makes the daemon's snapshot writes fail (a read-only filesystem mounted
// over the directory where snapshots are built): /readyz turns 503 naming the snapshot failure
// while /healthz stays 200, the repeated failure is logged a few times only, and /readyz is 200
// again after the next snapshot that succeeds.
func TestReadyzSnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	ns, pub, _ := testStream(t)
	dir := t.TempDir()
	bin := buildDaemon(t)
	d := startDaemon(t, bin, "--nats-url", ns.ClientURL(), "--data-dir", dir, "--snapshot-interval", "20ms")
	defer func() { d.cmd.Process.Kill(); d.cmd.Wait() }()
	// Something to write: every snapshot builds a table of chunks.
	g := &streamGen{r: rand.New(rand.NewPCG(11, 12)), next: map[uint64]uint64{}, held: map[uint64][]uint64{}}
	for range 50 {
		if _, err := pub.Batch(t.Context(), g.batch(4)); err != nil {
			t.Fatal(err)
		}
	}
	staging := filepath.Join(dir, "snapshots", "snapshot-staging")
	if _, err := os.Stat(staging); err != nil {
		t.Fatal(err)
	}
	mount(t, staging, "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", staging)
	// (A snapshot begun before the mount fails too, on its missing table.)
	awaitReadyz(t, d, "snapshots failing, and why", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.HasPrefix(body, "snapshots: ") &&
			strings.Contains(body, "read-only file system")
	})
	if resp, err := http.Get("http://" + d.addr + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz while snapshots fail: %v %v", resp, err)
	}
	// Fifty more failures: each one is not a line of its own.
	failures := func() int { return strings.Count(d.log(), `msg="snapshot failed"`) }
	for deadline := time.Now().Add(30 * time.Second); sample(t, scrape(d.addr), "kvrouterd_snapshot_failures_total") < 50; {
		if time.Now().After(deadline) {
			t.Fatalf("snapshots stopped failing:\n%s", d.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := failures(); n > 7 {
		t.Fatalf("%d lines for one repeated snapshot failure:\n%s", n, d.log())
	}
	if out, err := exec.Command("umount", staging).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v %s", err, out)
	}
	awaitReadyz(t, d, "snapshots succeed again", func(code int, _ string) bool { return code == http.StatusOK })
}
