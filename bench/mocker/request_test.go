package mocker

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParsePrompt(t *testing.T) {
	ok := func(raw string, bos bool, want ...uint32) {
		t.Helper()
		got, err := parsePrompt(json.RawMessage(raw), bos)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parsePrompt(%s, %v) = %v, %v; want %v", raw, bos, got, err, want)
		}
	}
	bad := func(raw, wantErr string) {
		t.Helper()
		if got, err := parsePrompt(json.RawMessage(raw), true); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("parsePrompt(%s) = %v, %v; want an error with %q", raw, got, err, wantErr)
		}
	}
	ok(`"the cache"`, true, BOSID, word("the"), word("cache"))
	ok(`"the cache"`, false, word("the"), word("cache"))
	ok(`[5, 4294967295, 0]`, true, 5, 4294967295, 0) // ids as is: no BOS, no vocabulary bound
	ok(` ["the"] `, false, word("the"))
	ok(`[[7, 8]]`, true, 7, 8)
	ok(`[]`, true)
	bad(``, "prompt is required")
	bad(`null`, "prompt is required")
	bad(`[1, -2]`, "prompt[1]: -2 is not a token id")
	bad(`[1, 4294967296]`, "prompt[1]")
	bad(`[1.5]`, "prompt[0]")
	bad(`["a", "b"]`, "2 prompts in one request")
	bad(`[[1], [2]]`, "2 prompts in one request")
	bad(`[[[1]]]`, "nested deeper")
	bad(`{"a": 1}`, "neither a string nor a list")
	bad(`12`, "neither a string nor a list")
}

func TestChatPrompt(t *testing.T) {
	decode := func(body string) *chatRequest {
		t.Helper()
		var req chatRequest
		if err := decodeBody([]byte(body), &req); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return &req
	}
	ids, err := chatPrompt(decode(`{"messages":[{"role":"user","content":[{"type":"text","text":"the"},{"type":"text","text":"cache"}]},
		{"role":"assistant","content":null}],"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true}`))
	want := AppendChat(nil, []Message{{"user", "the\ncache"}, {"assistant", ""}}, ChatTemplate{ContinueFinalMessage: true, AddSpecialTokens: true})
	if err != nil || !slices.Equal(ids, want) {
		t.Errorf("chatPrompt = %v, %v; want %v", ids, err, want)
	}
	bad := func(body, wantErr string) {
		t.Helper()
		if _, err := chatPrompt(decode(body)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: %v, want an error with %q", body, err, wantErr)
		}
	}
	bad(`{"messages":[]}`, "at least one message")
	bad(`{}`, "at least one message")
	bad(`{"messages":[{"content":"x"}]}`, "messages[0].role is required")
	bad(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[0]: part of type \"image_url\"")
	bad(`{"messages":[{"role":"user","content":7}]}`, "messages[0].content: 7 is neither")
	bad(`{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}`, "cannot set both")
}

func TestDecodeBody(t *testing.T) {
	f := func(body, wantErr string) {
		t.Helper()
		var req completionRequest
		err := decodeBody([]byte(body), &req)
		if wantErr == "" && err != nil || wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)) {
			t.Errorf("decodeBody(%q) = %v, want %q", body, err, wantErr)
		}
	}
	f(`{"prompt":"x","unknown_field":[1,2],"max_tokens":null}`, "")
	f(``, "empty request body")
	f(`{"prompt":`, "invalid JSON")
	f(`{"prompt":"x"} {}`, "data after the object")
	f(`{"prompt":"x",}`, "invalid JSON at offset")
	f(`{"max_tokens":"7"}`, "field max_tokens")
	f(`[]`, "is not a valid")
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uo\te`, "ctl\x00\x01\x1f\n\r\t", "ünï 東京 \u2028", "bad\xff\xfe utf8"} {
		b := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("%q → %s: %v", s, b, err)
			continue
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); back != want && utf8.ValidString(s) {
			t.Errorf("%q → %s → %q", s, b, back)
		}
	}
}

// FuzzRequestDecoding feeds arbitrary bodies to the decoding of every request the API takes:
// nothing panics, an accepted prompt is what the tokenizer or the id list says, strings the
// API writes back are valid JSON, and accepted stop conditions stream the answer's text.
func FuzzRequestDecoding(f *testing.F) {
	for _, s := range []string{
		`{"model":"kvr-mock","prompt":"Hello, world!","max_tokens":5}`,
		`{"prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[[1,2,3]]}`, `{"prompt":["x"]}`, `{"prompt":["x","y"]}`, `{"prompt":[[[1]]]}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}],"add_generation_prompt":false,"continue_final_message":true}`,
		`{"model":"m","messages":[{"role":"user","content":"<|im_end|>x"}],"add_special_tokens":true}`,
		`{"tokens":[1,2,99999]}`, `{"prompt":"\ud800"}`, `{`, `null`, `[]`, `{"prompt":-1}`,
		// vLLM's toy disaggregation proxy's prefill request, and a decode request with what
		// NixlConnector answers.
		`{"prompt":[1,2,3],"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`,
		`{"prompt":[1,2,3],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[7],"remote_engine_id":"e","remote_request_id":"cmpl-1","remote_host":"10.0.0.1","remote_port":8000,"tp_size":1}}`,
		`{"remote_engine_id":"e","remote_request_id":"cmpl-1","remote_block_ids":[1,-2]}`,
		// Stop conditions as OpenAI's SDK and vLLM's clients send them.
		`{"prompt":"x","stop":"\n\n","stream":true}`,
		`{"messages":[{"role":"user","content":"x"}],"stop":["</s>","User:"],"stop_token_ids":[2,16],"include_stop_str_in_output":true}`,
		`{"prompt":"x","stop":null,"stop_token_ids":null}`, `{"prompt":"x","stop":["",1]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var c completionRequest
		if decodeBody(body, &c) == nil {
			if ids, err := parsePrompt(c.Prompt, true); err == nil && len(ids) > 0 && isText(c.Prompt) && ids[0] != BOSID {
				t.Fatalf("text prompt without BOS: %v", ids)
			}
		}
		var ch chatRequest
		if decodeBody(body, &ch) == nil {
			if ids, err := chatPrompt(&ch); err == nil {
				for _, id := range ids {
					if id >= VocabSize {
						t.Fatalf("id %d ≥ VocabSize", id)
					}
				}
			}
			for _, m := range ch.Messages {
				if s, err := parseContent(m.Content, 0); err == nil {
					var back string
					if err := json.Unmarshal(appendJSONString(nil, s), &back); err != nil {
						t.Fatalf("appendJSONString(%q): %v", s, err)
					}
				}
			}
		}
		var d detokenizeRequest
		if decodeBody(body, &d) == nil {
			_ = Decode(d.Tokens)
		}
		if s, err := parseStop(c.Stop, c.StopTokenIDs, c.IncludeStopStrInOutput); err == nil && s != nil {
			seed := OutputSeed([]uint32{uint32(len(body))})
			n := stopAt(s, seed, 50)
			d := detokenizer{stop: s, seed: seed, limit: 50}
			var streamed []byte
			for d.n < n {
				d.add()
				streamed = append(streamed, d.delta(d.n == n)...)
			}
			if string(streamed) != string(d.text) {
				t.Fatalf("streamed %q, answered %q", streamed, d.text)
			}
		}
		if c.KVTransferParams != nil {
			_ = c.KVTransferParams.check(c.Stream)
		}
		var tr transferRequest
		_ = decodeBody(body, &tr)
	})
}
