package frontdoor

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestAggregate: a chat stream's deltas, tool calls, logprobs and usage, with two choices
// interleaved, assemble into the chat.completion vLLM would have answered.
func TestAggregate(t *testing.T) {
	chunks := []string{
		`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":1,"delta":{"role":"assistant","reasoning_content":"hm"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":{"content":[{"token":"Hel","logprob":-0.1}]},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"a\""}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":"lo"},"logprobs":{"content":[{"token":"lo","logprob":-0.2}]},"finish_reason":"stop","stop_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"logprobs":null,"finish_reason":"tool_calls"}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`,
	}
	g := aggregate{chat: true}
	for _, c := range chunks {
		if !g.add([]byte(c)) {
			t.Fatalf("not taken: %s", c)
		}
	}
	var got struct {
		ID, Object, Model string
		SystemFingerprint string `json:"system_fingerprint"`
		Created           int64
		Choices           []struct {
			Index   int
			Message struct {
				Role, Content    string
				ReasoningContent string `json:"reasoning_content"`
				ToolCalls        []struct {
					ID, Type string
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
			Logprobs     *struct{ Content []struct{ Token string } }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	b := g.bytes()
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	c0, c1 := got.Choices[0], got.Choices[1]
	switch {
	case got.Object != "chat.completion" || got.Created != 5 || got.Model != "m" || got.SystemFingerprint != "fp" || len(got.Choices) != 2:
		t.Errorf("top: %s", b)
	case c0.Message.Content != "Hello" || c0.Message.Role != "assistant" || c0.FinishReason != "stop" || c0.Logprobs == nil || len(c0.Logprobs.Content) != 2:
		t.Errorf("choice 0: %s", b)
	case c1.Message.ReasoningContent != "hm" || len(c1.Message.ToolCalls) != 1 || c1.Message.ToolCalls[0].Function.Arguments != `{"a":1}` ||
		c1.Message.ToolCalls[0].ID != "call_1" || c1.FinishReason != "tool_calls" || c1.Logprobs != nil:
		t.Errorf("choice 1: %s", b)
	case got.Usage.CompletionTokens != 4:
		t.Errorf("usage: %s", b)
	}
}

// TestAggregateCompletion: completions' text and logprobs lists.
func TestAggregateCompletion(t *testing.T) {
	g := aggregate{}
	g.add([]byte(`{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"],"token_logprobs":[-1],"top_logprobs":[null],"text_offset":[0]},"finish_reason":null}]}`))
	g.add([]byte(`{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"b","logprobs":{"tokens":["b"],"token_logprobs":[-2],"top_logprobs":[null],"text_offset":[1]},"finish_reason":"length"}]}`))
	want := `{"choices":[{"finish_reason":"length","index":0,"logprobs":{"text_offset":[0,1],"token_logprobs":[-1,-2],"tokens":["a","b"],"top_logprobs":[null,null]},"text":"ab"}],"created":1,"id":"x","model":"m","object":"text_completion","usage":null}`
	if got := string(g.bytes()); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// TestReadEvent: events split anywhere by the reads, CRLF lines, comments, lines longer than
// the reader's buffer, an event cut off by the stream's end, and a read error.
func TestReadEvent(t *testing.T) {
	long := strings.Repeat("x", 100)
	stream := ": ping\n\ndata: {\"a\":1}\n\ndata: " + long + "\r\n\r\nevent: x\ndata: [DONE]\n\ndata: tail"
	rd := bufio.NewReaderSize(iotest.OneByteReader(strings.NewReader(stream)), 16)
	var buf []byte
	var datas []string
	var raws []string
	for {
		raw, data, err := readEvent(rd, &buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, string(raw))
		datas = append(datas, string(data))
	}
	want := []string{"", `{"a":1}`, long, "[DONE]", "tail"}
	if strings.Join(datas, "|") != strings.Join(want, "|") || strings.Join(raws, "") != stream {
		t.Errorf("data %q, raw %q", datas, raws)
	}
	broken := errors.New("reset")
	rd = bufio.NewReader(io.MultiReader(strings.NewReader("data: 1\n\ndata: 2"), iotest.ErrReader(broken)))
	if _, d, err := readEvent(rd, &buf); err != nil || string(d) != "1" {
		t.Fatalf("%q %v", d, err)
	}
	if _, _, err := readEvent(rd, &buf); !errors.Is(err, broken) {
		t.Fatalf("a cut event: %v, want the read's error", err)
	}
}

// TestEngineError: each shape engines write keeps its message; the code is a string.
func TestEngineError(t *testing.T) {
	f := func(status int, body, msg, code string) {
		t.Helper()
		e := engineError(status, []byte(body))
		gotCode := ""
		if e.Code != nil {
			gotCode = *e.Code
		}
		if e.Message != msg || gotCode != code || e.Type == "" {
			t.Errorf("%s: %+v (code %q), want %q, %q", body, e, gotCode, msg, code)
		}
		var back struct {
			Error struct{ Code *string }
		}
		if err := json.Unmarshal(errorBody(e), &back); err != nil {
			t.Errorf("%s: %v", errorBody(e), err)
		}
	}
	f(400, `{"error":{"message":"m1","type":"BadRequestError","param":null,"code":400}}`, "m1", "400")
	f(400, `{"object":"error","message":"m2","type":"BadRequestError","param":null,"code":400}`, "m2", "400")
	f(429, `{"error":{"message":"m3","type":"requests","code":"rate_limit_exceeded"}}`, "m3", "rate_limit_exceeded")
	f(422, `{"error":"m4"}`, "m4", "")
	f(401, `{"detail":"m5"}`, "m5", "")
	f(422, `{"detail":[{"loc":["body",0,"x"],"msg":"m6"}]}`, "body.0.x: m6", "")
	f(500, "<html>m7</html>", "<html>m7</html>", "")
	f(502, "", "the worker answered 502 Bad Gateway with no message", "")
}

// TestIsErrorEvent: an engine's in-stream error in the shapes vLLM writes, and chunks that only
// mention errors.
func TestIsErrorEvent(t *testing.T) {
	for data, want := range map[string]bool{
		`{"error": {"message": "m", "type": "BadRequestError", "code": 400}}`: true,
		`{"error":{"message":"m"}}`:                        true,
		`{"object": "error", "message": "m", "code": 500}`: true,
		`{"object":"chat.completion.chunk","choices":[{"delta":{"content":"\"object\":\"error\""}}]}`: false,
		`{"id":"x","choices":[{"text":"error"}]}`:                                                     false,
	} {
		if got := isErrorEvent([]byte(data)); got != want {
			t.Errorf("%s: %v", data, got)
		}
	}
}

// TestAggregateAgainstReference: the aggregation answers byte for byte what the reference model
// (maps and encoding/json) answers, for the shapes engines write and odd ones, and an aggregate
// reset for another answer keeps nothing of the one before.
func TestAggregateAgainstReference(t *testing.T) {
	var streams [][]string
	var chunks []string
	for line := range strings.Lines(mockerChat) {
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok && d != "[DONE]" {
			chunks = append(chunks, d)
		}
	}
	streams = append(streams, chunks,
		[]string{`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":1,"delta":{"role":"assistant","reasoning_content":"hm"},"logprobs":null,"finish_reason":null}]}`,
			`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":"Hel\n\u2028<é>"},"logprobs":{"content":[{"token":"Hel","logprob":-0.1}]},"finish_reason":null}]}`,
			`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"a\""}}]},"logprobs":null,"finish_reason":null}]}`,
			`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":"lo\u0001\b\f\t\\"},"logprobs":{"content":[{"token":"lo","logprob":-0.2}]},"finish_reason":"stop","stop_reason":null,"message":{"x":1}}]}`,
			`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}},{"index":1,"function":{"name":"b"}}]},"logprobs":null,"finish_reason":"tool_calls"}]}`,
			`{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`},
		[]string{`{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"],"token_logprobs":[-1],"top_logprobs":[null],"text_offset":[0]},"finish_reason":null}]}`,
			`{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"b","logprobs":{"tokens":["b"],"token_logprobs":[-2],"top_logprobs":[null],"text_offset":[1]},"finish_reason":"length"}]}`},
		[]string{`{"Object":"x","CHOICES":[],"e\u0301":1,"a":{"b":[1,"]"]},"choices":[{"index":"1","text":"t","delta":{"role":"user","x":"y"},"logprobs":{}},{"index":0,"finish_reason":null,"stop_reason":7}]}`,
			`not json`, `[1]`, `{"choices":[{"index":0,"finish_reason":"stop","stop_reason":null,"text":null}],"usage":null,"model":"later"}`},
	)
	var g aggregate
	for _, chat := range []bool{true, false} {
		for _, s := range streams {
			ref := refAggregate{chat: chat}
			g.reset(chat)
			for _, c := range s {
				b := []byte(c)
				if got, want := g.add(b), ref.add([]byte(c)); got != want {
					t.Fatalf("add(%s): %v, want %v", c, got, want)
				}
				clear(b) // the reader's buffer is reused: nothing may refer to it
			}
			if got, want := string(g.bytes()), string(ref.bytes()); got != want {
				t.Errorf("chat %v:\ngot  %s\nwant %s", chat, got, want)
			}
		}
	}
}
