package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// rawEngine is an engine on a raw socket, so that a test says byte by byte what it answers
// and sees when the front door closes its connection: /tokenize answers one token per byte
// of the prompt or the messages' text, /health 200, and a generation request goes to gen,
// which owns the connection from then on (the request is read whole; its body in req).
type rawEngine struct {
	t    *testing.T
	ln   net.Listener
	addr string
	gen  func(c net.Conn, req *http.Request, body []byte)

	mu      sync.Mutex
	seen    []http.Header // the generation requests' headers
	bodies  [][]byte
	tokAuth []string      // the /tokenize calls' Authorization headers
	closed  chan struct{} // one send when a generation connection is closed by the front door
}

func newRawEngine(t *testing.T, gen func(c net.Conn, req *http.Request, body []byte)) *rawEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &rawEngine{t: t, ln: ln, addr: ln.Addr().String(), gen: gen, closed: make(chan struct{}, 1024)}
	go e.serve()
	t.Cleanup(func() { ln.Close() })
	return e
}

func (e *rawEngine) serve() {
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		go e.conn(c)
	}
}

func (e *rawEngine) conn(c net.Conn) {
	rd := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(rd)
		if err != nil {
			c.Close()
			return
		}
		body, _ := io.ReadAll(req.Body)
		switch req.URL.Path {
		case "/tokenize":
			e.mu.Lock()
			e.tokAuth = append(e.tokAuth, req.Header.Get("Authorization"))
			e.mu.Unlock()
			var in struct {
				Prompt   string `json:"prompt"`
				Messages []struct {
					Content string `json:"content"`
				} `json:"messages"`
			}
			_ = json.Unmarshal(body, &in)
			text := in.Prompt
			for _, m := range in.Messages {
				text += m.Content
			}
			toks := make([]int, len(text))
			for i := range text {
				toks[i] = int(text[i])
			}
			b, _ := json.Marshal(map[string]any{"tokens": toks, "count": len(toks), "max_model_len": 4096})
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
		case "/health":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		default:
			e.mu.Lock()
			e.seen = append(e.seen, req.Header.Clone())
			e.bodies = append(e.bodies, body)
			e.mu.Unlock()
			e.gen(&watchedConn{Conn: c, rd: rd, e: e}, req, body)
			return
		}
	}
}

// watchedConn is a generation request's connection: waitClosed blocks until the front door
// closes it, and counts that in closed.
type watchedConn struct {
	net.Conn
	rd *bufio.Reader
	e  *rawEngine
}

func (c *watchedConn) waitClosed() {
	_, _ = io.Copy(io.Discard, c.rd)
	c.Close()
	c.e.closed <- struct{}{}
}

func (e *rawEngine) headers() []http.Header {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]http.Header(nil), e.seen...)
}

// waitCancelled waits until n generation connections have been closed by the front door.
func (e *rawEngine) waitCancelled(t *testing.T, n int, what string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for i := range n {
		select {
		case <-e.closed:
		case <-deadline:
			t.Fatalf("%s: the front door closed %d of %d engine connections (the engine's requests are not cancelled)", what, i, n)
		}
	}
}

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// sseChunk writes one event as one HTTP chunk.
func sseChunk(w io.Writer, data string) {
	ev := "data: " + data + "\n\n"
	fmt.Fprintf(w, "%x\r\n%s\r\n", len(ev), ev)
}

func tokenChunk(i int, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return fmt.Sprintf(`{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"t%d"},"logprobs":null,"finish_reason":%s}]}`, i, f)
}

// frontDaemon starts the built daemon with a front door, registers the engines as workers
// 1, 2, … of model "m" (block size 4), and returns the daemon and the front door's base URL.
func frontDaemon(t *testing.T, extra []string, engines ...*rawEngine) (*proc, string) {
	t.Helper()
	front := freeport.TB(t)
	args := append([]string{"--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--frontend-addr", front}, extra...)
	d := startDaemon(t, buildDaemon(t), args...)
	t.Cleanup(func() { d.cmd.Process.Kill(); d.cmd.Wait() })
	for i, e := range engines {
		daemonCall(t, d.addr, "POST", "/v1/workers",
			fmt.Sprintf(`{"worker_id":%d,"model":"m","block_size":4,"http_endpoint":"http://%s"}`, i+1, e.addr), 201)
	}
	return d, "http://" + front
}

