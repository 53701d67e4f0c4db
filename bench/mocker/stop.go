package mocker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
)

// stopSpec is a request's stop conditions, vLLM's sampling parameters of the same names: stop
// strings, stop token ids, and include_stop_str_in_output. A plain value, read only once made.
type stopSpec struct {
	strs    [][]byte // stop, in the request's order: the first one found wins
	ids     []uint32 // stop_token_ids
	include bool     // include_stop_str_in_output
	// hold is vLLM's stop_buffer_length: the characters a stream holds back while a stop
	// string may be forming, the longest one's length less one (none with include).
	hold int
}

// parseStop resolves a request's stop (a string, a list of strings or null), stop_token_ids
// and include_stop_str_in_output; nil when nothing can stop the request early.
func parseStop(raw json.RawMessage, ids []uint32, include bool) (*stopSpec, error) {
	var strs []string
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("stop: %v", err)
		}
		strs = []string{s}
	case raw[0] == '[':
		if err := json.Unmarshal(raw, &strs); err != nil {
			return nil, fmt.Errorf("stop: %.40s is not a list of strings", raw)
		}
	default:
		return nil, fmt.Errorf("stop: %.40s is neither a string nor a list of strings", raw)
	}
	if len(strs) == 0 && len(ids) == 0 {
		return nil, nil
	}
	s := &stopSpec{ids: ids, include: include}
	for _, str := range strs {
		if str == "" {
			return nil, errors.New("stop cannot contain an empty string.")
		}
		s.strs = append(s.strs, []byte(str))
		if n := utf8.RuneCountInString(str) - 1; !include && n > s.hold {
			s.hold = n
		}
	}
	return s, nil
}

// match is vLLM's check_stop_strings: the index of the first stop string, in the request's
// order, found in text ending within its last fresh characters, and the length text is cut to
// (-1: not cut); -1, -1 when none is. The output text is ASCII (fixed words and spaces), so
// bytes are characters.
func (s *stopSpec) match(text []byte, fresh int) (which, cut int) {
	if fresh == 0 {
		return -1, -1
	}
	for k, str := range s.strs {
		from := max(0, len(text)+1-fresh-utf8.RuneCount(str))
		i := bytes.Index(text[from:], str)
		if i < 0 {
			continue
		}
		i += from
		if s.include {
			if i += len(str); i >= len(text) {
				return k, -1
			}
		}
		return k, i
	}
	return -1, -1
}

// detokenizer follows a request's output as vLLM's incremental detokenizer and stop checks
// do (vllm/v1/engine/detokenizer.py, and the scheduler's check_stop for stop token ids): its
// text grows a token at a time, a stop token's own text is left out (unless include), a stop
// string is looked for where the new text could complete one and cuts the text before it
// (after it with include). A stream gets the text with the last stop.hold characters held
// back until the request ends, so that it never sees a stop string it would have to take back.
// Owned by one goroutine.
type detokenizer struct {
	stop   *stopSpec // nil: none
	seed   uint64    // OutputSeed(prompt)
	limit  int       // max_tokens: the token that reaches it ends the request by length
	n      int       // tokens added
	text   []byte
	sent   int    // text already handed out by delta
	reason []byte // stop_reason once a stop matched: a JSON string or a token id
}

// add adds the request's next output token and reports whether it stopped the request.
func (d *detokenizer) add() bool {
	i := d.n
	d.n++
	id := OutputToken(d.seed, i)
	s := d.stop
	if s == nil {
		d.text = appendOutputText(d.text, id, i)
		return false
	}
	// The engine checks the length before the stop tokens: the last allowed token ends the
	// request by length, whatever it is.
	byID := d.n < d.limit && slices.Contains(s.ids, id)
	from := len(d.text)
	if !byID || s.include {
		d.text = appendOutputText(d.text, id, i)
	}
	if byID {
		d.reason = strconv.AppendUint(nil, uint64(id), 10)
	}
	if k, cut := s.match(d.text, len(d.text)-from); k >= 0 {
		d.reason = appendJSONString(nil, string(s.strs[k]))
		if cut >= 0 {
			d.text = d.text[:cut]
		}
	}
	return d.reason != nil
}

// finish is the request's finish_reason once its last token is in: "stop" or "length".
func (d *detokenizer) finish() string {
	if d.reason != nil {
		return "stop"
	}
	return "length"
}

// delta returns the text not handed out yet, but for what a stream holds back while the
// request runs (vLLM's get_next_output_text in delta mode). Valid until the next add.
func (d *detokenizer) delta(finished bool) []byte {
	end := len(d.text)
	if !finished && d.stop != nil {
		end -= d.stop.hold
	}
	if d.sent >= end {
		return nil
	}
	out := d.text[d.sent:end]
	d.sent = end
	return out
}

// stopAt is the number of output tokens a request generates: the one that meets a stop
// condition ends it, else limit. The mocker's output is known in advance, so the engine is
// asked for exactly the tokens vLLM's would generate before its detokenizer stopped the request.
func stopAt(s *stopSpec, seed uint64, limit int) int {
	if s == nil {
		return limit
	}
	// From the second token on the text repeats every len(words) tokens, each at least two
	// characters long: a stop not met within one period and the longest stop string's length
	// past the first token is never met.
	horizon := 1 + len(words)
	for _, str := range s.strs {
		horizon = max(horizon, 1+len(words)+len(str))
	}
	d := detokenizer{stop: s, seed: seed, limit: limit}
	for d.n < limit {
		if d.add() {
			return d.n
		}
		if d.n > horizon {
			return limit
		}
	}
	return d.n
}
