package frontdoor

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// aggregate assembles a streamed answer's chunks into the answer a client that did not ask to
// stream expects, as Dynamo's frontend does for the engines it always streams from:
// chat.completion.chunk deltas into a chat.completion's messages (content, reasoning, refusal
// and tool calls concatenated; tool calls by index), text_completion chunks into their choices'
// text; logprobs' lists concatenated; the last finish_reason, stop_reason and usage; the rest of
// the first chunk's fields (id, created, model, system_fingerprint, …) as they are. The
// answer's keys are sorted, as encoding/json writes a map's.
//
// Every token of an assembled answer passes through it, so it reads each chunk in place
// (gjson, without a copy), keeps what it needs in one arena, and writes the answer into a
// buffer of its own, without maps: reset readies it for another answer with its buffers, and
// the Door pools it. It belongs to one answer's goroutine.
type aggregate struct {
	chat    bool
	arena   []byte   // the kept values: the chunk's bytes are the reader's, reused for the next
	top     []member // the first chunk's other fields, and those of later chunks it lacked
	choices []choice
	usage   []byte // nil: none
	out     []byte // the assembled answer
}

type choice struct {
	index    int
	role     string
	text     []textField // content, reasoning_content, reasoning, refusal; text for completions
	tools    []*toolCall
	logprobs []lpList // lists concatenated
	lpNull   bool     // every chunk's logprobs null
	other    []member // finish_reason, stop_reason, …: the last non-null
}

type textField struct {
	k string
	v []byte
}

type lpList struct {
	k     string
	items [][]byte
}

type toolCall struct {
	index     int
	id, typ   []byte
	name      string
	arguments []byte
}

// member is a member of a JSON object: its key and raw value, or what writes its value.
type member struct {
	k    string
	v    []byte // raw; for mText the string's bytes
	kind uint8
}

const (
	mRaw      uint8 = iota
	mText           // v, written as a JSON string
	mChoices        // the aggregate's choices
	mMessage        // a chat choice's message
	mLogprobs       // a choice's logprobs object
	mTools          // a message's tool calls
)

var jsonNull = []byte("null")

// reset readies g for another answer, keeping its buffers.
func (g *aggregate) reset(chat bool) {
	g.chat = chat
	g.arena = g.arena[:0]
	clear(g.top)
	g.top = g.top[:0]
	g.choices = g.choices[:0]
	g.usage = nil
	g.out = g.out[:0]
}

// held is the bytes g's buffers hold.
func (g *aggregate) held() int {
	n := cap(g.arena) + cap(g.out)
	for _, c := range g.choices[:cap(g.choices)] {
		for _, t := range c.text[:cap(c.text)] {
			n += cap(t.v)
		}
	}
	return n
}

// keep copies s into the arena. The slice it returns is never appended to, so it stays valid
// when the arena grows.
func (g *aggregate) keep(s string) []byte {
	start := len(g.arena)
	g.arena = append(g.arena, s...)
	return g.arena[start:len(g.arena):len(g.arena)]
}

// names are the keys and roles engines write, as strings of their own.
var names = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"id", "object", "created", "model", "system_fingerprint", "service_tier",
		"choices", "usage", "prompt_logprobs", "prompt_token_ids", "kv_transfer_params", "index",
		"finish_reason", "stop_reason", "logprobs", "text", "message", "delta", "token_ids", "content",
		"reasoning_content", "reasoning", "refusal", "role", "assistant", "tokens", "token_logprobs",
		"top_logprobs", "text_offset"} {
		m[k] = k
	}
	return m
}()

// name returns k as a string of its own (k may be the chunk's bytes): one of names, or a copy.
func name(k string) string {
	if n, ok := names[k]; ok {
		return n
	}
	return strings.Clone(k)
}

// unsafeString is b as a string, without a copy: b must not change while it is used.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// add takes one chunk (an event's data). It returns false when the chunk is not a JSON
// object. Nothing it keeps refers to data.
func (g *aggregate) add(data []byte) bool {
	if !gjson.ValidBytes(data) {
		return false
	}
	d := unsafeString(data)
	if i := skipSpace(data, 0); i == len(d) || d[i] != '{' {
		return false
	}
	eachMember(d, func(k, v string) bool {
		switch key := keyString(k); {
		case key == "choices":
			eachElem(v, func(ch string) bool {
				if ch[0] == '{' {
					g.choice(choiceIndex(ch)).add(g, ch)
				}
				return true
			})
		case key == "usage":
			if v != "null" {
				g.usage = g.keep(v)
			}
		case strings.EqualFold(key, "choices"), strings.EqualFold(key, "object"), strings.EqualFold(key, "usage"):
			// The assembled answer's own; a case variant would shadow it for a lenient reader.
		default:
			if !slices.ContainsFunc(g.top, func(m member) bool { return m.k == key }) {
				g.top = append(g.top, member{k: name(key), v: g.keep(v)})
			}
		}
		return true
	})
	return true
}

