package frontdoor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// FuzzReadEvent: any byte stream splits into events whose raw bytes add up to the stream
// (but for blank lines between events), and whose data lies within them; never a panic.
func FuzzReadEvent(f *testing.F) {
	for _, s := range []string{
		"data: {\"a\":1}\n\ndata: [DONE]\n\n",
		": ping\r\n\r\ndata:x\r\n\r\n",
		"event: e\ndata: 1\ndata: 2\n\ndata",
		"\n\n\n",
		"data: " + string(bytes.Repeat([]byte("y"), 70)) + "\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rd := bufio.NewReaderSize(bytes.NewReader(b), 16)
		var buf []byte
		total := 0
		for range len(b) + 2 {
			raw, data, err := readEvent(rd, &buf)
			if err == io.EOF {
				if total > len(b) {
					t.Fatalf("%d bytes of events from %d", total, len(b))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(raw) == 0 || data != nil && !bytes.Contains(raw, data) {
				t.Fatalf("raw %q data %q", raw, data)
			}
			total += len(raw)
		}
		t.Fatal("more events than bytes")
	})
}

// FuzzEngineError: any error body reads into an OpenAI error object with a message.
func FuzzEngineError(f *testing.F) {
	for _, s := range []string{
		`{"error":{"message":"m","type":"t","param":null,"code":400}}`,
		`{"object":"error","message":"m","code":400}`,
		`{"error":"m"}`, `{"detail":[{"loc":["body",1],"msg":"m"}]}`, `{"detail":"m"}`, `plain`, ``,
		`{"error":{"message":7,"code":{"x":1}}}`,
	} {
		f.Add(500, []byte(s))
	}
	f.Fuzz(func(t *testing.T, status int, b []byte) {
		e := engineError(status, b)
		if e.Message == "" || e.Type == "" {
			t.Fatalf("%q: %+v", b, e)
		}
		var back map[string]map[string]any
		if err := json.Unmarshal(errorBody(e), &back); err != nil || back["error"] == nil {
			t.Fatalf("%s: %v", errorBody(e), err)
		}
	})
}

// FuzzAggregate: any chunks assemble into a JSON object with choices, the reference model's
// answer byte for byte; never a panic.
func FuzzAggregate(f *testing.F) {
	f.Add([]byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"a","tool_calls":[{"index":0,"function":{"arguments":"x"}}]},"logprobs":{"content":[1]}}]}`),
		[]byte(`{"choices":[{"index":0,"text":"b","finish_reason":"stop"}],"usage":{"completion_tokens":1}}`), true)
	f.Add([]byte(`{"choices":[{"index":-3,"text":null,"logprobs":[]}]}`), []byte(`[]`), false)
	f.Fuzz(func(t *testing.T, a, b []byte, chat bool) {
		g, ref := aggregate{chat: chat}, refAggregate{chat: chat}
		g.add(bytes.Clone(a))
		g.add(bytes.Clone(b))
		ref.add(a)
		ref.add(b)
		if got, want := g.bytes(), ref.bytes(); !bytes.Equal(got, want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
		var out struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.Unmarshal(g.bytes(), &out); err != nil || out.Choices == nil {
			t.Fatalf("%s: %v", g.bytes(), err)
		}
	})
}
