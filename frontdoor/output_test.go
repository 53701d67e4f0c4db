package frontdoor

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestAnswerTokens: the tokens an answer generated, counted from its events as they pass: one
// a token chunk, or the engine's usage when it counts more, however the reads cut the stream;
// the router is told only when the count grows.
func TestAnswerTokens(t *testing.T) {
	f := newFixture(t, Config{}, startEngine(t, 1))
	feed := func(a *answer, stream string, step int) {
		rd := bufio.NewReaderSize(iotest.OneByteReader(strings.NewReader(stream)), 16)
		if step > 1 {
			rd = bufio.NewReaderSize(strings.NewReader(stream), 16)
		}
		var buf []byte
		for {
			_, data, err := readEvent(rd, &buf)
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if data != nil {
				a.event(data)
			}
		}
	}
	check := func(name, stream string, want int64) {
		t.Helper()
		for _, step := range []int{1, len(stream)} {
			a := &answer{d: f.d, q: &request{model: "m", mm: f.d.m.model("m")}, id: "x"}
			feed(a, stream, step)
			if got := a.tokens(); got != want {
				t.Errorf("%s (step %d): %d tokens, want %d", name, step, got, want)
			}
		}
	}
	chunk := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
	check("sse", chunk+chunk+chunk+"data: [DONE]\n\n", 3)
	check("crlf", "data: {\"choices\":[{\"x\":1}]}\r\n\r\ndata: [DONE]\r\n\r\n", 1)
	check("usage wins when larger", chunk+`data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`+"\n\ndata: [DONE]\n\n", 12)
	check("continuous usage", `data: {"choices":[{"text":"a"}],"usage":{"completion_tokens": 1}}`+"\n\n"+`data: {"choices":[{"text":"b"}],"usage":{"completion_tokens": 2}}`+"\n\n", 2)
	check("comments and blank lines", ": keep-alive\n\n\n\n", 0)

	reported := 0
	a := &answer{d: f.d, q: &request{model: "m", mm: f.d.m.model("m")}, id: "x", track: true}
	for _, data := range []string{`{"choices":[{"text":"a"}]}`, `{"choices":[],"usage":{"completion_tokens":1}}`, `{"choices":[{"text":"b"}]}`} {
		before := a.reported
		a.event([]byte(data))
		if a.reported != before {
			reported++
		}
	}
	if reported != 2 || a.reported != 2 {
		t.Errorf("told the router %d times, last %d; want twice, 2", reported, a.reported)
	}
}
