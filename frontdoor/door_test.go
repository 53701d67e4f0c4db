package frontdoor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
)

const bs = 4

// engine is a fake OpenAI-compatible engine: /tokenize turns each byte of the text (a chat's
// messages joined as "role:content\n") into a token id, byte + 1; the generation endpoints
// answer with chunks tokens, streamed or not, each released by gate when it is not nil.
type engine struct {
	addr   string
	ln     net.Listener
	chunks int
	gate   chan struct{} // one receive per streamed chunk after the first; nil: no wait
	// mode: "" answers; "500" answers 500; "break" sends one chunk then drops the connection.
	mode     atomic.Value
	received chan []byte // the bodies of generation requests, with their headers' rank
	ranks    chan string
	auth     atomic.Value // the last generation request's Authorization header
}

func startEngine(t testing.TB, chunks int) *engine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{addr: "http://" + ln.Addr().String(), ln: ln, chunks: chunks,
		received: make(chan []byte, 64), ranks: make(chan string, 64)}
	e.mode.Store("")
	s := &fasthttp.Server{Handler: e.handle}
	go s.Serve(ln)
	t.Cleanup(func() { ln.Close() })
	return e
}

func tokenizeText(s string) []uint32 {
	out := make([]uint32, len(s))
	for i := range len(s) {
		out[i] = uint32(s[i]) + 1
	}
	return out
}

func chatText(raw json.RawMessage) string {
	var msgs []struct{ Role, Content string }
	_ = json.Unmarshal(raw, &msgs)
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(m.Role + ":" + m.Content + "\n")
	}
	return b.String()
}

func (e *engine) handle(ctx *fasthttp.RequestCtx) {
	var body map[string]json.RawMessage
	_ = json.Unmarshal(ctx.PostBody(), &body)
	switch string(ctx.Path()) {
	case "/tokenize":
		var text string
		if m, ok := body["messages"]; ok {
			text = chatText(m)
		} else {
			_ = json.Unmarshal(body["prompt"], &text)
		}
		b, _ := json.Marshal(map[string]any{"count": len(text), "max_model_len": 4096, "tokens": tokenizeText(text)})
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
		return
	case "/v1/completions", "/v1/chat/completions":
	default:
		ctx.SetStatusCode(404)
		return
	}
	e.received <- bytes.Clone(ctx.PostBody())
	e.ranks <- string(ctx.Request.Header.Peek("X-Data-Parallel-Rank"))
	e.auth.Store(string(ctx.Request.Header.Peek("Authorization")))
	switch e.mode.Load().(string) {
	case "500":
		ctx.SetStatusCode(500)
		ctx.SetBodyString(`{"error":"engine failed"}`)
		return
	case "break":
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			fmt.Fprintf(c, "%x\r\ndata: {\"chunk\":0}\n\n\r\n", len("data: {\"chunk\":0}\n\n"))
			c.Close()
		})
		return
	}
	var stream bool
	_ = json.Unmarshal(body["stream"], &stream)
	chat := string(ctx.Path()) == "/v1/chat/completions"
	if !stream {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"object":"chat.completion","choices":[{"message":{"content":"done"}}]}`)
		return
	}
	var so struct {
		IncludeUsage bool `json:"include_usage"`
	}
	_ = json.Unmarshal(body["stream_options"], &so)
	ctx.SetContentType("text/event-stream")
	gate, n := e.gate, e.chunks
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		for i := range n {
			if i > 0 && gate != nil {
				<-gate
			}
			fmt.Fprintf(w, "data: %s\n\n", chunkJSON(chat, i, n))
			if w.Flush() != nil {
				return
			}
		}
		if so.IncludeUsage {
			fmt.Fprintf(w, "data: %s\n\n", usageJSON(chat, n))
		}
		w.WriteString("data: [DONE]\n\n")
		w.Flush()
	})
}

// chunkJSON is chunk i of n of an engine's streamed answer, as vLLM writes it: one token
// ("t<i>") a chunk, the last with finish_reason "length".
func chunkJSON(chat bool, i, n int) string {
	finish := "null"
	if i == n-1 {
		finish = `"length"`
	}
	if chat {
		return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"t%d"},"logprobs":null,"finish_reason":%s}]}`, i, finish)
	}
	return fmt.Sprintf(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"t%d","logprobs":null,"finish_reason":%s}]}`, i, finish)
}

// usageJSON is the usage chunk (stream_options.include_usage) of an answer of n tokens.
func usageJSON(chat bool, n int) string {
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	return fmt.Sprintf(`{"id":"x","object":"%s","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d,"total_tokens":%d}}`, object, n, n+7)
}

