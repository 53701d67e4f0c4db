package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestFrontDoorSDK reads the front door's answers back through OpenAI's Go SDK: an engine's
// error in every shape engines write reaches it as an *openai.Error with the engine's status
// and message, and an answer the front door assembled from the engine's stream decodes as a
// chat completion, streamed or not.
func TestFrontDoorSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	shapes := []struct {
		name, ctype, body string
		status            int
		msg, code         string
	}{
		{"vLLM, nested", "application/json", `{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}}`, 400, "max_tokens is too large", "400"},
		{"vLLM, flat (older)", "application/json", `{"object":"error","message":"This model's maximum context length is 4096 tokens","type":"BadRequestError","param":null,"code":400}`, 400, "maximum context length is 4096", "400"},
		{"OpenAI", "application/json", `{"error":{"message":"no such thing","type":"invalid_request_error","param":null,"code":"not_found"}}`, 404, "no such thing", "not_found"},
		{"error string", "application/json", `{"error":"Input validation error: inputs tokens + max_new_tokens must be <= 4096"}`, 422, "Input validation error", ""},
		{"FastAPI detail", "application/json", `{"detail":"Not authenticated"}`, 401, "Not authenticated", ""},
		{"FastAPI validation", "application/json", `{"detail":[{"loc":["body","temperature"],"msg":"Input should be a valid number","type":"float_parsing"}]}`, 422, "body.temperature: Input should be a valid number", ""},
		{"plain text", "text/plain", "the engine is shutting down", 400, "the engine is shutting down", ""},
		{"5xx, flat", "application/json", `{"object":"error","message":"CUDA out of memory","type":"InternalServerError","param":null,"code":500}`, 500, "CUDA out of memory", "500"},
	}
	var which int
	engine := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		s := shapes[which]
		fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			s.status, http.StatusText(s.status), s.ctype, len(s.body), s.body)
	})
	_, front := frontDaemon(t, []string{"--frontend-retries", "0"}, engine)
	client := openai.NewClient(option.WithBaseURL(front+"/v1/"), option.WithAPIKey("sk-none"), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}}
	for i, s := range shapes {
		which = i
		t.Run(s.name, func(t *testing.T) {
			_, err := client.Chat.Completions.New(context.Background(), params)
			var e *openai.Error
			if !errors.As(err, &e) {
				t.Fatalf("not an *openai.Error: %v", err)
			}
			if e.StatusCode != s.status || !strings.Contains(e.Message, s.msg) || e.Code != s.code || e.Type == "" {
				t.Errorf("status %d, message %q, code %q, type %q; want %d, %q, %q", e.StatusCode, e.Message, e.Code, e.Type, s.status, s.msg, s.code)
			}
			// Streamed, the same error, before any event.
			st := client.Chat.Completions.NewStreaming(context.Background(), params)
			for st.Next() {
			}
			if !errors.As(st.Err(), &e) || e.StatusCode != s.status || !strings.Contains(e.Message, s.msg) {
				t.Errorf("streamed: %v", st.Err())
			}
		})
	}

	ok := newRawEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead)
		sseChunk(c, `{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)
		sseChunk(c, tokenChunk(0, ""))
		sseChunk(c, tokenChunk(1, "stop"))
		sseChunk(c, `{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}`)
		sseChunk(c, "[DONE]")
		io.WriteString(c, "0\r\n\r\n")
	})
	_, front = frontDaemon(t, nil, ok)
	client = openai.NewClient(option.WithBaseURL(front+"/v1/"), option.WithAPIKey("sk-none"), option.WithMaxRetries(0))
	got, err := client.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Choices) != 1 || got.Choices[0].Message.Content != "t0t1" || got.Choices[0].FinishReason != "stop" ||
		got.Object != "chat.completion" || got.Usage.CompletionTokens != 2 || got.Usage.PromptTokens != 11 {
		t.Errorf("assembled answer: %s", got.RawJSON())
	}
	st := client.Chat.Completions.NewStreaming(context.Background(), params)
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if st.Err() != nil || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "t0t1" || acc.Usage.TotalTokens != 0 {
		t.Errorf("streamed: %v, %+v (the usage chunk the client did not ask for must not reach it)", st.Err(), acc.ChatCompletion)
	}
}