// choiceIndex is a choice's index (its first "index" member, read as gjson reads an int).
func choiceIndex(ch string) int {
	idx := 0
	eachMember(ch, func(k, v string) bool {
		if keyString(k) == "index" {
			idx = int(gjson.Parse(v).Int())
			return false
		}
		return true
	})
	return idx
}

// choice returns the choice of index idx, added if new (its buffers kept from an earlier
// answer). The pointer is good until the next call.
func (g *aggregate) choice(idx int) *choice {
	for i := range g.choices {
		if g.choices[i].index == idx {
			return &g.choices[i]
		}
	}
	n := len(g.choices)
	if n < cap(g.choices) {
		g.choices = g.choices[:n+1]
	} else {
		g.choices = append(g.choices, choice{})
	}
	c := &g.choices[n]
	for i := range c.text {
		c.text[i].v = c.text[i].v[:0]
	}
	*c = choice{index: idx, lpNull: true, text: c.text[:0], other: c.other[:0], logprobs: c.logprobs[:0]}
	return c
}

// appendText appends the raw JSON value v to the choice's text k, if it is a string.
func (c *choice) appendText(k, v string) {
	if v[0] != '"' {
		return
	}
	var i int
	var fresh bool
	if c.text, i, fresh = findOrGrow(c.text, func(t *textField) bool { return t.k == k }); fresh {
		c.text[i].k, c.text[i].v = name(k), c.text[i].v[:0]
	}
	c.text[i].v = append(c.text[i].v, stringValue(v)...)
}

func (c *choice) add(g *aggregate, ch string) {
	eachMember(ch, func(k, v string) bool {
		switch key := keyString(k); key {
		case "index":
		case "delta":
			eachMember(v, func(dk, dv string) bool {
				switch dkey := keyString(dk); dkey {
				case "role":
					if dv[0] == '"' {
						c.role = name(stringValue(dv))
					}
				case "tool_calls":
					c.addTools(gjson.Parse(dv))
				default:
					c.appendText(dkey, dv)
				}
				return true
			})
		case "text":
			if !g.chat {
				c.appendText("text", v)
			}
		case "logprobs":
			c.addLogprobs(g, gjson.Parse(v))
		default:
			i := slices.IndexFunc(c.other, func(m member) bool { return m.k == key })
			switch {
			case v != "null" && i >= 0:
				c.other[i].v = g.keep(v)
			case v != "null":
				c.other = append(c.other, member{k: name(key), v: g.keep(v)})
			case i < 0:
				c.other = append(c.other, member{k: name(key), v: jsonNull})
			}
		}
		return true
	})
}

func (c *choice) addTools(ds gjson.Result) {
	ds.ForEach(func(_, d gjson.Result) bool {
		if !d.IsObject() {
			return true
		}
		idx := int(d.Get("index").Int())
		i := slices.IndexFunc(c.tools, func(t *toolCall) bool { return t.index == idx })
		if i < 0 {
			c.tools = append(c.tools, &toolCall{index: idx})
			i = len(c.tools) - 1
		}
		t := c.tools[i]
		if id := d.Get("id"); id.Exists() && id.Type != gjson.Null {
			t.id = []byte(id.Raw)
		}
		if typ := d.Get("type"); typ.Exists() && typ.Type != gjson.Null {
			t.typ = []byte(typ.Raw)
		}
		if n := d.Get("function.name"); n.Type == gjson.String && n.Str != "" {
			t.name = strings.Clone(n.Str)
		}
		if a := d.Get("function.arguments"); a.Type == gjson.String {
			t.arguments = append(t.arguments, a.Str...)
		}
		return true
	})
}

