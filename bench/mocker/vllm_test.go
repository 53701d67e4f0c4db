package mocker

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sse reads a stream's events to its end and returns their data, [DONE] included.
func sse(t *testing.T, r io.Reader) []string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range strings.SplitAfter(string(b), "\n\n") {
		if ev == "" {
			continue
		}
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || !strings.HasSuffix(data, "\n\n") {
			t.Fatalf("event %q in\n%s", ev, b)
		}
		out = append(out, strings.TrimSuffix(data, "\n\n"))
	}
	return out
}

// choice is what TestStop reads of a choice, stop_reason included.
type choice struct {
	Text    *string `json:"text"`
	Message *struct {
		Content string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Role    *string `json:"role"`
		Content *string `json:"content"`
	} `json:"delta"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason"`
}

type stopAnswer struct {
	ID      string   `json:"id"`
	Created int64    `json:"created"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage"`
}

// TestStop: stop strings and stop_token_ids end completions and chats, streamed or not, where
// vLLM's detokenizer would: the answer's text ends before the stop string, finish_reason is
// "stop" and stop_reason the string (or the token id), completion_tokens counts the tokens
// generated, the stopping one included, and the engine generated no more than those. A stream
// sends one event per token, holding back what could be the start of a stop string, and its
// texts add up to the answer's.
func TestStop(t *testing.T) {
	m := start(t, nil)
	msgs := `[{"role":"user","content":"stop early"}]`
	prompts := map[string][]uint32{"/v1/completions": {5, 6, 7, 8}, "/v1/chat/completions": tokenize(t, m, `{"messages":`+msgs+`}`)}
	generated := uint64(0)
	f := func(path string, stream bool, stop string, include bool, wantTokens int, wantText, wantReason string) {
		t.Helper()
		body := `{"prompt":[5,6,7,8]`
		if path == "/v1/chat/completions" {
			body = `{"messages":` + msgs
		}
		body += `,"max_tokens":30,` + stop
		if include {
			body += `,"include_stop_str_in_output":true`
		}
		if stream {
			body += `,"stream":true,"stream_options":{"include_usage":true}`
		}
		body += "}"
		code, b := post(t, m, path, body)
		if code != 200 {
			t.Fatalf("%s %s: %d %s", path, body, code, b)
		}
		generated += uint64(wantTokens)
		var text string
		var last choice
		var u *usage
		if !stream {
			var a stopAnswer
			if err := json.Unmarshal(b, &a); err != nil || len(a.Choices) != 1 {
				t.Fatalf("%s: %v %s", body, err, b)
			}
			last, u = a.Choices[0], a.Usage
			if last.Text != nil {
				text = *last.Text
			} else {
				text = last.Message.Content
			}
		} else {
			events := sse(t, strings.NewReader(string(b)))
			chat := path == "/v1/chat/completions"
			n := len(events) - 2 // the usage event, [DONE]
			if chat {
				n-- // the role's event
			}
			if n != wantTokens || events[len(events)-1] != "[DONE]" {
				t.Fatalf("%s: %d token events, want %d:\n%s", body, n, wantTokens, b)
			}
			for i, ev := range events[:len(events)-1] {
				var a stopAnswer
				if err := json.Unmarshal([]byte(ev), &a); err != nil {
					t.Fatalf("%s: %v", ev, err)
				}
				if i == len(events)-2 {
					if len(a.Choices) != 0 || a.Usage == nil {
						t.Fatalf("usage event %s", ev)
					}
					u = a.Usage
					continue
				}
				c := a.Choices[0]
				if chat && i == 0 {
					if c.Delta.Role == nil {
						t.Fatalf("role event %s", ev)
					}
					continue
				}
				if (c.FinishReason != nil) != (i == len(events)-3) {
					t.Fatalf("event %d of %d: %s", i, len(events), ev)
				}
				if chat {
					text += *c.Delta.Content
				} else {
					text += *c.Text
				}
				last = c
			}
		}
		if text != wantText || *last.FinishReason != map[bool]string{true: "stop", false: "length"}[wantReason != "null"] ||
			string(last.StopReason) != wantReason || u.Completion != wantTokens || u.Prompt != len(prompts[path]) {
			t.Errorf("%s %s: %q, finish %s, stop_reason %s, usage %+v; want %q, %d tokens, stop_reason %s",
				path, body, text, *last.FinishReason, last.StopReason, *u, wantText, wantTokens, wantReason)
		}
		if st := m.Stats(); st.Generated != generated {
			t.Errorf("%s: the engine generated %d tokens, want %d", body, st.Generated, generated)
		}
	}
	for path, prompt := range prompts {
		seed := OutputSeed(prompt)
		words := strings.Fields(expectText(prompt, 30))
		out := strings.Join(words, " ")
		stop := " " + words[5] + " " + words[6] // completed by token 7
		cut := strings.Index(out, stop)
		stopID := OutputToken(seed, 3)
		q := strconv.Quote
		for _, stream := range []bool{false, true} {
			f(path, stream, `"stop":`+q(stop), false, 7, out[:cut], q(stop))
			f(path, stream, `"stop":["no such words",`+q(stop)+`]`, true, 7, out[:cut+len(stop)], q(stop))
			f(path, stream, `"stop":null,"stop_token_ids":[`+fmt.Sprint(stopID)+`]`, false, 4, strings.Join(words[:3], " "), fmt.Sprint(stopID))
			f(path, stream, `"stop":"no such words"`, false, 30, out, "null")
		}
	}
	if st := m.Stats(); st.Aborted != 0 || st.Completed != 16 {
		t.Errorf("stats %+v: a stopped request is a finished one", st)
	}
	code, b := post(t, m, "/v1/completions", `{"prompt":"x","stop":["a",""]}`)
	if code != 400 || !strings.Contains(string(b), "stop cannot contain an empty string.") {
		t.Errorf("an empty stop string: %d %s", code, b)
	}
}

