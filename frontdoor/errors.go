package frontdoor

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// apiError is OpenAI's error object, the body of every non-2xx answer of the front door:
// {"error": {"message", "type", "param", "code"}}, code a string (or null), as OpenAI's SDKs
// read it.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// errorBody returns OpenAI's error body for e.
func errorBody(e apiError) []byte {
	b, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{e})
	return append(b, '\n')
}

// errorType is OpenAI's error type for an HTTP status.
func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == 529:
		return "overloaded_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// retryable says whether a client may retry a request refused with status later: the
// answers that carry Retry-After.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable || status == 529
}

// engineError reads an engine's error answer, in any of the shapes engines write, into OpenAI's
// error object, keeping the engine's message:
//   - OpenAI's and current vLLM's {"error": {"message", "type", "param", "code"}}, code a string
//     or a number;
//   - older vLLM's flat {"object": "error", "message", "type", "param", "code"};
//   - {"error": "text"} (TGI and others);
//   - FastAPI's {"detail": "text"} and its validation errors {"detail": [{"loc", "msg"}]},
//     which SGLang's and vLLM's servers answer for a request that fails their schema;
//   - {"message": "text"};
//   - anything else: its text, cut to 1,000 bytes.
func engineError(status int, body []byte) apiError {
	e := apiError{Type: errorType(status)}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) == nil {
		if inner, ok := obj["error"]; ok {
			var nested map[string]json.RawMessage
			if json.Unmarshal(inner, &nested) == nil {
				obj = nested
			} else {
				var s string
				if json.Unmarshal(inner, &s) == nil {
					e.Message = s
				}
			}
		}
		if e.Message == "" {
			e.Message = textOf(obj["message"])
		}
		if e.Message == "" {
			e.Message = detailOf(obj["detail"])
		}
		if t := textOf(obj["type"]); t != "" {
			e.Type = t
		}
		if p := textOf(obj["param"]); p != "" {
			e.Param = &p
		}
		if c := textOf(obj["code"]); c != "" {
			e.Code = &c
		}
	}
	if e.Message == "" {
		e.Message = strings.TrimSpace(clip(body, 1000))
	}
	if e.Message == "" {
		e.Message = "the worker answered " + strconv.Itoa(status) + " " + http.StatusText(status) + " with no message"
	}
	return e
}

// textOf is a JSON string's text, or a number's, or "".
func textOf(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// detailOf is the text of FastAPI's detail: a string, or its validation errors joined.
func detailOf(raw json.RawMessage) string {
	if s := textOf(raw); s != "" {
		return s
	}
	var list []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	if json.Unmarshal(raw, &list) != nil {
		return ""
	}
	var b strings.Builder
	for i, d := range list {
		if i > 0 {
			b.WriteString("; ")
		}
		for j, l := range d.Loc {
			if j > 0 {
				b.WriteByte('.')
			}
			b.WriteString(strings.Trim(strconv.Quote(toString(l)), `"`))
		}
		if len(d.Loc) > 0 {
			b.WriteString(": ")
		}
		b.WriteString(d.Msg)
	}
	return b.String()
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// clip is b as text, at most n bytes of it, cut at a rune's start.
func clip(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
		for len(b) > 0 && !utf8.Valid(b) {
			b = b[:len(b)-1]
		}
	}
	return string(b)
}

// writeError answers status with e as OpenAI's error body, and Retry-After where a retry
// makes sense.
func writeError(ctx *fasthttp.RequestCtx, status int, e apiError) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	if retryable(status) {
		ctx.Response.Header.Set("Retry-After", "1")
	}
	ctx.SetBody(errorBody(e))
}