type fixture struct {
	r    *router.Router
	d    *Door
	reg  *prometheus.Registry
	addr string
}

// newFixture starts a router with one worker per engine (ids 1, 2, …, two ranks each for the
// first) and a front door on a loopback port. The router costs as the daemon's default does
// (scoring.CostTTFT).
func newFixture(t testing.TB, cfg Config, engines ...*engine) *fixture {
	t.Helper()
	r := router.New(router.Config{BlockSize: bs, Shards: 1, Logger: slog.New(slog.DiscardHandler), Cost: scoring.CostTTFT})
	t.Cleanup(r.Close)
	for i, e := range engines {
		g := router.Registration{ID: uint64(i + 1), Model: "m", BlockSize: bs, HTTPEndpoint: e.addr}
		if err := r.Register(g); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Registry = prometheus.NewRegistry()
	d := New(r, cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: d.Handle}
	go s.Serve(ln)
	t.Cleanup(func() { ln.Close() })
	return &fixture{r: r, d: d, reg: cfg.Registry, addr: "http://" + ln.Addr().String()}
}

func (f *fixture) post(t *testing.T, path, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(f.addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// active is the requests booked on the router's workers now.
func (f *fixture) active() int64 {
	var n int64
	for _, w := range f.r.Workers() {
		n += w.ActiveRequests
	}
	return n
}

// waitIdle waits until no request is booked; the test fails if that never happens.
func (f *fixture) waitIdle(t *testing.T, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); f.active() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d requests still booked", what, f.active())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const chatBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there, how are you"}]}`

// TestChatStreams: a streamed chat answer comes back chunk by chunk as the engine sends it,
// the booking's prefill is done at the first chunk and the request complete at the end; the
// engine gets the client's Authorization header.
func TestChatStreams(t *testing.T) {
	e := startEngine(t, 3)
	e.gate = make(chan struct{})
	f := newFixture(t, Config{}, e)
	req, _ := http.NewRequest("POST", f.addr+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer engine-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Kvrouterd-Worker") != "1" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	if p, err := strconv.ParseFloat(resp.Header.Get("X-Kvrouterd-Predicted-Ttft-Ms"), 64); err != nil || !(p > 0) {
		t.Fatalf("X-Kvrouterd-Predicted-Ttft-Ms %q: %v", resp.Header.Get("X-Kvrouterd-Predicted-Ttft-Ms"), err)
	}
	rd := bufio.NewReader(resp.Body)
	line := func() string {
		t.Helper()
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if l != "\n" {
				return l
			}
		}
	}
	if l := line(); l != "data: "+chunkJSON(true, 0, 3)+"\n" {
		t.Fatalf("first chunk %q", l)
	}
	// The first token is out and the next not sent yet: the request is booked, its prefill done.
	var ws []router.WorkerInfo
	for deadline := time.Now().Add(5 * time.Second); ; {
		ws = f.r.Workers()
		if ws[0].ActiveRequests == 1 && ws[0].ActivePrefill == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the first chunk: %+v", ws[0])
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 1; i < 3; i++ {
		e.gate <- struct{}{}
		if l := line(); l != "data: "+chunkJSON(true, i, 3)+"\n" {
			t.Fatalf("chunk %d: %q", i, l)
		}
	}
	if l := line(); l != "data: [DONE]\n" {
		t.Fatalf("end %q", l)
	}
	f.waitIdle(t, "after the answer")
	// The engine got the request as the client sent it, streamed with the usage chunk (which
	// the client, not asking for it, did not get), with the rank the router chose.
	if got := <-e.received; string(got) != `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there, how are you"}],"stream_options":{"include_usage":true}}` {
		t.Errorf("the engine got %s", got)
	}
	if rank := <-e.ranks; rank != "0" {
		t.Errorf("X-Data-Parallel-Rank %q", rank)
	}
	if auth := e.auth.Load(); auth != "Bearer engine-key" {
		t.Errorf("the client's Authorization reached the engine as %q", auth)
	}
}