// TestStreamShapes: the events the router assembles an answer from, byte for byte as vLLM
// writes them: a completion's token and last events, and the usage event.
func TestStreamShapes(t *testing.T) {
	m := start(t, nil)
	resp, err := http.Post(m.HTTPEndpoint()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":[1,2],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := sse(t, resp.Body)
	var a stopAnswer
	if len(events) != 4 || json.Unmarshal([]byte(events[0]), &a) != nil {
		t.Fatalf("events %q", events)
	}
	head := fmt.Sprintf(`{"id":%q,"object":"text_completion","created":%d,"model":"kvr-mock","choices":[`, a.ID, a.Created)
	texts := strings.Fields(expectText([]uint32{1, 2}, 2))
	want := []string{
		head + `{"index":0,"text":"` + texts[0] + `","logprobs":null,"finish_reason":null,"stop_reason":null}]}`,
		head + `{"index":0,"text":" ` + texts[1] + `","logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
		head + `],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`,
		"[DONE]",
	}
	for i := range want {
		if events[i] != want[i] {
			t.Errorf("event %d:\n got %s\nwant %s", i, events[i], want[i])
		}
	}
}

// TestErrorShapes: an error answer is compact, a stream's error event spaced as Python's
// json.dumps writes it, both in vLLM's nested shape.
func TestErrorShapes(t *testing.T) {
	e := badRequest("bad \"x\"")
	if got, want := string(e.appendJSON(nil, false)), `{"error":{"message":"bad \"x\"","type":"BadRequestError","param":null,"code":400}}`; got != want {
		t.Errorf("answer %s, want %s", got, want)
	}
	if got, want := string(e.appendJSON(nil, true)), `{"error": {"message": "bad \"x\"", "type": "BadRequestError", "param": null, "code": 400}}`; got != want {
		t.Errorf("event %s, want %s", got, want)
	}
}

// TestStreamErrorEvent: a request the engine refuses once its stream has begun ends with
// vLLM's error event, then [DONE], and no usage.
func TestStreamErrorEvent(t *testing.T) {
	m := start(t, nil)
	r := &request{wake: make(chan struct{}, 1)}
	r.finish(endFailed, errors.New(`the engine said "no"`))
	client, server := net.Pipe() // never seen gone
	defer client.Close()
	defer server.Close()
	var out strings.Builder
	w := bufio.NewWriter(&out)
	g := &generation{chat: true, id: "chatcmpl-1", model: "kvr-mock", output: 3, limit: 3, stream: true, usage: true}
	m.api.stream(w, g, r, server)
	want := `data: {"error": {"message": "the engine said \"no\"", "type": "BadRequestError", "param": null, "code": 400}}` + "\n\ndata: [DONE]\n\n"
	if out.String() != want {
		t.Errorf("stream\n%s\nwant\n%s", out.String(), want)
	}
}

// TestFailRate: with --fail-rate 1 every generate request, streamed or not, is a 500 in vLLM's
// error shape that never reaches the engine, while /tokenize is served; with 0.3, about that
// fraction is.
func TestFailRate(t *testing.T) {
	m := start(t, func(c *Config) { c.FailRate = 1 })
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"x"}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream":true}`},
	} {
		resp, err := http.Post(m.HTTPEndpoint()+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct {
				Type string `json:"type"`
				Code int    `json:"code"`
			} `json:"error"`
		}
		if resp.StatusCode != 500 || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(b, &e) != nil ||
			e.Error.Type != "InternalServerError" || e.Error.Code != 500 {
			t.Errorf("%s %s: %d %s", c.path, c.body, resp.StatusCode, b)
		}
	}
	tokenize(t, m, `{"prompt":"x"}`)
	if st := m.Stats(); st.Submitted != 0 {
		t.Errorf("stats %+v", st)
	}

	m = start(t, func(c *Config) { c.FailRate = 0.3; c.WorkerID = 2 })
	failed := 0
	for range 200 {
		switch code, b := post(t, m, "/v1/completions", `{"prompt":"x","max_tokens":1}`); code {
		case 500:
			failed++
		case 200:
		default:
			t.Fatalf("%d %s", code, b)
		}
	}
	// 60 expected, σ ≈ 6.5.
	if failed < 25 || failed > 95 {
		t.Errorf("%d of 200 failed at --fail-rate 0.3", failed)
	}
	if st := m.Stats(); st.Submitted != uint64(200-failed) {
		t.Errorf("%d failed, the engine saw %d requests", failed, st.Submitted)
	}
}