// addLogprobs concatenates an object of lists (chat's content and refusal, completions'
// tokens, token_logprobs, top_logprobs and text_offset).
func (c *choice) addLogprobs(g *aggregate, v gjson.Result) {
	if !v.IsObject() {
		return
	}
	c.lpNull = false
	v.ForEach(func(k, list gjson.Result) bool {
		if !list.IsArray() {
			return true
		}
		key := k.Str
		var i int
		var fresh bool
		if c.logprobs, i, fresh = findOrGrow(c.logprobs, func(l *lpList) bool { return l.k == key }); fresh {
			c.logprobs[i].k, c.logprobs[i].items = name(key), c.logprobs[i].items[:0]
		}
		l := &c.logprobs[i]
		list.ForEach(func(_, e gjson.Result) bool {
			l.items = append(l.items, g.keep(e.Raw))
			return true
		})
		return true
	})
}

// findOrGrow returns s with the index of its first element match accepts, or, with fresh
// set, of one added past its length: a spare element of s's capacity, whose buffers the caller
// keeps and resets, else a zero one appended.
func findOrGrow[T any](s []T, match func(*T) bool) (_ []T, i int, fresh bool) {
	for i := range s {
		if match(&s[i]) {
			return s, i, false
		}
	}
	if i = len(s); i < cap(s) {
		return s[:i+1], i, true
	}
	var zero T
	return append(s, zero), i, true
}

// bytes returns the assembled answer, good until reset.
func (g *aggregate) bytes() []byte {
	slices.SortFunc(g.choices, func(a, b choice) int { return cmp.Compare(a.index, b.index) })
	var arr [16]member
	ms := append(arr[:0], g.top...)
	object := "text_completion"
	if g.chat {
		object = "chat.completion"
	}
	usage := g.usage
	if usage == nil {
		usage = jsonNull
	}
	ms = append(ms, member{k: "choices", kind: mChoices}, member{k: "object", v: []byte(object), kind: mText},
		member{k: "usage", v: usage})
	g.out = g.appendObject(g.out[:0], ms, nil)
	return g.out
}

// appendObject appends the object of ms, its keys sorted; c is the choice whose message,
// logprobs or tool calls ms may hold.
func (g *aggregate) appendObject(b []byte, ms []member, c *choice) []byte {
	slices.SortFunc(ms, func(a, b member) int { return strings.Compare(a.k, b.k) })
	b = append(b, '{')
	for i, m := range ms {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, m.k)
		b = append(b, ':')
		switch m.kind {
		case mRaw:
			b = append(b, m.v...)
		case mText:
			b = appendString(b, unsafeString(m.v))
		case mChoices:
			b = append(b, '[')
			for j := range g.choices {
				if j > 0 {
					b = append(b, ',')
				}
				b = g.appendChoice(b, &g.choices[j])
			}
			b = append(b, ']')
		case mMessage:
			b = g.appendMessage(b, c)
		case mLogprobs:
			b = appendLogprobs(b, c)
		case mTools:
			b = appendTools(b, c)
		}
	}
	return append(b, '}')
}

func (g *aggregate) appendChoice(b []byte, c *choice) []byte {
	var arr [12]member
	var num [20]byte
	ms := append(arr[:0], member{k: "index", v: strconv.AppendInt(num[:0], int64(c.index), 10)})
	finish := false
	for _, m := range c.other {
		if g.chat && m.k == "message" {
			continue // the assembled message's place
		}
		finish = finish || m.k == "finish_reason"
		ms = append(ms, m)
	}
	if !finish {
		ms = append(ms, member{k: "finish_reason", v: jsonNull})
	}
	if c.lpNull {
		ms = append(ms, member{k: "logprobs", v: jsonNull})
	} else {
		ms = append(ms, member{k: "logprobs", kind: mLogprobs})
	}
	if g.chat {
		ms = append(ms, member{k: "message", kind: mMessage})
	} else {
		var text []byte
		if i := slices.IndexFunc(c.text, func(t textField) bool { return t.k == "text" }); i >= 0 {
			text = c.text[i].v
		}
		ms = append(ms, member{k: "text", v: text, kind: mText})
	}
	return g.appendObject(b, ms, c)
}

func (g *aggregate) appendMessage(b []byte, c *choice) []byte {
	var arr [8]member
	role := c.role
	if role == "" {
		role = "assistant"
	}
	ms := append(arr[:0], member{k: "role", v: unsafe.Slice(unsafe.StringData(role), len(role)), kind: mText})
	if !slices.ContainsFunc(c.text, func(t textField) bool { return t.k == "content" }) {
		ms = append(ms, member{k: "content", v: jsonNull})
	}
	for _, t := range c.text {
		ms = append(ms, member{k: t.k, v: t.v, kind: mText})
	}
	if len(c.tools) > 0 {
		ms = append(ms, member{k: "tool_calls", kind: mTools})
	}
	return g.appendObject(b, ms, c)
}