// activeRequests is the requests booked on the daemon's workers.
func activeRequests(t *testing.T, d *proc) int64 {
	t.Helper()
	var ws struct {
		Workers []struct {
			ActiveRequests int64 `json:"active_requests"`
		} `json:"workers"`
	}
	_ = json.Unmarshal([]byte(daemonCall(t, d.addr, "GET", "/v1/workers", "", 200)), &ws)
	var n int64
	for _, w := range ws.Workers {
		n += w.ActiveRequests
	}
	return n
}

func waitNoBookings(t *testing.T, d *proc, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := activeRequests(t, d)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d bookings left", what, n)
		}
	}
}

// postChat posts body to the front door's chat endpoint and reads the answer: its body, and
// the error that ended the reading (nil at a clean end).
func postChat(t *testing.T, front, body string) (*http.Response, []byte, error) {
	t.Helper()
	resp, err := http.Post(front+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b, rerr
}

const hostileChat = `{"model":"m","messages":[{"role":"user","content":"hello there, how are you"}]`

// TestFrontDoorClientLeavesEarly: clients that give up on a slow worker before its first byte
// (streamed or not, the worker silent or past its answer's headers) leave nothing behind: the
// worker's request is cancelled (its connection closed), the booking freed.
func TestFrontDoorClientLeavesEarly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	silent := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) { c.(*watchedConn).waitClosed() })
	headed := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, sseHead)
		c.(*watchedConn).waitClosed()
	})
	for _, c := range []struct {
		name   string
		e      *rawEngine
		stream bool
	}{{"silent worker, streamed", silent, true}, {"silent worker, not streamed", silent, false},
		{"worker past its headers, streamed", headed, true}, {"worker past its headers, not streamed", headed, false}} {
		t.Run(c.name, func(t *testing.T) {
			d, front := frontDaemon(t, nil, c.e)
			const clients = 5
			var wg sync.WaitGroup
			for range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
					defer cancel()
					body := hostileChat + fmt.Sprintf(`,"stream":%v}`, c.stream)
					req, _ := http.NewRequestWithContext(ctx, "POST", front+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					// A connection of its own, closed when the client gives up.
					cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
					if resp, err := cl.Do(req); err == nil {
						if c.stream {
							_, _ = io.Copy(io.Discard, resp.Body)
						}
						resp.Body.Close()
					}
				}()
			}
			wg.Wait()
			c.e.waitCancelled(t, clients, c.name)
			waitNoBookings(t, d, c.name)
			m := daemonCall(t, d.addr, "GET", "/metrics", "", 200)
			if got := metricValue(t, m, "dynamo_frontend_disconnected_clients"); got < clients {
				t.Errorf("dynamo_frontend_disconnected_clients %v, want %d", got, clients)
			}
		})
	}
}

