package mocker

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/frontdoor"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// bookOrder records the order in which the router books requests (a router.LoadSharer that
// shares nothing).
type bookOrder struct {
	mu  sync.Mutex
	ids []string
}

func (b *bookOrder) Booked(_ string, _ radix.WorkerKey, id string, _ []uint64, _ int64, _ time.Duration) {
	b.mu.Lock()
	b.ids = append(b.ids, strings.Clone(id))
	b.mu.Unlock()
}
func (b *bookOrder) PrefillDone(string)                                          {}
func (b *bookOrder) Completed(string)                                            {}
func (b *bookOrder) SessionBound(string, string, radix.WorkerKey, time.Duration) {}

func (b *bookOrder) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.ids)
}

// TestQueueThroughFrontDoor sends requests through the OpenAI front door to two mock engines
// while both are busy: they wait in the router queue, are admitted in Dynamo's FCFS order with
// priorities (strict priority first, then arrival less the priority jump), and leave nothing
// booked. Each prompt has more uncached tokens than the engine batches per step, so every
// admission makes the worker busy again and the next waits for its first token (the front
// door's prefill done).
func TestQueueThroughFrontDoor(t *testing.T) {
	engine := func() *Mocker {
		return start(t, func(c *Config) {
			c.Speedup = 1
			c.MaxBatchedTokens = 256
			c.Blocks = 2048
			c.LogLevel = "info"
		})
	}
	m, m2 := engine(), engine()
	order := &bookOrder{}
	r := router.New(router.Config{Shards: 1, Share: order, Logger: slog.New(slog.DiscardHandler),
		Queue: &router.QueueConfig{Threshold: 1, Policy: router.FCFS, MaxWait: 30 * time.Second}})
	t.Cleanup(r.Close)
	for i, e := range []*Mocker{m, m2} {
		if err := r.Register(router.Registration{ID: uint64(i + 1), Model: m.cfg.Model, BlockSize: m.cfg.BlockSize, MaxTokens: 256, HTTPEndpoint: e.HTTPEndpoint()}); err != nil {
			t.Fatal(err)
		}
	}
	door := frontdoor.New(r, frontdoor.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go (&fasthttp.Server{Handler: door.Handle}).Serve(ln)
	t.Cleanup(func() { ln.Close() })
	url := "http://" + ln.Addr().String() + "/v1/completions"

	prompt := func(from, n int) string { // n > 1 × 256 uncached tokens booked make the worker busy
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprint(from + i)
		}
		return "[" + strings.Join(ids, ",") + "]"
	}
	send := func(name, nvext string, from, n int, errs chan<- error) {
		body := fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":2%s}`, m.cfg.Model, prompt(from, n), nvext)
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			errs <- fmt.Errorf("%s: %v", name, err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			errs <- fmt.Errorf("%s: %d %s", name, resp.StatusCode, b)
			return
		}
		errs <- nil
	}
	pending := func() int64 {
		st := r.QueueStats(nil)
		if len(st) == 0 {
			return 0
		}
		return st[0].Pending[0] + st[0].Pending[1]
	}
	errs := make(chan error, 8)
	// Each engine is made busy by a booking the test holds (3,000 prompt tokens not
	// prefilled): the others wait however slow the machine, each once the one before waits,
	// and the front door names them in arrival order: <prefix>1, <prefix>2, ...
	var held wire.RouteResponse
	for w := uint64(1); w <= 2; w++ {
		if err := r.Route(&wire.RouteRequest{RequestID: fmt.Sprint("held-", w), Model: m.cfg.Model, Tokens: make([]uint32, 3000),
			HasPinned: true, PinnedWorker: w, Mode: wire.ModeDirect}, &held); err != nil {
			t.Fatal(err)
		}
	}
	reqs := []struct{ name, nvext string }{
		{"low-1", ""},
		{"jump", `,"nvext":{"agent_hints":{"priority":3600}}`}, // an hour ahead of its arrival
		{"low-2", ""},
		{"strict", `,"nvext":{"agent_hints":{"strict_priority":1}}`},
	}
	for i, q := range reqs {
		go send(q.name, q.nvext, 200000+1000*i, 320, errs)
		waitUntil(t, q.name+" queued", func() bool { return pending() == int64(i+1) })
	}
	// Worker 1 frees room: the head goes there and makes it busy again; then worker 2.
	for _, id := range []string{"held-1", "held-2"} {
		if err := r.PrefillDone(id); err != nil {
			t.Fatal(err)
		}
	}
	for range reqs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"held-1", "held-2"} {
		if err := r.Complete(id); err != nil {
			t.Fatal(err)
		}
	}
	ids := order.take()
	if len(ids) != 6 || ids[0] != "held-1" || ids[1] != "held-2" {
		t.Fatalf("booked %v", ids)
	}
	ids = ids[2:]
	// By arrival: low-1 1, jump 2, low-2 3, strict 4. Admitted: strict, jump, low-1, low-2.
	suffix := func(id string) string { return id[len(id)-1:] }
	got := []string{}
	for _, id := range ids {
		got = append(got, suffix(id))
	}
	if want := []string{"4", "2", "1", "3"}; !slices.Equal(got, want) {
		t.Fatalf("booked in arrival positions %v, want %v (strict, jump, low-1, low-2)", got, want)
	}
	if m.Stats().Generated == 0 || m2.Stats().Generated == 0 {
		t.Fatalf("an engine served nothing: %d and %d tokens generated", m.Stats().Generated, m2.Stats().Generated)
	}
	waitUntil(t, "every booking freed", func() bool { return r.Stats().ActiveRequests == 0 })
	st := r.QueueStats(nil)[0]
	if st.Queued != 4 || st.Admitted != 4 || st.Pending != [2]int64{} {
		t.Fatalf("queue stats %+v", st)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