// appendLogprobs appends a choice's logprobs object, its lists' keys sorted.
func appendLogprobs(b []byte, c *choice) []byte {
	slices.SortFunc(c.logprobs, func(a, b lpList) int { return strings.Compare(a.k, b.k) })
	b = append(b, '{')
	for i, l := range c.logprobs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, l.k)
		b = append(b, ':', '[')
		for j, e := range l.items {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, e...)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendTools appends a message's tool calls by index, each {"function":{"arguments","name"},
// "id","type"}.
func appendTools(b []byte, c *choice) []byte {
	slices.SortFunc(c.tools, func(a, b *toolCall) int { return cmp.Compare(a.index, b.index) })
	b = append(b, '[')
	for i, t := range c.tools {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"function":{"arguments":`...)
		b = appendString(b, unsafeString(t.arguments))
		b = append(b, `,"name":`...)
		b = appendString(b, t.name)
		b = append(b, `},"id":`...)
		if t.id != nil {
			b = append(b, t.id...)
		} else {
			b = append(b, jsonNull...)
		}
		b = append(b, `,"type":`...)
		if t.typ != nil {
			b = append(b, t.typ...)
		} else {
			b = append(b, `"function"`...)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// The chunks' members are read by a scanner of valid JSON (add checks it first): one pass
// over a chunk where gjson's ForEach read every value twice.

// eachMember calls f with each member of the JSON object d, its key as written (quoted) and its
// raw value, until f returns false.
func eachMember(d string, f func(k, v string) bool) {
	i := skipSpaceString(d, 0)
	if i == len(d) || d[i] != '{' {
		return
	}
	for i++; ; i++ {
		i = skipSpaceString(d, i)
		if i == len(d) || d[i] != '"' {
			return
		}
		ks := i
		i = skipString(d, i)
		k := d[ks:i]
		if i = skipSpaceString(d, i); i == len(d) || d[i] != ':' {
			return
		}
		vs := skipSpaceString(d, i+1)
		i = skipValue(d, vs)
		if vs == i || !f(k, d[vs:i]) {
			return
		}
		if i = skipSpaceString(d, i); i == len(d) || d[i] != ',' {
			return
		}
	}
}

// eachElem calls f with each element of the JSON array d, raw, until f returns false.
func eachElem(d string, f func(v string) bool) {
	i := skipSpaceString(d, 0)
	if i == len(d) || d[i] != '[' {
		return
	}
	for i++; ; i++ {
		vs := skipSpaceString(d, i)
		i = skipValue(d, vs)
		if vs == i || !f(d[vs:i]) {
			return
		}
		if i = skipSpaceString(d, i); i == len(d) || d[i] != ',' {
			return
		}
	}
}

// skipValue returns the end of the JSON value at d[i:] (i itself where there is none).
func skipValue(d string, i int) int {
	if i == len(d) {
		return i
	}
	switch d[i] {
	case '"':
		return skipString(d, i)
	case '{', '[':
		depth := 0
		for ; i < len(d); i++ {
			switch d[i] {
			case '"':
				i = skipString(d, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return i
	case '}', ']', ',', ':':
		return i
	}
	for i < len(d) && d[i] != ',' && d[i] != '}' && d[i] != ']' && d[i] != ' ' && d[i] != '\t' && d[i] != '\n' && d[i] != '\r' {
		i++
	}
	return i
}

// skipString returns the end of the JSON string at d[i:], its closing quote included.
func skipString(d string, i int) int {
	for i++; ; i++ {
		j := strings.IndexByte(d[i:], '"')
		if j < 0 {
			return len(d)
		}
		i += j
		n := 0 // the backslashes before the quote: an odd number escapes it
		for k := i - 1; d[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return i + 1
		}
	}
}

func skipSpaceString(d string, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r') {
		i++
	}
	return i
}

// stringValue is the JSON string v's value: v without its quotes when nothing is escaped.
func stringValue(v string) string {
	if strings.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1]
	}
	return gjson.Parse(v).Str
}

// keyString is a member's key as written, unquoted and unescaped.
func keyString(k string) string { return stringValue(k) }

// appendString appends s as a JSON string, as encoding/json writes it: HTML characters, U+2028
// and U+2029 escaped, invalid UTF-8 as U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