// TestFrontDoorTruncation: a worker's answer that breaks off reaches the client as an error it
// can see, never as a clean end: streamed, an OpenAI error event and a connection ended without
// the stream's last chunk; not streamed, a 502 with an OpenAI error object. So does an answer cut
// by --frontend-timeout.
func TestFrontDoorTruncation(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	reset := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, sseHead)
		sseChunk(c, tokenChunk(0, ""))
		time.Sleep(50 * time.Millisecond)
		if tc, ok := c.(*watchedConn).Conn.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, as a crashed engine's
		}
		c.Close()
	})
	short := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n")
		io.WriteString(c, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`+strings.Repeat("a", 40)+`"`)
		c.Close()
	})
	stall := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, sseHead)
		sseChunk(c, tokenChunk(0, ""))
		c.(*watchedConn).waitClosed()
	})
	d, front := frontDaemon(t, nil, reset, short)
	pin := func(worker int, stream bool) string {
		return hostileChat + fmt.Sprintf(`,"stream":%v,"nvext":{"backend_instance_id":%d}}`, stream, worker)
	}
	streamed := func(t *testing.T, front, body string, want string) {
		t.Helper()
		resp, b, rerr := postChat(t, front, body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		if rerr == nil || !errors.Is(rerr, io.ErrUnexpectedEOF) {
			t.Errorf("the cut stream read to a clean end (%v): %q", rerr, b)
		}
		if !bytes.Contains(b, []byte(`data: {"error":{`)) || !bytes.Contains(b, []byte(want)) || bytes.Contains(b, []byte("[DONE]")) {
			t.Errorf("no error event saying %q: %q", want, b)
		}
	}
	unary := func(t *testing.T, front, body string, status int, want string) {
		t.Helper()
		resp, b, _ := postChat(t, front, body)
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		if resp.StatusCode != status || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error.Message, want) {
			t.Errorf("%d %s, want %d with %q", resp.StatusCode, b, status, want)
		}
	}
	t.Run("reset, streamed", func(t *testing.T) { streamed(t, front, pin(1, true), "broke off after 1 tokens") })
	t.Run("reset, not streamed", func(t *testing.T) { unary(t, front, pin(1, false), 502, "broke off after 1 tokens") })
	t.Run("short Content-Length, not streamed", func(t *testing.T) { unary(t, front, pin(2, false), 502, "broke off") })
	t.Run("short Content-Length, streamed", func(t *testing.T) { unary(t, front, pin(2, true), 502, "broke off") })
	waitNoBookings(t, d, "after the cut answers")
	m := daemonCall(t, d.addr, "GET", "/metrics", "", 200)
	if got := metricValue(t, m, `kvrouterd_frontdoor_streams_total{end="upstream_error"}`); got != 4 {
		t.Errorf("%v cut answers counted, want 4", got)
	}

	td, tfront := frontDaemon(t, []string{"--frontend-timeout", "700ms"}, stall)
	t.Run("timeout, streamed", func(t *testing.T) { streamed(t, tfront, hostileChat+`,"stream":true}`, "--frontend-timeout") })
	t.Run("timeout, not streamed", func(t *testing.T) { unary(t, tfront, hostileChat+`}`, 504, "--frontend-timeout") })
	stall.waitCancelled(t, 2, "past the timeout")
	waitNoBookings(t, td, "after the timeouts")
}

// TestFrontDoorCredentials: kvrouterd's own bearer token never reaches a worker; a worker's
// own API key, given at registration, is sent to it instead.
func TestFrontDoorCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	ok := func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, sseHead)
		sseChunk(c, tokenChunk(0, "stop"))
		sseChunk(c, "[DONE]")
		io.WriteString(c, "0\r\n\r\n")
		c.Close()
	}
	plain, keyed := newRawEngine(t, ok), newRawEngine(t, ok)
	const token = "write-token-0123456789abcdef"
	tokens := t.TempDir() + "/tokens"
	if err := os.WriteFile(tokens, []byte("write "+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	front := freeport.TB(t)
	d := startDaemon(t, buildDaemon(t), "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--frontend-addr", front, "--auth-token-file", tokens)
	defer d.cmd.Process.Kill()
	// call posts body to url with kvrouterd's token, and wants status want.
	call := func(url, body string, want int) {
		t.Helper()
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s: %d %s", url, resp.StatusCode, b)
		}
	}
	api := "http://" + d.addr + "/v1/workers"
	call(api, fmt.Sprintf(`{"worker_id":1,"model":"m","block_size":4,"http_endpoint":"http://%s"}`, plain.addr), 201)
	call(api, fmt.Sprintf(`{"worker_id":2,"model":"m","block_size":4,"http_endpoint":"http://%s","api_key":"engine-secret-2"}`, keyed.addr), 201)
	for w := 1; w <= 2; w++ {
		call("http://"+front+"/v1/chat/completions", hostileChat+fmt.Sprintf(`,"nvext":{"backend_instance_id":%d}}`, w), 200)
	}
	for _, h := range plain.headers() {
		if a := h.Get("Authorization"); a != "" {
			t.Errorf("a worker without a key got Authorization %q", a)
		}
	}
	for _, h := range keyed.headers() {
		if a := h.Get("Authorization"); a != "Bearer engine-secret-2" {
			t.Errorf("the keyed worker got Authorization %q, want its own key", a)
		}
	}
	for e, want := range map[*rawEngine]string{plain: "", keyed: "Bearer engine-secret-2"} {
		e.mu.Lock()
		for _, a := range e.tokAuth {
			if a != want {
				t.Errorf("a /tokenize call carried Authorization %q, want %q", a, want)
			}
		}
		e.mu.Unlock()
	}
	if l := d.log(); strings.Contains(l, token) || strings.Contains(l, "engine-secret-2") {
		t.Error("a credential is in the log")
	}
}

