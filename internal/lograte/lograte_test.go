package lograte

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newLogger(buf *bytes.Buffer, c *clock) *slog.Logger {
	h := slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	return slog.New(New(h, Config{Burst: 2, Every: time.Second, TotalBurst: 4, TotalEvery: 100 * time.Millisecond, Now: c.now}))
}

func TestRepeatsAreLimited(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1e9, 0)}
	log := newLogger(&buf, c).With("component", "x")
	for i := range 10 {
		log.Error("flush failed: no space left on device", "i", i)
		log.Info("written", "i", i) // below the level: never limited
	}
	c.add(time.Second)
	log.Error("flush failed: no space left on device", "i", 10)
	got := buf.String()
	f := func(sub string, want int) {
		t.Helper()
		if n := strings.Count(got, sub); n != want {
			t.Fatalf("%d lines with %q, want %d:\n%s", n, sub, want, got)
		}
	}
	f("level=ERROR", 3)
	f("level=INFO", 10)
	f("component=x", 13)
	f(AttrRepeats+"=8", 1)
	f("i=10", 1) // a second later, one more passes
}

func TestTotalCap(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1e9, 0)}
	log := newLogger(&buf, c)
	// A library formatting a new value into each message escapes the per-message limit only.
	for i := range 100 {
		log.Warn(fmt.Sprintf("nats: write of message %d failed: no space left on device%s", i, strings.Repeat(" ", 60)))
	}
	if n := strings.Count(buf.String(), "\n"); n != 4 {
		t.Fatalf("%d lines, want the total burst of 4:\n%s", n, buf.String())
	}
	c.add(100 * time.Millisecond)
	log.Warn("another")
	if !strings.Contains(buf.String(), AttrOthers+"=96") {
		t.Fatalf("the line after the cap does not count the dropped ones:\n%s", buf.String())
	}
}

func TestConcurrent(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
	c := &clock{t: time.Unix(1e9, 0)} // stopped: no refill
	log := slog.New(New(slog.NewTextHandler(w, nil), Config{Now: c.now}))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			l := log.With("g", g)
			for range 1000 {
				l.Error("same failure")
			}
		})
	}
	wg.Wait()
	if n := strings.Count(buf.String(), "\n"); n != 5 {
		t.Fatalf("%d lines from 8000 repeats at one instant, want the burst of 5", n)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
