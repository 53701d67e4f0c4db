package mocker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// The OpenAI requests the mocker reads: the fields it acts on, in vLLM's names; every other field
// is ignored, as vLLM ignores (and logs) fields it does not know. The prompt and message
// contents take several JSON shapes, resolved by parsePrompt and parseContent.

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// generationRequest is what a completion and a chat completion both carry and both check.
type generationRequest struct {
	Model         string         `json:"model"`
	N             *int           `json:"n"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`

	// Stop conditions (stopSpec): stop is a string, a list of strings or null.
	Stop                   json.RawMessage `json:"stop"`
	StopTokenIDs           []uint32        `json:"stop_token_ids"`
	IncludeStopStrInOutput bool            `json:"include_stop_str_in_output"`

	KVTransferParams *kvTransferParams `json:"kv_transfer_params"` // vLLM's, for disaggregated serving
}

type completionRequest struct {
	generationRequest
	Prompt           json.RawMessage `json:"prompt"`
	MaxTokens        *int            `json:"max_tokens"`
	AddSpecialTokens *bool           `json:"add_special_tokens"` // vLLM's extension; default true
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type chatRequest struct {
	generationRequest
	Messages             []chatMessage   `json:"messages"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"` // default true
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"` // default false for a chat, true for a /tokenize prompt
	Prompt               json.RawMessage `json:"prompt"`             // /tokenize only: not a chat
	ReturnTokenStrs      bool            `json:"return_token_strs"`  // /tokenize only
}

// tokenizeRequest is vLLM's /tokenize body: a completion's (prompt) or a chat's (messages).
type tokenizeRequest = chatRequest

type detokenizeRequest struct {
	Model  string   `json:"model"`
	Tokens []uint32 `json:"tokens"`
}

// decodeBody decodes a JSON request body into v, with an error a client can act on.
func decodeBody(body []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return fmt.Errorf("invalid JSON at offset %d: %v", se.Offset, err)
		case errors.As(err, &te):
			return fmt.Errorf("field %s: %s is not a valid %s (offset %d)", te.Field, te.Value, te.Type, te.Offset)
		case len(bytes.TrimSpace(body)) == 0:
			return errors.New("empty request body: a JSON object is required")
		}
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if d.More() {
		return fmt.Errorf("invalid JSON: data after the object at offset %d", d.InputOffset())
	}
	return nil
}

// parsePrompt resolves a completion's prompt: a string is tokenized (with BOSID first when
// addSpecial); a list of token ids is used as is; a list of one string or of one list of ids is
// that one prompt. Several prompts in one request are refused.
func parsePrompt(raw json.RawMessage, addSpecial bool) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, errors.New("prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("prompt: %v", err)
		}
		return AppendTokens(nil, s, addSpecial), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, fmt.Errorf("prompt: %v", err)
		}
		if len(items) == 0 {
			return nil, nil
		}
		first := bytes.TrimSpace(items[0])
		if len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			if len(items) > 1 {
				return nil, fmt.Errorf("prompt: %d prompts in one request; kvr-mocker takes one", len(items))
			}
			if first[0] == '[' {
				var inner []json.RawMessage
				if json.Unmarshal(first, &inner) == nil && len(inner) > 0 {
					if c := bytes.TrimSpace(inner[0]); len(c) > 0 && (c[0] == '[' || c[0] == '"') {
						return nil, errors.New("prompt: a list nested deeper than a list of token ids")
					}
				}
			}
			return parsePrompt(first, addSpecial)
		}
		ids := make([]uint32, len(items))
		for i, it := range items {
			if err := json.Unmarshal(it, &ids[i]); err != nil {
				return nil, fmt.Errorf("prompt[%d]: %s is not a token id (an integer in 0…4294967295)", i, bytes.TrimSpace(it))
			}
		}
		return ids, nil
	}
	return nil, fmt.Errorf("prompt: %.40s is neither a string nor a list of token ids", raw)
}

// isText reports whether a prompt is a string, or a list of one.
func isText(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n[")
	return len(raw) > 0 && raw[0] == '"'
}

// parseContent resolves a message's content: a string, null (an empty message), or a list of
// parts of which only text parts are understood, joined by newlines as vLLM joins them.
func parseContent(raw json.RawMessage, i int) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("messages[%d].content: %v", i, err)
		}
		return s, nil
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", fmt.Errorf("messages[%d].content: %v", i, err)
		}
		texts := make([]string, 0, len(parts))
		for j, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return "", fmt.Errorf("messages[%d].content[%d]: part of type %q; kvr-mocker understands text parts only", i, j, p.Type)
			}
			texts = append(texts, *p.Text)
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", fmt.Errorf("messages[%d].content: %.40s is neither a string nor a list of parts", i, raw)
}

// chatPrompt applies the chat template to req's messages.
func chatPrompt(req *chatRequest) ([]uint32, error) {
	if len(req.Messages) == 0 {
		return nil, errors.New("messages: at least one message is required")
	}
	t := ChatTemplate{
		AddGenerationPrompt:  req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage,
		AddSpecialTokens:     req.AddSpecialTokens != nil && *req.AddSpecialTokens,
	}
	if t.AddGenerationPrompt && t.ContinueFinalMessage {
		return nil, errors.New("cannot set both `continue_final_message` and `add_generation_prompt` to True")
	}
	msgs := make([]Message, len(req.Messages))
	for i, m := range req.Messages {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d].role is required", i)
		}
		c, err := parseContent(m.Content, i)
		if err != nil {
			return nil, err
		}
		msgs[i] = Message{Role: m.Role, Content: c}
	}
	return AppendChat(nil, msgs, t), nil
}