// TestCompletionIDs: a completion's text prompt goes to the engine as the ids /tokenize gave,
// and a prompt of ids is not tokenized; the answer, not streamed, comes back whole: the
// engine's stream assembled into one JSON answer with its Content-Length.
func TestCompletionIDs(t *testing.T) {
	e := startEngine(t, 3)
	f := newFixture(t, Config{}, e)
	resp := f.post(t, "/v1/completions", `{"model":"m","prompt":"abcd","max_tokens":3}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `{"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":"t0t1t2"}],"created":1,"id":"cmpl-1","model":"m","object":"text_completion","usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`
	if resp.StatusCode != 200 || string(b) != want || resp.ContentLength != int64(len(want)) || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %s (length %d, %q)", resp.StatusCode, b, resp.ContentLength, resp.Header.Get("Content-Type"))
	}
	var sent map[string]any
	_ = json.Unmarshal(<-e.received, &sent)
	if fmt.Sprint(sent["prompt"]) != "[98 99 100 101]" || sent["max_tokens"] != 3.0 {
		t.Errorf("the engine got %v", sent)
	}
	<-e.ranks
	resp = f.post(t, "/v1/completions", `{"model":"m","prompt":[7,8,9,10,11]}`)
	resp.Body.Close()
	if got := <-e.received; string(got) != `{"model":"m","prompt":[7,8,9,10,11],"stream":true,"stream_options":{"include_usage":true}}` {
		t.Errorf("ids forwarded as %s", got)
	}
	f.waitIdle(t, "after the answers")
}

// TestSharedPrefix: once a worker's KV events say it holds the prompt's blocks, a request with
// that prefix is routed to it.
func TestSharedPrefix(t *testing.T) {
	e1, e2 := startEngine(t, 1), startEngine(t, 1)
	f := newFixture(t, Config{}, e1, e2)
	toks := tokenizeText(chatText(json.RawMessage(`[{"role":"user","content":"hello there, how are you"}]`)))
	n := len(toks) / bs
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(100 + i)
	}
	if _, err := f.r.ApplyEvents(&wire.EventBatch{Worker: 2, Model: "m", Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, Hashes: hashes, Tokens: toks[:n*bs]},
	}}, nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		resp := f.post(t, "/v1/chat/completions", chatBody)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if w := resp.Header.Get("X-Kvrouterd-Worker"); w != "2" {
			t.Fatalf("routed to worker %s, want 2 (it holds the prompt)", w)
		}
	}
	f.waitIdle(t, "after the answers")
}

// TestMigration: a worker that refuses the connection or answers 500 before any byte is given
// up and the request sent to another; its booking is freed either way. Without retries the
// client gets 502.
func TestMigration(t *testing.T) {
	down, failing, up := startEngine(t, 1), startEngine(t, 1), startEngine(t, 1)
	down.ln.Close() // refuses connections
	failing.mode.Store("500")
	f := newFixture(t, Config{Retries: 2}, down, failing, up)
	// The router breaks ties among the three at random: a request may go to the working one
	// first. Until one has been sent elsewhere first (each request does so with probability
	// 2/3), every answer must still come from worker 3.
	for i := 0; i < 4 || testutil.ToFloat64(f.d.m.migrations) == 0 && i < 40; i++ {
		resp := f.post(t, "/v1/chat/completions", chatBody)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouterd-Worker") != "3" {
			t.Fatalf("%d from worker %s: %s", resp.StatusCode, resp.Header.Get("X-Kvrouterd-Worker"), b)
		}
	}
	f.waitIdle(t, "after migrations")
	if n := testutil.ToFloat64(f.d.m.migrations); n == 0 {
		t.Error("no migration counted")
	}

	g := newFixture(t, Config{}, failing)
	resp := g.post(t, "/v1/chat/completions", chatBody)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The engine's status and message, in OpenAI's shape.
	if resp.StatusCode != 500 || !strings.Contains(string(b), `"message":"worker 1: engine failed"`) || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("without retries: %d %s", resp.StatusCode, b)
	}
	g.waitIdle(t, "after a failure")
}

