package mocker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/wire"
)

// start runs a mocker on loopback ports, with replay, at a high speedup, changed by set; it is
// shut down when the test ends.
func start(t *testing.T, set func(*Config)) *Mocker {
	t.Helper()
	c := Defaults()
	c.HTTPAddr = "127.0.0.1:0"
	c.KVEventsAddr = "tcp://127.0.0.1:0"
	c.ReplayAddr = "tcp://127.0.0.1:0"
	c.Speedup = 1000
	c.Blocks = 512
	c.LogLevel = "debug"
	if set != nil {
		set(&c)
	}
	logs := new(syncbuf.Buffer) // kept for failure messages
	m, err := Start(c, logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("mocker log:\n%s", logs)
		}
	})
	return m
}

// post sends body to path and returns the status and the answer.
func post(t *testing.T, m *Mocker, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(m.HTTPEndpoint()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

type usage struct {
	Prompt     int `json:"prompt_tokens"`
	Total      int `json:"total_tokens"`
	Completion int `json:"completion_tokens"`
	Details    struct {
		Cached int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type answer struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int     `json:"index"`
		Text    *string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func decodeAnswer(t *testing.T, b []byte) answer {
	t.Helper()
	var a answer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return a
}

// expectText is the output of a request with prompt, n tokens long.
func expectText(prompt []uint32, n int) string {
	var s strings.Builder
	for i := range n {
		s.WriteString(OutputText(OutputToken(OutputSeed(prompt), i), i))
	}
	return s.String()
}

func tokenize(t *testing.T, m *Mocker, body string) []uint32 {
	t.Helper()
	code, b := post(t, m, "/tokenize", body)
	var r struct {
		Count  int      `json:"count"`
		MaxLen int      `json:"max_model_len"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &r); code != 200 || err != nil || r.Count != len(r.Tokens) || r.MaxLen != 512*16 {
		t.Fatalf("/tokenize %s: %d %s", body, code, b)
	}
	return r.Tokens
}

// events reads every batch the mocker kept, from its replay socket, in order.
func events(t *testing.T, m *Mocker) (seqs []uint64, evs []kvevent.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(m.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, 0))); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 || len(msg.Frames[1]) != 8 {
			t.Fatalf("replay reply of %d frames: %q", len(msg.Frames), msg.Frames)
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if seq == wire.EngineSeqEnd {
			if len(msg.Frames[2]) != 0 {
				t.Fatalf("end marker with a payload")
			}
			return seqs, evs
		}
		var b wire.EngineBatch
		if err := b.Decode(msg.Frames[2]); err != nil {
			t.Fatalf("batch %d: %v", seq, err)
		}
		if !b.HasRank || b.Rank != 0 || len(b.Events) == 0 {
			t.Fatalf("batch %d: %+v", seq, b)
		}
		seqs = append(seqs, seq)
		for _, ev := range b.Events {
			ev.Hashes, ev.Tokens = slices.Clone(ev.Hashes), slices.Clone(ev.Tokens)
			evs = append(evs, ev)
		}
	}
}

// storedTokens is the tokens of every stored block, in the order the events stored them.
func storedTokens(evs []kvevent.Event) []uint32 {
	var out []uint32
	for _, ev := range evs {
		if ev.Kind == kvevent.Stored {
			out = append(out, ev.Tokens...)
		}
	}
	return out
}

// TestStreamedChat: a streamed chat completion arrives in vLLM's Server-Sent Events, one event
// per token after the role's, the last token's with finish_reason "length", then the usage
// event, then [DONE].
func TestStreamedChat(t *testing.T) {
	m := start(t, nil)
	msgs := `[{"role":"system","content":"You are a router."},{"role":"user","content":"Which worker holds my prefix?"}]`
	prompt := tokenize(t, m, `{"messages":`+msgs+`}`)
	resp, err := http.Post(m.HTTPEndpoint()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"kvr-mock","messages":`+msgs+`,"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("%d %s", resp.StatusCode, ct)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	events := strings.SplitAfter(string(body), "\n\n")
	if events[len(events)-1] == "" {
		events = events[:len(events)-1]
	}
	if len(events) != 1+7+1+1 || events[len(events)-1] != "data: [DONE]\n\n" {
		t.Fatalf("%d events:\n%s", len(events), body)
	}
	var text strings.Builder
	var id string
	for i, ev := range events[:len(events)-1] {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("event %d: %q", i, ev)
		}
		a := decodeAnswer(t, []byte(data))
		if i == 0 {
			id = a.ID
		}
		if a.ID != id || !strings.HasPrefix(id, "chatcmpl-") || a.Object != "chat.completion.chunk" || a.Model != "kvr-mock" || a.Created == 0 {
			t.Fatalf("event %d: %s", i, data)
		}
		switch {
		case i == 0:
			if len(a.Choices) != 1 || a.Choices[0].Delta == nil || *a.Choices[0].Delta.Role != "assistant" || *a.Choices[0].Delta.Content != "" {
				t.Fatalf("first event: %s", data)
			}
		case i <= 7:
			c := a.Choices[0]
			if c.Delta == nil || c.Delta.Content == nil || c.Delta.Role != nil || (c.FinishReason != nil) != (i == 7) {
				t.Fatalf("token event %d: %s", i, data)
			}
			text.WriteString(*c.Delta.Content)
			if i == 7 && *c.FinishReason != "length" {
				t.Fatalf("last token: %s", data)
			}
		default:
			if len(a.Choices) != 0 || a.Usage == nil || *a.Usage != (usage{Prompt: len(prompt), Total: len(prompt) + 7, Completion: 7}) {
				t.Fatalf("usage event: %s", data)
			}
		}
	}
	if got, want := text.String(), expectText(prompt, 7); got != want {
		t.Errorf("streamed text %q, want %q", got, want)
	}
	// Raw bytes of a token event, as vLLM writes them.
	if !strings.Contains(events[1], `"choices":[{"index":0,"delta":{"content":`) ||
		!strings.HasSuffix(events[1], `},"logprobs":null,"finish_reason":null}]}`+"\n\n") {
		t.Errorf("token event %q", events[1])
	}
}

// TestTokenByToken reads a slow stream as it comes: its first events arrive, one per token,
// while the request is still generating (1,000 decode steps of ≈ 6 ms at speedup 1), so tokens
// are flushed as the engine emits them, not at the end.
func TestTokenByToken(t *testing.T) {
	m := start(t, func(c *Config) { c.Speedup = 1 })
	resp, err := http.Post(m.HTTPEndpoint()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"tell me","max_tokens":1000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		a := decodeAnswer(t, []byte(strings.TrimPrefix(line, "data: ")))
		if a.Object != "text_completion" || len(a.Choices) != 1 || *a.Choices[0].Text != OutputText(OutputToken(OutputSeed(AppendTokens(nil, "tell me", true)), i), i) {
			t.Fatalf("event %d: %s", i, line)
		}
		if blank, _ := r.ReadString('\n'); blank != "\n" {
			t.Fatalf("event %d not ended by a blank line: %q", i, blank)
		}
	}
	if st := m.Stats(); st.Running != 1 || st.Completed != 0 {
		t.Fatalf("three tokens read, stats %+v: the stream was not sent as it was generated", st)
	}
}

// TestCompletionUsage: answers not streamed carry the whole text and the usage; a list of ids
// is the prompt as is, a string gets <|bos|>.
func TestCompletionUsage(t *testing.T) {
	m := start(t, nil)
	f := func(path, body string, prompt []uint32, n int) {
		t.Helper()
		code, b := post(t, m, path, body)
		if code != 200 {
			t.Fatalf("%s %s: %d %s", path, body, code, b)
		}
		a := decodeAnswer(t, b)
		if a.Usage == nil || *a.Usage != (usage{Prompt: len(prompt), Total: len(prompt) + n, Completion: n}) ||
			len(a.Choices) != 1 || *a.Choices[0].FinishReason != "length" {
			t.Fatalf("%s: %s", body, b)
		}
		c := a.Choices[0]
		if path == "/v1/completions" {
			if a.Object != "text_completion" || !strings.HasPrefix(a.ID, "cmpl-") || c.Text == nil || *c.Text != expectText(prompt, n) {
				t.Fatalf("%s: %s", body, b)
			}
		} else if a.Object != "chat.completion" || c.Message == nil || c.Message.Role != "assistant" || c.Message.Content != expectText(prompt, n) {
			t.Fatalf("%s: %s", body, b)
		}
	}
	f("/v1/completions", `{"prompt":[9,8,7,6],"max_tokens":3}`, []uint32{9, 8, 7, 6}, 3)
	f("/v1/completions", `{"prompt":"the cache","max_tokens":5}`, []uint32{BOSID, word("the"), word("cache")}, 5)
	f("/v1/completions", `{"prompt":"the cache","add_special_tokens":false}`, []uint32{word("the"), word("cache")}, 16)
	msgs := `[{"role":"user","content":"hello"}]`
	f("/v1/chat/completions", `{"messages":`+msgs+`,"max_completion_tokens":4,"max_tokens":9}`, tokenize(t, m, `{"messages":`+msgs+`}`), 4)
	f("/v1/chat/completions", `{"messages":`+msgs+`,"max_tokens":2}`, tokenize(t, m, `{"messages":`+msgs+`}`), 2)

	// Without max_tokens near the model's length: what is left of it.
	long := make([]uint32, 512*16-3)
	for i := range long {
		long[i] = 1
	}
	f("/v1/completions", `{"prompt":[`+strings.Repeat("1,", len(long)-1)+`1]}`, long, 3)
}

// TestTokenizeIsWhatTheEngineCaches: the ids /tokenize gives for messages are the tokens of
// the blocks the engine stores and publishes for the same chat, block for block, and the
// published hashes are kvrouterd's sequence hashes of them.
func TestTokenizeIsWhatTheEngineCaches(t *testing.T) {
	m := start(t, nil)
	msgs := `[{"role":"system","content":"` + strings.Repeat("You route requests to the worker that holds their prefix. ", 8) +
		`"},{"role":"user","content":"Where does this go?"}]`
	ids := tokenize(t, m, `{"messages":`+msgs+`,"add_generation_prompt":true}`)
	if len(ids) < 5*16 {
		t.Fatalf("only %d tokens", len(ids))
	}
	if code, b := post(t, m, "/v1/chat/completions", `{"messages":`+msgs+`,"max_tokens":2}`); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	seqs, evs := events(t, m)
	full := len(ids) / 16 * 16
	if got := storedTokens(evs); !slices.Equal(got, ids[:full]) {
		t.Fatalf("stored tokens %v\nwant %v", got, ids[:full])
	}
	if seqs[0] != 0 {
		t.Errorf("first sequence %d", seqs[0])
	}
	var h radix.Hasher
	want := h.AppendSequence(nil, ids, 16, radix.LoRASeed(""))
	var got []uint64
	for _, ev := range evs {
		got = append(got, ev.Hashes...)
		if ev.BlockSize != 16 || ev.Tier != kvevent.Device {
			t.Errorf("event %+v", ev)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("published hashes %x, want the sequence hashes %x", got, want)
	}
}

// TestPrefixCacheHit: a request sharing a prefix with an earlier one reports the shared full
// blocks as cached tokens, as vLLM's prompt_tokens_details does, and publishes only its new
// blocks, chained to the shared ones.
func TestPrefixCacheHit(t *testing.T) {
	m := start(t, nil)
	shared := make([]string, 40)
	for i := range shared {
		shared[i] = fmt.Sprint(1000 + i)
	}
	ask := func(tail string) usage {
		t.Helper()
		code, b := post(t, m, "/v1/completions", `{"prompt":[`+strings.Join(shared, ",")+tail+`],"max_tokens":2}`)
		if code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		return *decodeAnswer(t, b).Usage
	}
	if u := ask(",1,2,3"); u.Details.Cached != 0 || u.Prompt != 43 {
		t.Fatalf("first request %+v", u)
	}
	if u := ask(",4,5,6,7,8,9,10,11"); u.Details.Cached != 32 || u.Prompt != 48 {
		t.Fatalf("second request %+v, want 32 cached tokens (2 full blocks of 16)", u)
	}
	_, evs := events(t, m)
	if len(evs) != 2 || !slices.Equal(evs[0].Tokens, toks(shared[:32])) || !evs[1].HasParent ||
		evs[1].Parent != evs[0].Hashes[1] || !slices.Equal(evs[1].Tokens, append(toks(shared[32:]), 4, 5, 6, 7, 8, 9, 10, 11)) {
		t.Fatalf("events %+v", evs)
	}
	if st := m.Stats(); st.CachedTokens != 32 || st.PromptTokens != 91 {
		t.Errorf("stats %+v", st)
	}
}

func toks(s []string) []uint32 {
	var out []uint32
	for _, x := range s {
		var v uint32
		fmt.Sscan(x, &v)
		out = append(out, v)
	}
	return out
}

// TestLiveEvents reads the PUB socket as kvrouterd does: three frames, the empty topic,
// sequences counting up by one, payloads that decode to the events the replay socket holds.
func TestLiveEvents(t *testing.T) {
	m := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(m.EventsEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	got := make(chan zmq4.Msg, 100)
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				close(got)
				return
			}
			got <- msg
		}
	}()
	// A PUB socket drops what it sends before the subscription reaches it: send requests of
	// fresh prompts until one batch arrives; from then on every batch does, in order.
	var first zmq4.Msg
	for i := 0; first.Frames == nil; i++ {
		if code, b := post(t, m, "/v1/completions", fmt.Sprintf(`{"prompt":[%s],"max_tokens":1}`, run(10000*(i+1), 16))); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		select {
		case first = <-got:
		case <-time.After(50 * time.Millisecond):
		}
	}
	for i := range 5 {
		if code, b := post(t, m, "/v1/completions", fmt.Sprintf(`{"prompt":[%s],"max_tokens":1}`, run(7, 16*(i+1)))); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	msgs := []zmq4.Msg{first}
	for len(msgs) < 6 {
		select {
		case msg, ok := <-got:
			if !ok {
				t.Fatal("subscription closed")
			}
			msgs = append(msgs, msg)
		case <-ctx.Done():
			t.Fatalf("%d batches arrived", len(msgs))
		}
	}
	firstSeq := binary.BigEndian.Uint64(first.Frames[1])
	seqs, _ := events(t, m)
	for i, msg := range msgs {
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 || len(msg.Frames[1]) != 8 {
			t.Fatalf("message %d: %d frames", i, len(msg.Frames))
		}
		if seq := binary.BigEndian.Uint64(msg.Frames[1]); seq != firstSeq+uint64(i) || !slices.Contains(seqs, seq) {
			t.Fatalf("message %d: sequence %d after %d", i, seq, firstSeq)
		}
		var b wire.EngineBatch
		if err := b.Decode(msg.Frames[2]); err != nil || len(b.Events) != 1 {
			t.Fatalf("message %d: %v %+v", i, err, b)
		}
		if i > 0 && !slices.Equal(b.Events[0].Tokens, toks(strings.Split(run(7+16*(i-1), 16), ","))) {
			t.Fatalf("message %d stored %v", i, b.Events[0].Tokens)
		}
	}
}

// run is n ids counting up from from, comma-separated.
func run(from, n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprint(from + i)
	}
	return strings.Join(s, ",")
}

// TestClientGoneAborts: a client that disconnects mid-stream has its request aborted: the
// worker's running count returns to 0 long before the request would have finished.
func TestClientGoneAborts(t *testing.T) {
	m := start(t, func(c *Config) { c.Speedup = 10; c.Blocks = 4096 }) // 20,000 tokens ≈ 10 s of decode steps
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", m.HTTPEndpoint()+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"a long answer, please"}],"max_tokens":20000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for range 3 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		r.ReadString('\n')
	}
	if st := m.Stats(); st.Running != 1 {
		t.Fatalf("running %d", st.Running)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(20 * time.Second)
	for st := m.Stats(); st.Running != 0 || st.Aborted != 1; st = m.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("never aborted: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := m.Stats(); st.Completed != 0 || st.Generated >= 20000 {
		t.Errorf("stats %+v", st)
	}
}

// TestErrors: bad input gets vLLM's error shape, {"error":{"message","type","param","code"}},
// and status.
func TestErrors(t *testing.T) {
	m := start(t, func(c *Config) { c.MaxModelLen = 100 })
	f := func(path, body string, status int, typ, msg string) {
		t.Helper()
		code, b := post(t, m, path, body)
		var answer struct {
			Error *struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    int     `json:"code"`
			} `json:"error"`
		}
		err := json.Unmarshal(b, &answer)
		e := answer.Error
		if err != nil || e == nil || code != status || e.Type != typ || e.Code != status || e.Param != nil ||
			!strings.Contains(e.Message, msg) || !bytes.HasPrefix(b, []byte(`{"error":{"message":`)) || !bytes.Contains(b, []byte(`"param":null`)) {
			t.Errorf("%s %s: %d %s; want %d %s %q", path, body, code, b, status, typ, msg)
		}
	}
	const bad = 400
	f("/v1/completions", `{"prompt":"x"`, bad, "BadRequestError", "invalid JSON")
	f("/v1/completions", ``, bad, "BadRequestError", "empty request body")
	f("/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":"many"}`, bad, "BadRequestError", "max_tokens")
	f("/v1/completions", `{"model":"gpt-4","prompt":"x"}`, 404, "NotFoundError", "The model `gpt-4` does not exist.")
	f("/v1/chat/completions", `{"model":"gpt-4","messages":[]}`, 404, "NotFoundError", "gpt-4")
	f("/tokenize", `{"model":"gpt-4","prompt":"x"}`, 404, "NotFoundError", "gpt-4")
	f("/v1/completions", `{"prompt":""}`, bad, "BadRequestError", "Prompt cannot be empty")
	f("/v1/completions", `{"prompt":"   "}`, bad, "BadRequestError", "Prompt cannot be empty")
	f("/v1/completions", `{"prompt":[]}`, bad, "BadRequestError", "Prompt cannot be empty")
	f("/v1/completions", `{}`, bad, "BadRequestError", "prompt is required")
	f("/v1/chat/completions", `{"messages":[]}`, bad, "BadRequestError", "at least one message")
	f("/v1/completions", `{"prompt":[`+run(0, 99)+`],"max_tokens":2}`, bad, "BadRequestError", "maximum context length is 100 tokens. However, you requested 101 tokens")
	f("/v1/completions", `{"prompt":[`+run(0, 100)+`]}`, bad, "BadRequestError", "your request has 100 input tokens")
	f("/v1/completions", `{"prompt":"x","max_tokens":0}`, bad, "BadRequestError", "max_tokens must be at least 1")
	f("/v1/completions", `{"prompt":"x","n":2}`, bad, "BadRequestError", "n = 2")
	f("/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, bad, "BadRequestError", "stream=True")
	f("/v1/completions", `{"prompt":["a","b"]}`, bad, "BadRequestError", "2 prompts")
	f("/tokenize", `{}`, bad, "BadRequestError", "either prompt or messages")

	// The engine refused nothing: every request was stopped at the door.
	if st := m.Stats(); st.Submitted != 0 {
		t.Errorf("stats %+v", st)
	}
	for _, c := range []struct{ method, path, want string }{
		{"GET", "/nope", `{"detail":"Not Found"}`},
		{"GET", "/v1/completions", `{"detail":"Method Not Allowed"}`},
	} {
		req, _ := http.NewRequest(c.method, m.HTTPEndpoint()+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != c.want {
			t.Errorf("%s %s: %d %s", c.method, c.path, resp.StatusCode, b)
		}
	}
}

// TestModelsHealthDetokenize: the small endpoints answer in vLLM's shapes.
func TestModelsHealthDetokenize(t *testing.T) {
	m := start(t, nil)
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(m.HTTPEndpoint() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, b := get("/health"); code != 200 || len(b) != 0 {
		t.Errorf("/health: %d %q", code, b)
	}
	code, b := get("/v1/models")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if json.Unmarshal(b, &models) != nil || code != 200 || models.Object != "list" || len(models.Data) != 1 ||
		models.Data[0].ID != "kvr-mock" || models.Data[0].Object != "model" || models.Data[0].MaxModelLen != 512*16 {
		t.Errorf("/v1/models: %d %s", code, b)
	}
	ids := tokenize(t, m, `{"prompt":"the quick brown fox","add_special_tokens":false}`)
	if code, b := post(t, m, "/detokenize", fmt.Sprintf(`{"tokens":%s}`, strings.Join(strings.Fields(fmt.Sprint(ids)), ","))); code != 200 ||
		string(b) != `{"prompt":"the quick brown fox"}` {
		t.Errorf("/detokenize: %d %s", code, b)
	}
	if ids := tokenize(t, m, `{"prompt":"the"}`); !slices.Equal(ids, []uint32{BOSID, word("the")}) {
		t.Errorf("/tokenize of a prompt adds <|bos|> by default: %v", ids)
	}
	post(t, m, "/v1/completions", `{"prompt":"x","max_tokens":3}`)
	if code, b := get("/metrics"); code != 200 || !bytes.Contains(b, []byte(`vllm:num_requests_running{model_name="kvr-mock"} 0`)) ||
		!bytes.Contains(b, []byte(`vllm:generation_tokens_total{model_name="kvr-mock"} 3`)) {
		t.Errorf("/metrics: %d\n%s", code, b)
	}
}

// TestShutdownAbortsStreams: a shutdown whose wait runs out aborts the streams still running,
// which end with finish_reason "abort" and [DONE].
func TestShutdownAbortsStreams(t *testing.T) {
	c := Defaults()
	c.HTTPAddr, c.KVEventsAddr, c.Speedup, c.Blocks = "127.0.0.1:0", "", 10, 4096
	m, err := Start(c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(m.HTTPEndpoint()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"x","max_tokens":30000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no wait at all
	if err := m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	events := strings.Split(strings.TrimSpace(string(rest)), "\n\n")
	if len(events) < 2 || events[len(events)-1] != "data: [DONE]" ||
		!strings.HasSuffix(events[len(events)-2], `"text":"","logprobs":null,"finish_reason":"abort","stop_reason":null}]}`) {
		t.Fatalf("stream ended with %q", events[max(0, len(events)-2):])
	}
	if st := m.Stats(); st.Running != 0 || st.Aborted != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestReplayFrom: the replay socket answers a start sequence with the kept batches from it on,
// then the end marker, as vLLM's does.
func TestReplayFrom(t *testing.T) {
	m := start(t, nil)
	for i := range 3 {
		post(t, m, "/v1/completions", fmt.Sprintf(`{"prompt":[%s],"max_tokens":1}`, run(100*i, 16)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(m.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	d.SendMulti(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, 1)))
	var seqs []uint64
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if seq == wire.EngineSeqEnd {
			break
		}
		seqs = append(seqs, seq)
	}
	if !slices.Equal(seqs, []uint64{1, 2}) {
		t.Errorf("replayed %v, want [1 2]", seqs)
	}
}

// TestConcurrentRequests runs many requests at once, streamed and not, through the engine:
// every one gets its whole answer, and the worker ends idle.
func TestConcurrentRequests(t *testing.T) {
	m := start(t, func(c *Config) { c.MaxSeqs = 8; c.MaxBatchedTokens = 64 })
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			stream := i%2 == 0
			body := fmt.Sprintf(`{"prompt":[%s],"max_tokens":%d,"stream":%v}`, run(i%5*1000, 20+i), 1+i%9, stream)
			resp, err := http.Post(m.HTTPEndpoint()+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if stream {
				if n := strings.Count(string(b), `"text":`); n != 1+i%9 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
					errs <- fmt.Errorf("request %d: %d tokens\n%s", i, n, b)
				}
			} else if a := decodeAnswer(t, b); a.Usage == nil || a.Usage.Completion != 1+i%9 {
				errs <- fmt.Errorf("request %d: %s", i, b)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := m.Stats(); st.Running != 0 || st.Waiting != 0 || st.Completed != 64 {
		t.Errorf("stats %+v", st)
	}
}
