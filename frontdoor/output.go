package frontdoor

// outputCounter counts the tokens an engine's answer has generated so far, from the bytes of
// its stream as they pass: each server-sent event "data: …" other than "data: [DONE]" is one
// chunk, which vLLM and SGLang stream one token at a time, and a usage object's
// "completion_tokens": n, when the engine sends one (stream_options.include_usage, or
// continuous usage stats), is the exact count; the larger of the two wins. A plain JSON answer
// arrives whole at its end, when the booking completes anyway. Events and numbers may be split
// across reads. A counter belongs to one stream's goroutine; it allocates nothing.
type outputCounter struct {
	events int64 // data events other than [DONE]
	usage  int64 // the last completion_tokens seen

	head  [12]byte // the current line's first bytes
	nhead int      // bytes of the current line seen, up to len(head)
	key   int      // bytes of usageKey matched
	num   int64    // digits of completion_tokens read so far
	inNum bool     // after the key: reading its number (spaces skipped)
	last  int64    // generated() at the last report
}

const usageKey = `"completion_tokens":`

// scan reads the next bytes of the stream and reports whether the count of generated tokens
// grew.
func (c *outputCounter) scan(b []byte) bool {
	for _, ch := range b {
		c.line(ch)
		c.usageByte(ch)
	}
	if g := c.generated(); g > c.last {
		c.last = g
		return true
	}
	return false
}

// generated returns the tokens generated so far.
func (c *outputCounter) generated() int64 { return max(c.events, c.usage) }

// line follows the stream's lines: an SSE event line starts "data:".
func (c *outputCounter) line(ch byte) {
	if ch == '\n' {
		c.endLine()
		return
	}
	if c.nhead < len(c.head) {
		c.head[c.nhead] = ch
	}
	c.nhead++
}

func (c *outputCounter) endLine() {
	h := c.head[:min(c.nhead, len(c.head))]
	c.nhead = 0
	if len(h) < 5 || string(h[:5]) != "data:" {
		return
	}
	rest := h[5:]
	for len(rest) > 0 && rest[0] == ' ' {
		rest = rest[1:]
	}
	for len(rest) > 0 && rest[len(rest)-1] == '\r' {
		rest = rest[:len(rest)-1]
	}
	if len(rest) == 0 || string(rest) == "[DONE]" {
		return
	}
	c.events++
}

// usageByte matches "completion_tokens": and reads the number after it.
func (c *outputCounter) usageByte(ch byte) {
	if c.inNum {
		switch {
		case ch >= '0' && ch <= '9':
			c.num = c.num*10 + int64(ch-'0')
			return
		case ch == ' ' && c.num == 0:
			return
		}
		c.inNum = false
		c.usage = c.num
	}
	if ch == usageKey[c.key] {
		c.key++
		if c.key == len(usageKey) {
			c.key, c.inNum, c.num = 0, true, 0
		}
		return
	}
	c.key = 0
	if ch == usageKey[0] {
		c.key = 1
	}
}