// TestReleased: the booking is freed when the client goes away mid-stream, when the worker's
// stream breaks off, and when the request outlives Config.Timeout.
func TestReleased(t *testing.T) {
	t.Run("client gone", func(t *testing.T) {
		e := startEngine(t, 1<<30) // never ends: only the client's leaving can end it
		e.gate = make(chan struct{})
		f := newFixture(t, Config{}, e)
		resp := f.post(t, "/v1/chat/completions", chatBody)
		rd := bufio.NewReader(resp.Body)
		if l, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(l, "data:") {
			t.Fatalf("%q %v", l, err)
		}
		resp.Body.Close() // the client leaves
		// The engine goes on streaming: a write of the front door's finds the client gone.
		stop, fed := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(fed)
			for {
				select {
				case e.gate <- struct{}{}:
				case <-stop:
					return
				}
			}
		}()
		f.waitIdle(t, "the client gone")
		close(stop)
		<-fed
		if testutil.ToFloat64(f.d.m.ended.WithLabelValues("client_gone")) != 1 {
			t.Error("not counted as client_gone")
		}
	})
	t.Run("stream broken", func(t *testing.T) {
		e := startEngine(t, 1)
		e.mode.Store("break")
		f := newFixture(t, Config{}, e)
		resp := f.post(t, "/v1/chat/completions", chatBody)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `{"chunk":0}`) {
			t.Errorf("the chunk sent before the break is lost: %q", b)
		}
		f.waitIdle(t, "the worker's stream broken")
	})
	t.Run("timeout", func(t *testing.T) {
		e := startEngine(t, 2)
		e.gate = make(chan struct{}) // never released: the second chunk never comes
		f := newFixture(t, Config{Timeout: 300 * time.Millisecond}, e)
		resp := f.post(t, "/v1/chat/completions", chatBody)
		io.Copy(io.Discard, resp.Body) // ends when the front door gives up
		resp.Body.Close()
		f.waitIdle(t, "past the timeout")
	})
}

