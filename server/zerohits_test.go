package server

import (
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestZeroHitWorker: a worker whose engine names its LoRA adapter otherwise than requests do
// holds blocks that no request finds, while requests find another worker's. It is listed as
// misconfigured — /v1/workers' problems, kvrouterd_worker_misconfigured{reason="zero_hits"},
// kvrouterd_worker_unmatched_requests, one error line naming what to fix — and no longer once
// a request finds its blocks. A worker with blocks too few to expect hits, and the worker that
// gets them, are not listed.
func TestZeroHitWorker(t *testing.T) {
	var logMu sync.Mutex
	var logs strings.Builder
	h := newHarnessWith(t, func(c *router.Config) {
		c.HitSample, c.ZeroHits, c.ZeroHitBlocks = 1, 20, 4
		c.Logger = slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	})
	for id := uint64(1); id <= 3; id++ {
		if err := h.c.Register(client.Worker{ID: id, Model: "m", BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	store := func(worker uint64, toks []uint32, lora string) {
		t.Helper()
		hashes := make([]uint64, len(toks)/4)
		for i := range hashes {
			hashes[i] = worker<<32 | uint64(i+1)
		}
		ev := kvevent.Event{Kind: kvevent.Stored, ID: 1, Hashes: hashes, Tokens: toks, BlockSize: 4, LoRA: lora}
		if res, err := h.c.Events(&wire.EventBatch{Worker: worker, Model: "m", Events: []kvevent.Event{ev}}); err != nil || res.OK != 1 {
			t.Fatalf("events of worker %d: %+v, %v", worker, res, err)
		}
	}
	shared, tuned, few := tokens(0, 32), tokens(1000, 32), tokens(2000, 8)
	store(1, shared, "")
	store(2, tuned, "adapter-a") // the engine's name for the adapter
	store(3, few, "")            // 2 blocks: too few to expect a hit
	match := func(toks []uint32, lora string) int {
		t.Helper()
		var resp wire.RouteResponse
		if err := h.c.Match(&wire.RouteRequest{Model: "m", Tokens: toks, LoRA: lora}, &resp); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range resp.Candidates {
			n += int(c.CachedBlocks)
		}
		return n
	}
	for range 25 {
		if match(shared, "") != 8 {
			t.Fatal("a request for worker 1's prompt does not find its 8 blocks")
		}
		if match(tuned, "adapter_a") != 0 { // the gateway's name for it
			t.Fatal("a request naming the adapter otherwise finds blocks")
		}
	}
	type listed struct {
		ID       uint64   `json:"worker_id"`
		Problems []string `json:"problems"`
	}
	problems := func() map[uint64][]string {
		_, body := h.get("/v1/workers")
		var ws struct{ Workers []listed }
		if err := json.Unmarshal([]byte(body), &ws); err != nil {
			t.Fatal(err)
		}
		out := map[uint64][]string{}
		for _, w := range ws.Workers {
			out[w.ID] = w.Problems
		}
		return out
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s", what)
			}
		}
	}
	eventually("worker 2 listed with a zero-hit problem after all 25 requests", func() bool {
		p := problems()[2]
		return len(p) == 1 && strings.HasPrefix(p[0], "zero_hits: none of 25 sampled requests")
	})
	if p := problems(); len(p[1]) != 0 || len(p[3]) != 0 {
		t.Fatalf("problems %v: want none for workers 1 and 3", p)
	}
	_, page := h.get("/metrics")
	for _, want := range []string{
		`kvrouterd_worker_misconfigured{model="m",reason="zero_hits",worker="2"} 1`,
		`kvrouterd_worker_misconfigured{model="m",reason="zero_hits",worker="1"} 0`,
		`kvrouterd_worker_misconfigured{model="m",reason="zero_hits",worker="3"} 0`,
		`kvrouterd_worker_unmatched_requests{model="m",worker="2"} 25`,
		`kvrouterd_worker_unmatched_requests{model="m",worker="3"} 0`,
	} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("/metrics has no line %s", want)
		}
	}
	for range 25 { // more misses: still one log line
		match(shared, "")
	}
	eventually("the misses counted", func() bool {
		_, page := h.get("/metrics")
		return strings.Contains(page, `kvrouterd_worker_unmatched_requests{model="m",worker="2"} 50`+"\n")
	})
	logMu.Lock()
	text := logs.String()
	logMu.Unlock()
	if n := strings.Count(text, "worker misconfigured"); n != 1 || !strings.Contains(text, "worker=2") || !strings.Contains(text, "lora_name") {
		t.Fatalf("%d misconfiguration lines, want one for worker 2 naming lora_name:\n%s", n, text)
	}

	// Requests naming the adapter as the engine does find its blocks: no longer listed.
	if match(tuned, "adapter-a") != 8 {
		t.Fatal("a request naming the adapter as the engine does does not find worker 2's 8 blocks")
	}
	eventually("worker 2's problem gone", func() bool { return len(problems()[2]) == 0 })
	_, page = h.get("/metrics")
	if !strings.Contains(page, `kvrouterd_worker_misconfigured{model="m",reason="zero_hits",worker="2"} 0`+"\n") {
		t.Fatal("worker 2 still misconfigured in /metrics after a hit")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
