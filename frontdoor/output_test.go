package frontdoor

import "testing"

func TestOutputCounter(t *testing.T) {
	f := func(name string, stream string, want int64) {
		t.Helper()
		// Whole, and split at every byte: the count must not depend on how reads cut it.
		for _, step := range []int{len(stream) + 1, 1, 7} {
			var c outputCounter
			for i := 0; i < len(stream); i += step {
				c.scan([]byte(stream[i:min(i+step, len(stream))]))
			}
			if got := c.generated(); got != want {
				t.Errorf("%s (reads of %d): %d tokens, want %d", name, step, got, want)
			}
		}
	}
	chunk := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
	f("sse", chunk+chunk+chunk+"data: [DONE]\n\n", 3)
	f("crlf", "data: {\"x\":1}\r\n\r\ndata: [DONE]\r\n\r\n", 1)
	f("usage wins when larger", chunk+`data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`+"\n\ndata: [DONE]\n\n", 12)
	f("continuous usage", `data: {"usage":{"completion_tokens": 1}}`+"\n\n"+`data: {"usage":{"completion_tokens": 2}}`+"\n\n", 2)
	f("plain json", `{"choices":[{"text":"hello"}],"usage":{"completion_tokens":5}}`, 5)
	f("comments and blank lines", ": keep-alive\n\nevent: x\n\n", 0)

	var c outputCounter
	if !c.scan([]byte(chunk)) || c.scan([]byte("\n")) || !c.scan([]byte(chunk)) {
		t.Error("scan reports growth only when the count grows")
	}
	if testing.AllocsPerRun(100, func() { c.scan([]byte(chunk)) }) != 0 {
		t.Error("scan allocates")
	}
}
