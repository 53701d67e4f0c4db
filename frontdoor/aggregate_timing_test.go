package frontdoor

import (
	"bufio"
	"strings"
	"testing"
)

// mockerChat is a chat stream as kvr-mocker writes it for 4 output tokens with the usage chunk.
const mockerChat = `data: {"id":"chatcmpl-73dbb83e717ba94d0000000000000001","object":"chat.completion.chunk","created":1796675670,"model":"bench","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-73dbb83e717ba94d0000000000000001","object":"chat.completion.chunk","created":1796675670,"model":"bench","choices":[{"index":0,"delta":{"content":"when"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-73dbb83e717ba94d0000000000000001","object":"chat.completion.chunk","created":1796675670,"model":"bench","choices":[{"index":0,"delta":{"content":" will"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-73dbb83e717ba94d0000000000000001","object":"chat.completion.chunk","created":1796675670,"model":"bench","choices":[{"index":0,"delta":{"content":" would"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-73dbb83e717ba94d0000000000000001","object":"chat.completion.chunk","created":1796675670,"model":"bench","choices":[{"index":0,"delta":{"content":" who"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}

data: {"id":"chatcmpl-73dbb83e717ba94d0000000000000001","object":"chat.completion.chunk","created":1796675670,"model":"bench","choices":[],"usage":{"prompt_tokens":11,"total_tokens":15,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}

data: [DONE]

`

// BenchmarkAggregateChat: reading a 4-token chat stream's events and assembling the answer a
// non-streaming client gets, with one aggregate reset for each answer as the Door's pool does.
//
//	go test -run '^$' -bench AggregateChat -benchmem ./frontdoor/
func BenchmarkAggregateChat(b *testing.B) {
	rd := bufio.NewReaderSize(nil, 32<<10)
	src := strings.NewReader("")
	evb := make([]byte, 0, 4<<10)
	var agg aggregate
	b.ReportAllocs()
	for b.Loop() {
		src.Reset(mockerChat)
		rd.Reset(src)
		agg.reset(true)
		for {
			_, data, err := readEvent(rd, &evb)
			if err != nil {
				break
			}
			if data != nil && string(data) != "[DONE]" {
				agg.add(data)
			}
		}
		if len(agg.bytes()) == 0 {
			b.Fatal("no answer")
		}
	}
}
