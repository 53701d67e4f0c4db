package mocker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvrouterd/kvrouterd/bench/mocker"
	"github.com/kvrouterd/kvrouterd/frontdoor"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/server"
)

// fdbWorkers, fdbMaxTokens and fdbSpeedup are the conditions docs/performance.md quotes.
const (
	fdbWorkers   = 2
	fdbMaxTokens = 4
	fdbSpeedup   = 1e9 // the largest Config.Check allows: a request's simulated steps take ≈ 50 ns at most
	fdbModel     = "bench"
)

// BenchmarkFrontDoorMocker: what the front door adds to one request against real mock engines
// over loopback sockets — the client calls a mocker directly, or the front door (served as the
// daemon serves it, server.HTTPServer) which routes to one. Requests go one at a time, so ns/op
// is a request's latency, and the front door's overhead is frontdoor − direct of a pair. The
// mockers run at the highest speedup, so that their simulated step time is negligible and what
// remains of their part is their HTTP handling and engine goroutine; they publish no KV events.
//
//   - chat: a non-streamed /v1/chat/completions; the front door calls a mocker's /tokenize
//     first, routes the ids and forwards the request: three HTTP exchanges instead of one.
//   - chat-ids: the same request with its ids in nvext.token_data, which the front door
//     routes by without /tokenize (the mocker ignores nvext): chat − chat-ids through the
//     front door is the /tokenize round trip.
//   - completion-ids: a non-streamed /v1/completions whose prompt is the same ids.
//
// Sub-benchmarks per prompt length (the chat's ids, ChatML included).
//
//	go test -run '^$' -bench FrontDoorMocker -benchtime 3000x -count 6 ./bench/mocker/
func BenchmarkFrontDoorMocker(b *testing.B) {
	discard := slog.New(slog.DiscardHandler)
	direct := make([]string, fdbWorkers)
	r := router.New(router.Config{BlockSize: 16, Logger: discard})
	b.Cleanup(r.Close)
	for i := range fdbWorkers {
		m := startBenchMocker(b, uint64(i+1))
		direct[i] = m.HTTPEndpoint()
		c := mocker.Defaults()
		if err := r.Register(router.Registration{ID: uint64(i + 1), Model: fdbModel, BlockSize: c.BlockSize,
			Capacity: int64(c.Blocks), MaxTokens: int64(c.MaxBatchedTokens), HTTPEndpoint: m.HTTPEndpoint()}); err != nil {
			b.Fatal(err)
		}
	}
	// As the daemon wires --frontend-addr, with its default retries.
	door := frontdoor.New(r, frontdoor.Config{Logger: discard, Retries: 2})
	srv := server.HTTPServer(door.Handle, server.Config{Logger: discard})
	srv.WriteTimeout = 0
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
	})
	fd := "http://" + ln.Addr().String()
	c := &fasthttp.Client{MaxConnsPerHost: 16}
	b.Cleanup(c.CloseIdleConnections) // first: the servers then have no connection to wait for

	for _, n := range []int{64, 1024} {
		msgs, ids := benchPrompt(n)
		bodies := map[string][]byte{
			"chat":           benchBody(map[string]any{"messages": msgs}),
			"chat-ids":       benchBody(map[string]any{"messages": msgs, "nvext": map[string]any{"token_data": ids}}),
			"completion-ids": benchBody(map[string]any{"prompt": ids}),
		}
		b.Run(fmt.Sprintf("tokens=%d", len(ids)), func(b *testing.B) {
			for _, kind := range []string{"chat", "chat-ids", "completion-ids"} {
				path := "/v1/chat/completions"
				if kind == "completion-ids" {
					path = "/v1/completions"
				}
				b.Run(kind+"/direct", func(b *testing.B) {
					i := 0
					benchRequests(b, c, func() string { i++; return direct[i%len(direct)] + path }, bodies[kind], len(ids), false)
				})
				b.Run(kind+"/frontdoor", func(b *testing.B) {
					benchRequests(b, c, func() string { return fd + path }, bodies[kind], len(ids), true)
				})
			}
		})
	}
}

// benchRequests posts body to url() once per iteration, one request at a time, after a few
// untimed ones that open the connections and check the answer: the whole prompt seen, every
// output token generated, and through the front door the worker named.
func benchRequests(b *testing.B, c *fasthttp.Client, url func() string, body []byte, prompt int, viaDoor bool) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	do := func() {
		req.SetRequestURI(url())
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
		if err := c.Do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusOK {
			b.Fatalf("%s: %v %d %.300s", req.URI(), err, resp.StatusCode(), resp.Body())
		}
	}
	for range 2 * fdbWorkers {
		do()
		var a struct {
			Usage struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(resp.Body(), &a); err != nil || a.Usage.Prompt != prompt || a.Usage.Completion != fdbMaxTokens {
			b.Fatalf("%s: want %d prompt and %d output tokens, got %v %s", req.URI(), prompt, fdbMaxTokens, err, resp.Body())
		}
		if viaDoor && len(resp.Header.Peek("X-Kvrouterd-Worker")) == 0 {
			b.Fatalf("%s: the answer names no worker: not through the front door", req.URI())
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		do()
	}
}

// startBenchMocker starts a mocker on a loopback port without KV events, at fdbSpeedup.
func startBenchMocker(b *testing.B, id uint64) *mocker.Mocker {
	c := mocker.Defaults()
	c.HTTPAddr, c.KVEventsAddr = "127.0.0.1:0", ""
	c.Model, c.WorkerID, c.Speedup, c.LogLevel = fdbModel, id, fdbSpeedup, "error"
	m, err := mocker.Start(c, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			b.Errorf("mocker %d: shutdown: %v", id, err)
		}
	})
	return m
}

// benchPrompt returns a system and a user message whose chat template's ids (the generation
// prompt included) number at least n, and those ids.
func benchPrompt(n int) ([]mocker.Message, []uint32) {
	words := []string{"the", "router", "sends", "each", "request", "to", "a", "worker", "that", "has",
		"its", "prefix", "cached", "in", "blocks", "of", "tokens", "and", "is", "not", "busy"}
	msgs := []mocker.Message{{Role: "system", Content: "You answer every question about caches in a few words."},
		{Role: "user", Content: "Explain:"}}
	tmpl := mocker.ChatTemplate{AddGenerationPrompt: true}
	for i := 0; ; i++ {
		ids := mocker.AppendChat(nil, msgs, tmpl)
		if len(ids) >= n {
			return msgs, ids
		}
		msgs[1].Content += " " + words[i%len(words)]
	}
}

// benchBody is a request for fdbMaxTokens tokens of fdbModel, with fields.
func benchBody(fields map[string]any) []byte {
	fields["model"], fields["max_tokens"] = fdbModel, fdbMaxTokens
	b, err := json.Marshal(fields)
	if err != nil {
		panic(err)
	}
	return b
}
