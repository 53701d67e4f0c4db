package main

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// fillDisk writes zeros into a file in dir until its filesystem has no byte left.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, size)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || st.Bavail != 0 {
		free := uint64(st.Bavail) * uint64(st.Bsize)
		t.Fatalf("the disk is not full: %d bytes free, %v", free, err)
	}
}

// smallLog fails the test if d's log grows past limit in a couple of seconds: a repeated
// error must not flood it.
func smallLog(t *testing.T, d *proc, limit int) {
	t.Helper()
	time.Sleep(2 * time.Second)
	if n := len(d.log()); n > limit {
		t.Fatalf("%d bytes of log in the first seconds on a full disk, want at most %d:\n%.4000s", n, limit, d.log())
	}
}

// exited waits, at most 30 s, for d to exit (told to stop, or failing) and returns how it did.
func exited(t *testing.T, d *proc) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-done
		t.Fatalf("still running after 30 s, when it should have exited:\n%.4000s", d.log())
		return nil
	}
}

// TestDiskFull restarts the daemon on a data directory whose filesystem is full. With its event
// stream elsewhere (--nats-url), it starts from the snapshot it has, read-only: it routes from
// the restored index, applies the events that follow, answers /healthz 200 and /readyz 503 with
// the reason, and keeps its log small. With the embedded NATS server, whose stream would live on
// that disk, it exits at once with one line saying why. Even with the free-space check turned
// off, it never hangs: it serves read-only or exits with one line.
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	fs := mountTmpfs(t, "32m")
	ns, pub, ref := testStream(t)
	g := &streamGen{r: rand.New(rand.NewPCG(13, 14)), next: map[uint64]uint64{}, held: map[uint64][]uint64{}}
	publish := func(n int) string {
		t.Helper()
		return publishGen(t, pub, g, ref, n, 4)
	}
	bin, dir := buildDaemon(t), filepath.Join(fs, "data")
	external := []string{"--nats-url", ns.ClientURL(), "--data-dir", dir}

	// A first run with room writes its snapshot at shutdown.
	d := startDaemon(t, bin, append(external, "--min-free-disk", "0")...)
	want := publish(300)
	waitState(t, d, want)
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := exited(t, d); err != nil || !strings.Contains(d.log(), "snapshot written") {
		t.Fatalf("first run: %v\n%s", err, d.log())
	}
	fillDisk(t, fs)
	want = publish(100) // to replay after the restore

	t.Run("read-only", func(t *testing.T) {
		d := launchDaemon(t, bin, external...)
		defer func() { d.cmd.Process.Kill(); d.cmd.Wait() }()
		_, body := awaitReadyz(t, d, "not serving", func(code int, _ string) bool { return code != 0 })
		_, body = awaitReadyz(t, d, "not caught up", func(_ int, body string) bool { return !strings.Contains(body, "catching up") })
		if body != "disk: snapshots are read-only until a restart with room: disk full: "+dir+" has 0.0 MiB free, under --min-free-disk 64.0 MiB\n" {
			t.Fatalf("/readyz on a full disk: %q", body)
		}
		if resp, err := http.Get("http://" + d.addr + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz on a full disk: %v %v", resp, err)
		}
		if !strings.Contains(d.log(), "restored snapshot") {
			t.Fatalf("nothing restored:\n%s", d.log())
		}
		waitState(t, d, want)
		smallLog(t, d, 4<<10)
	})

	t.Run("embedded-nats", func(t *testing.T) {
		d := launchDaemon(t, bin, "--data-dir", dir, "--nats-listen", freeport.TB(t))
		err := exited(t, d)
		if err == nil {
			t.Fatalf("exit status 0 on a full disk:\n%s", d.log())
		}
		lines := strings.Split(strings.TrimSpace(d.log()), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "kvrouterd: disk full: ") {
			t.Fatalf("%v, want exactly one line saying the disk is full:\n%s", err, d.log())
		}
		t.Log(lines[0])
	})

	t.Run("no-free-space-check", func(t *testing.T) {
		// Pebble then opens for writing on a disk with no room: the daemon must still either
		// serve read-only or end with one line, in bounded time.
		d := launchDaemon(t, bin, append(external, "--min-free-disk", "0")...)
		done, waited := make(chan error, 1), make(chan struct{})
		go func() { done <- d.cmd.Wait(); close(waited) }()
		defer func() { d.cmd.Process.Kill(); <-waited }()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case err := <-done:
				lines := strings.Split(strings.TrimSpace(d.log()), "\n")
				last := lines[len(lines)-1]
				if err == nil || !strings.HasPrefix(last, "kvrouterd: ") || strings.Count(d.log(), "kvrouterd: ") != 1 || len(d.log()) > 4<<10 {
					t.Fatalf("exit %v without one clear last line:\n%s", err, d.log())
				}
				t.Logf("exited: %s", last)
				return
			case <-deadline:
				t.Fatalf("neither serving nor exited 30 s after start:\n%.4000s", d.log())
			default:
			}
			if code, body := readyz(d); code == http.StatusServiceUnavailable && strings.HasPrefix(body, "disk: ") {
				t.Logf("serving read-only: %q", body)
				smallLog(t, d, 4<<10)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
