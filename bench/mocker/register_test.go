package mocker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeRouter is kvrouterd's /v1/workers as the mocker sees it: it answers 503 to the first
// `unavailable` registrations, then what answer says.
type fakeRouter struct {
	mu          sync.Mutex
	unavailable int
	answer      int
	posts       []map[string]any
	deletes     []string
}

func (f *fakeRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/workers":
		var body map[string]any
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &body); err != nil {
			w.WriteHeader(400)
			return
		}
		f.posts = append(f.posts, body)
		if len(f.posts) <= f.unavailable {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(f.answer)
		io.WriteString(w, `{"error":"invalid","message":"block_size 16 differs from the model's 64"}`)
	case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/v1/workers/"):
		f.deletes = append(f.deletes, strings.TrimPrefix(r.URL.Path, "/v1/workers/"))
		w.WriteHeader(204)
	default:
		w.WriteHeader(404)
	}
}

func TestRegister(t *testing.T) {
	f := &fakeRouter{unavailable: 2, answer: 201}
	srv := httptest.NewServer(f)
	defer srv.Close()
	m := start(t, func(c *Config) { c.Register = srv.URL; c.WorkerID = 42; c.Model = "llama" })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.posts) != 3 {
		t.Fatalf("%d registrations, want 3 (two refused with 503)", len(f.posts))
	}
	want := map[string]any{
		"worker_id": 42.0, "model": "llama", "block_size": 16.0, "capacity_blocks": 512.0, "max_batched_tokens": 8192.0,
		"endpoint": m.EventsEndpoint(), "replay_endpoint": m.ReplayEndpoint(), "http_endpoint": m.HTTPEndpoint(),
	}
	got := f.posts[2]
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("registration %v has fields beyond %v", got, want)
	}
	if !strings.HasPrefix(m.EventsEndpoint(), "tcp://127.0.0.1:") || !strings.HasPrefix(m.HTTPEndpoint(), "http://127.0.0.1:") {
		t.Errorf("endpoints %s, %s", m.EventsEndpoint(), m.HTTPEndpoint())
	}
	if len(f.deletes) != 1 || f.deletes[0] != "42" {
		t.Errorf("deletes %v", f.deletes)
	}
}

// TestRegisterRole: a prefill or decode mocker registers its role; one serving both says
// nothing, which kvrouterd takes as both.
func TestRegisterRole(t *testing.T) {
	for _, role := range []string{"prefill", "decode"} {
		f := &fakeRouter{answer: 201}
		srv := httptest.NewServer(f)
		m := start(t, func(c *Config) { c.Register = srv.URL; c.Role = role })
		if err := m.Register(context.Background()); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		if got := f.posts[0]["role"]; got != role {
			t.Errorf("role %v, want %s", got, role)
		}
	}
}

// TestRegisterRefused: a 4xx is final, and Run ends with it rather than serve a worker kvrouterd
// will not route to.
func TestRegisterRefused(t *testing.T) {
	f := &fakeRouter{answer: 400}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := Defaults()
	c.HTTPAddr, c.KVEventsAddr, c.Register = "127.0.0.1:0", "tcp://127.0.0.1:0", srv.URL
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := Run(ctx, c, io.Discard)
	if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "block_size 16 differs") {
		t.Fatalf("Run: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run waited for the context after a refusal")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.deletes) != 0 {
		t.Errorf("deleted %v after a refused registration", f.deletes)
	}
}

// TestAdvertise: endpoints bound on every interface are registered as 127.0.0.1, or as the
// host asked for.
func TestAdvertise(t *testing.T) {
	m := start(t, func(c *Config) { c.HTTPAddr, c.KVEventsAddr, c.ReplayAddr = ":0", "tcp://*:0", "tcp://0.0.0.0:0" })
	for _, e := range []string{m.HTTPEndpoint(), m.EventsEndpoint(), m.ReplayEndpoint()} {
		if !strings.Contains(e, "://127.0.0.1:") {
			t.Errorf("endpoint %s", e)
		}
	}
	m = start(t, func(c *Config) { c.AdvertiseHost = "worker-3.example" })
	if e := m.EventsEndpoint(); !strings.HasPrefix(e, "tcp://worker-3.example:") {
		t.Errorf("endpoint %s", e)
	}
}

func TestConfigCheck(t *testing.T) {
	f := func(set func(*Config), want string) {
		t.Helper()
		c := Defaults()
		set(&c)
		if err := c.Check(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check() = %v, want an error with %q", err, want)
		}
	}
	if c := Defaults(); c.Check() != nil {
		t.Errorf("defaults: %v", c.Check())
	}
	f(func(c *Config) { c.BlockSize = 0 }, "--block-size")
	f(func(c *Config) { c.Speedup = 0 }, "--speedup")
	f(func(c *Config) { c.MaxModelLen = c.Blocks*c.BlockSize + 1 }, "--max-model-len")
	f(func(c *Config) { c.EventsForm = "sglang" }, "--kv-events-form")
	f(func(c *Config) { c.KVEventsAddr = "ipc:///tmp/x" }, "--kv-events-addr")
	f(func(c *Config) { c.KVEventsAddr = ""; c.ReplayAddr = "tcp://127.0.0.1:0" }, "--replay-addr")
	f(func(c *Config) { c.Register = "localhost:8090" }, "--register")
	f(func(c *Config) { c.Register = "http://h:1"; c.KVEventsAddr = "" }, "--register")
	f(func(c *Config) { c.LogLevel = "loud" }, "--log-level")
	f(func(c *Config) { c.Role = "router" }, "--role")
	f(func(c *Config) { c.KVBytesPerToken = 0 }, "--kv-bytes-per-token")
	f(func(c *Config) { c.KVTransferGbps = 0 }, "--kv-transfer-gbps")
	f(func(c *Config) { c.KVTransferLatency = -1 }, "--kv-transfer-latency")
	f(func(c *Config) { c.KVTransferTimeout = 0 }, "--kv-transfer-timeout")
}