// TestBadInput: OpenAI's error shape, with a message naming the problem.
func TestBadInput(t *testing.T) {
	e := startEngine(t, 1)
	f := newFixture(t, Config{}, e)
	if err := f.r.Register(router.Registration{ID: 9, Model: "bare", BlockSize: bs}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/v1/chat/completions", `{"model":`, 400, "not a JSON object"},
		{"/v1/chat/completions", `{"messages":[]}`, 400, `"param":"model"`},
		{"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "the model `nope` does not exist"},
		{"/v1/chat/completions", `{"model":"bare","messages":[{"role":"user","content":"x"}]}`, 503, "has registered an http_endpoint"},
		{"/v1/chat/completions", `{"model":"m"}`, 400, "messages is required"},
		{"/v1/completions", `{"model":"m","prompt":""}`, 400, "prompt must not be empty"},
		{"/v1/completions", `{"model":"m","prompt":{}}`, 400, "prompt is required"},
		{"/v1/nothing", `{}`, 404, "no endpoint"},
	} {
		resp := f.post(t, c.path, c.body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var shape struct {
			Error struct {
				Message, Type, Code string
			}
		}
		if resp.StatusCode != c.status || json.Unmarshal(b, &shape) != nil || shape.Error.Code == "" || shape.Error.Type == "" ||
			!strings.Contains(string(b), c.want) {
			t.Errorf("%s %s: %d %s, want %d with %q", c.path, c.body, resp.StatusCode, b, c.status, c.want)
		}
	}
	resp, err := http.Get(f.addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"id":"m"`) || strings.Contains(string(b), `"bare"`) {
		t.Errorf("/v1/models: %s", b)
	}
	if f.active() != 0 {
		t.Error("a refused request left a booking")
	}
}

// TestHints: Dynamo's nvext steers the route: backend_instance_id pins the worker, token_data
// is the prompt (no /tokenize), router_config_override sets the weight, and a cache salt (nvext's or vLLM's own cache_salt) matches
// only the blocks stored under it.
func TestHints(t *testing.T) {
	e1, e2 := startEngine(t, 1), startEngine(t, 1)
	f := newFixture(t, Config{}, e1, e2)
	go func() {
		for {
			select {
			case <-e1.received:
			case <-e1.ranks:
			case <-e2.received:
			case <-e2.ranks:
			}
		}
	}()
	worker := func(body string) string {
		t.Helper()
		resp := f.post(t, "/v1/chat/completions", body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", body, resp.StatusCode)
		}
		return resp.Header.Get("X-Kvrouterd-Worker")
	}
	if w := worker(`{"model":"m","messages":[{"role":"user","content":"x"}],"nvext":{"backend_instance_id":2}}`); w != "2" {
		t.Errorf("pinned to 2, routed to %s", w)
	}
	// Worker 2 holds the prompt's blocks under the salt "tenant-a".
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	if _, err := f.r.ApplyEvents(&wire.EventBatch{Worker: 2, Model: "m", Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{50, 51}, Tokens: toks, Salt: "tenant-a"},
	}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"model":"m","messages":[],"nvext":{"token_data":[1,2,3,4,5,6,7,8],"cache_salt":"tenant-a"}}`,
		`{"model":"m","messages":[],"cache_salt":"tenant-a","nvext":{"token_data":[1,2,3,4,5,6,7,8]}}`,
	} {
		if w := worker(body); w != "2" {
			t.Errorf("%s: routed to %s, want 2 (it holds the salted blocks)", body, w)
		}
	}
	// With overlap_score_weight 0 the cache counts for nothing: a tie, which goes to the worker
	// holding fewer blocks, 1.
	if w := worker(`{"model":"m","messages":[],"nvext":{"token_data":[1,2,3,4,5,6,7,8],"cache_salt":"tenant-a","router_config_override":{"overlap_score_weight":0}}}`); w != "1" {
		t.Errorf("weight 0: routed to %s, want 1", w)
	}
	// Without the salt the blocks are not the prompt's: the router sees no cache, and a tie
	// goes to the worker holding fewer blocks, 1.
	if w := worker(`{"model":"m","messages":[],"nvext":{"token_data":[1,2,3,4,5,6,7,8]}}`); w != "1" {
		t.Errorf("unsalted: routed to %s, want 1", w)
	}
	resp := f.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],"nvext":[]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"param":"nvext"`) {
		t.Errorf("nvext not an object: %d %s", resp.StatusCode, b)
	}
	f.waitIdle(t, "after the hinted requests")
}

// TestOverloaded: when the busy thresholds take every worker out, the front door answers 529
// (Config.OverloadStatus) in OpenAI's error shape, and books nothing.
func TestOverloaded(t *testing.T) {
	e := startEngine(t, 1)
	f := newFixture(t, Config{}, e)
	if _, err := f.r.SetBusyThresholds("m", router.Thresholds{HasPrefillTokens: true, PrefillTokens: 1}); err != nil {
		t.Fatal(err)
	}
	var resp wire.RouteResponse
	if err := f.r.Route(&wire.RouteRequest{RequestID: "held", Model: "m", Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}}, &resp); err != nil {
		t.Fatal(err)
	}
	r := f.post(t, "/v1/chat/completions", `{"model":"m","messages":[],"nvext":{"token_data":[11,12,13,14]}}`)
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 529 || !strings.Contains(string(body), `"code":"overloaded"`) || strings.Contains(string(body), `field \"model\"`) ||
		r.Header.Get("Retry-After") != "1" {
		t.Fatalf("%d %s", r.StatusCode, body)
	}
	if n := f.active(); n != 1 {
		t.Fatalf("%d bookings, want the held one", n)
	}
}