// rawPost sends a request on a connection of its own, without reading the answer.
func rawPost(t *testing.T, m *Mocker, path, body string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: mocker\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
	return c
}

// statsUntil polls m.Stats until cond holds, and fails after 5 s: well before the requests the
// tests abort would have ended by themselves.
func statsUntil(t *testing.T, what string, m *Mocker, cond func(Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for st := m.Stats(); !cond(st); st = m.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("never %s: %+v", what, st)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestClientGoneWhileWaiting: a client that leaves a request not streamed, or a stream before
// its first token, has it aborted, as vLLM's server aborts a request on disconnect: a running
// one frees its slot, a queued one leaves the queue. A stream's headers come at once, before
// its first token, so that a client can tell it was accepted and give up on it.
func TestClientGoneWhileWaiting(t *testing.T) {
	// One sequence at a time; 20,000 tokens ≈ 10 s of decode steps.
	m := start(t, func(c *Config) { c.Speedup = 10; c.Blocks = 4096; c.MaxSeqs = 1 })
	long := `{"prompt":"a long answer, please","max_tokens":20000}`

	running := rawPost(t, m, "/v1/completions", long)
	statsUntil(t, "running", m, func(st Stats) bool { return st.Running == 1 })
	running.Close()
	statsUntil(t, "aborted", m, func(st Stats) bool { return st.Running == 0 && st.Aborted == 1 })

	// A stream holds the one slot; the others queue behind it.
	first, err := http.Post(m.HTTPEndpoint()+"/v1/completions", "application/json",
		strings.NewReader(strings.Replace(long, "}", `,"stream":true}`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	statsUntil(t, "the stream running", m, func(st Stats) bool { return st.Running == 1 })

	client := &http.Client{Timeout: 3 * time.Second}
	queued, err := client.Post(m.HTTPEndpoint()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"x"}],"stream":true}`))
	if err != nil {
		t.Fatalf("a queued stream's headers: %v", err)
	}
	if queued.StatusCode != 200 || queued.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
		t.Fatalf("a queued stream: %d %s", queued.StatusCode, queued.Header)
	}
	statsUntil(t, "the stream queued", m, func(st Stats) bool { return st.Waiting == 1 })
	queued.Body.Close()
	statsUntil(t, "the queued stream aborted", m, func(st Stats) bool { return st.Waiting == 0 && st.Aborted == 2 })

	waiting := rawPost(t, m, "/v1/completions", `{"prompt":"x"}`)
	statsUntil(t, "queued", m, func(st Stats) bool { return st.Waiting == 1 })
	waiting.Close()
	statsUntil(t, "the queued request aborted", m, func(st Stats) bool { return st.Waiting == 0 && st.Aborted == 3 })

	first.Body.Close()
	statsUntil(t, "the stream aborted", m, func(st Stats) bool { return st.Running == 0 && st.Aborted == 4 })
	if st := m.Stats(); st.Completed != 0 || st.Generated > 10000 {
		t.Errorf("stats %+v", st)
	}
}

// TestDieAfter: past --die-after's requests the mocker dies as a crashed engine: the request
// that crossed the line and a stream in flight see their connections reset, nothing more is
// written to them (no error event, no [DONE]), and new connections are refused.
func TestDieAfter(t *testing.T) {
	m := start(t, func(c *Config) { c.DieAfter = 2; c.Speedup = 10; c.Blocks = 4096 })
	stream, err := http.Post(m.HTTPEndpoint()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"x","max_tokens":20000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	r := bufio.NewReader(stream.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if code, b := post(t, m, "/v1/completions", `{"prompt":"x","max_tokens":2}`); code != 200 {
		t.Fatalf("second request: %d %s", code, b)
	}
	select {
	case <-m.Died():
		t.Fatal("died after two requests")
	default:
	}

	third := rawPost(t, m, "/v1/completions", `{"prompt":"x","max_tokens":2}`)
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := third.Read(make([]byte, 100)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("third request: %d bytes, %v; want a connection reset", n, err)
	}
	select {
	case <-m.Died():
	case <-time.After(5 * time.Second):
		t.Fatal("not dead")
	}
	rest, err := io.ReadAll(r)
	if err == nil || strings.Contains(string(rest), "[DONE]") || strings.Contains(string(rest), "abort") {
		t.Errorf("the stream in flight ended with %v after %d bytes:\n%.300s", err, len(rest), rest)
	}
	if c, err := net.Dial("tcp", m.Addr()); err == nil {
		c.Close()
		t.Error("a dead mocker accepts connections")
	}
}