// TestFrontDoorAnswers: GET /v1/models/{id}; a non-streamed answer with its Content-Length;
// the engine's end-to-end headers passed on and its hop-by-hop ones not; X-Request-Id echoed
// (or made) on every answer and sent to the engine; Retry-After where a retry makes sense; a
// pinned worker that is not registered refused as the request's fault.
func TestFrontDoorAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	e := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"+
			"X-Engine-Trace: abc\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\n\r\n")
		sseChunk(c, tokenChunk(0, "stop"))
		sseChunk(c, "[DONE]")
		io.WriteString(c, "0\r\n\r\n")
	})
	d, front := frontDaemon(t, nil, e)
	daemonCall(t, d.addr, "POST", "/v1/workers", `{"worker_id":9,"model":"bare","block_size":4}`, 201)
	do := func(method, path, body string, hdr ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, front+path, strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	if resp, b := do("GET", "/v1/models/m", ""); resp.StatusCode != 200 || !strings.Contains(b, `"id":"m"`) || !strings.Contains(b, `"object":"model"`) {
		t.Errorf("/v1/models/m: %d %s", resp.StatusCode, b)
	}
	if resp, b := do("GET", "/v1/models/nope", ""); resp.StatusCode != 404 || !strings.Contains(b, `"code":"model_not_found"`) {
		t.Errorf("/v1/models/nope: %d %s", resp.StatusCode, b)
	}
	resp, b := do("POST", "/v1/chat/completions", hostileChat+`}`, "X-Request-Id", "client-id-42")
	if resp.StatusCode != 200 || resp.ContentLength != int64(len(b)) || len(resp.TransferEncoding) != 0 || !strings.Contains(b, `"content":"t0"`) {
		t.Errorf("not streamed: %d, length %d, %v: %s", resp.StatusCode, resp.ContentLength, resp.TransferEncoding, b)
	}
	if resp.Header.Get("X-Engine-Trace") != "abc" || resp.Header.Get("Keep-Alive") != "" || resp.Header.Get("Proxy-Authenticate") != "" {
		t.Errorf("headers passed on: %v", resp.Header)
	}
	if got := resp.Header.Get("X-Request-Id"); got != "client-id-42" {
		t.Errorf("X-Request-Id %q, want the client's", got)
	}
	if hs := e.headers(); len(hs) == 0 || hs[len(hs)-1].Get("X-Request-Id") != "client-id-42" {
		t.Errorf("the engine did not get the request id")
	}
	resp, b = do("POST", "/v1/chat/completions", `{"model":"bare","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "kvr-") {
		t.Errorf("no HTTP worker: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	resp, b = do("POST", "/v1/chat/completions", hostileChat+`,"nvext":{"backend_instance_id":77}}`, "X-Request-Id", "pinned-id-7")
	if resp.StatusCode != 400 || !strings.Contains(b, `"param":"nvext.backend_instance_id"`) {
		t.Errorf("unknown pinned worker: %d %s", resp.StatusCode, b)
	}
	// The refusal's log line names the request.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(d.log(), "request_id=pinned-id-7"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line with the request's id:\n%s", d.log())
		}
	}
}

// TestFrontDoorPrefillAtFirstToken: a request that is not streamed counts as prefilling only
// until its first token, not for its whole generation.
func TestFrontDoorPrefillAtFirstToken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	release := make(chan struct{})
	e := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead)
		sseChunk(c, tokenChunk(0, ""))
		<-release
		sseChunk(c, tokenChunk(1, "length"))
		sseChunk(c, "[DONE]")
		io.WriteString(c, "0\r\n\r\n")
	})
	d, front := frontDaemon(t, nil, e)
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(front+"/v1/chat/completions", "application/json", strings.NewReader(hostileChat+`}`))
		if err != nil {
			done <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	var ws struct {
		Workers []struct {
			ActiveRequests int64 `json:"active_requests"`
			ActivePrefill  int64 `json:"active_prefill_tokens"`
		} `json:"workers"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_ = json.Unmarshal([]byte(daemonCall(t, d.addr, "GET", "/v1/workers", "", 200)), &ws)
		if len(ws.Workers) == 1 && ws.Workers[0].ActiveRequests == 1 && ws.Workers[0].ActivePrefill == 0 {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("after the first token, mid-generation: %+v (still counted as prefilling)", ws.Workers)
		}
	}
	close(release)
	if s := <-done; s != 200 {
		t.Fatalf("status %d", s)
	}
	waitNoBookings(t, d, "after the answer")
}

// workerHealth is worker id's rank 0's standing with the outlier ejection, from /v1/workers.
func workerHealth(t *testing.T, d *proc, id uint64) string {
	t.Helper()
	var ws struct {
		Workers []struct {
			ID     uint64 `json:"worker_id"`
			Health string `json:"health"`
		} `json:"workers"`
	}
	_ = json.Unmarshal([]byte(daemonCall(t, d.addr, "GET", "/v1/workers", "", 200)), &ws)
	for _, w := range ws.Workers {
		if w.ID == id {
			return w.Health
		}
	}
	return ""
}

func waitHealth(t *testing.T, d *proc, id uint64, what string, ok func(string) bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		h := workerHealth(t, d, id)
		if ok(h) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: worker %d's health %q", what, id, h)
		}
	}
}

// TestFrontDoorEjection: a worker that refuses connections, resets them or answers 5xx is taken
// out of routing — fresh requests, which it would win on ties with its empty cache, go to the
// healthy worker, spread by the cost and not tried on it first — and brought back by its
// /health once it is up.
func TestFrontDoorEjection(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	answer := func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead)
		sseChunk(c, tokenChunk(0, "stop"))
		sseChunk(c, "[DONE]")
		io.WriteString(c, "0\r\n\r\n")
	}
	var mu sync.Mutex
	broken := true
	flaky := func(fail func(c net.Conn)) func(c net.Conn, r *http.Request, b []byte) {
		return func(c net.Conn, r *http.Request, b []byte) {
			mu.Lock()
			f := broken
			mu.Unlock()
			if f {
				fail(c)
				return
			}
			answer(c, r, b)
		}
	}
	for _, kind := range []string{"refused", "reset", "5xx"} {
		t.Run(kind, func(t *testing.T) {
			mu.Lock()
			broken = true
			mu.Unlock()
			up := newRawEngine(t, answer)
			var bad *rawEngine
			switch kind {
			case "refused":
				bad = newRawEngine(t, answer)
				bad.ln.Close() // nothing listens: connections are refused
			case "reset":
				bad = newRawEngine(t, flaky(func(c net.Conn) {
					c.(*watchedConn).Conn.(*net.TCPConn).SetLinger(0)
					c.Close()
				}))
			case "5xx":
				bad = newRawEngine(t, flaky(func(c net.Conn) {
					io.WriteString(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n"+
						`{"error":{"message":"engine is broken"}}`)
					c.Close()
				}))
			}
			d, front := frontDaemon(t, []string{"--worker-eject-base-time", "1s"}, bad, up)
			// Fresh prompts: both workers hold nothing, so every one is a tie.
			for i := range 12 {
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"fresh prompt number %d, long enough for blocks"}]}`, i)
				resp, b, _ := postChat(t, front, body)
				if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouterd-Worker") != "2" {
					t.Fatalf("request %d: %d from worker %q: %s", i, resp.StatusCode, resp.Header.Get("X-Kvrouterd-Worker"), b)
				}
			}
			// One failure makes it suspect: it loses every tie, so no fresh request tries it
			// again; a refused connection ejects it at once.
			m := daemonCall(t, d.addr, "GET", "/metrics", "", 200)
			if got := metricValue(t, m, "kvrouterd_frontdoor_migrations_total"); got > 1 {
				t.Errorf("%v requests tried the %s worker first, want at most one", got, kind)
			}
			if kind != "refused" {
				if h := workerHealth(t, d, 1); h != "suspect" && h != "ejected" {
					t.Fatalf("the %s worker's health %q after failing, want suspect", kind, h)
				}
				// Requests pinned to it fail; three failures in a row eject it.
				for range 3 {
					resp, _, _ := postChat(t, front, hostileChat+`,"nvext":{"backend_instance_id":1}}`)
					if resp.StatusCode < 500 {
						t.Fatalf("pinned to the %s worker: %d", kind, resp.StatusCode)
					}
				}
			}
			if h := workerHealth(t, d, 1); h != "ejected" {
				t.Fatalf("the %s worker's health %q, want ejected", kind, h)
			}
			// Back up: its /health brings it back once the ejection's second is over.
			mu.Lock()
			broken = false
			mu.Unlock()
			if kind == "refused" {
				ln, err := net.Listen("tcp", bad.addr)
				if err != nil {
					t.Skipf("the port could not be taken again: %v", err)
				}
				back := &rawEngine{t: t, ln: ln, addr: bad.addr, gen: answer, closed: make(chan struct{}, 16)}
				go back.serve()
				t.Cleanup(func() { ln.Close() })
			}
			waitHealth(t, d, 1, "after its /health answers", func(h string) bool { return h != "ejected" })
			if resp, b, _ := postChat(t, front, hostileChat+`,"nvext":{"backend_instance_id":1}}`); resp.StatusCode != 200 {
				t.Fatalf("back in routing: %d %s", resp.StatusCode, b)
			}
			waitHealth(t, d, 1, "after it answered", func(h string) bool { return h == "ok" })
		})
	}
}

// TestFrontDoorQueueFull: a request that finds the router queue full gets 429 with Retry-After
// and a message about the queue, not about a field of the request.
func TestFrontDoorQueueFull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	silent := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) { c.(*watchedConn).waitClosed() })
	d, front := frontDaemon(t, []string{"--router-queue-threshold", "0.5", "--router-queue-max-requests", "1"})
	daemonCall(t, d.addr, "POST", "/v1/workers",
		fmt.Sprintf(`{"worker_id":1,"model":"m","block_size":4,"max_batched_tokens":16,"http_endpoint":"http://%s"}`, silent.addr), 201)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	post := func(ctx context.Context) (*http.Response, []byte, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", front+"/v1/chat/completions", strings.NewReader(hostileChat+`}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	// The first holds the worker (its prefill never ends), the second waits in the queue.
	for range 2 {
		go post(ctx)
		time.Sleep(300 * time.Millisecond)
	}
	tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
	defer tcancel()
	resp, b, err := post(tctx)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"code":"queue_full"`) ||
		strings.Contains(string(b), `field \"model\"`) {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
	}
}
