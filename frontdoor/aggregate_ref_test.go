package frontdoor

// The aggregation before it was rewritten for speed: maps and encoding/json, kept as the
// reference model the rewrite is checked against (TestAggregateAgainstReference).

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// refAggregate assembles a streamed answer's chunks into the answer a client that did not ask to
// stream expects, as Dynamo's frontend does for the engines it always streams from:
// chat.completion.chunk deltas into a chat.completion's messages (content, reasoning, refusal
// and tool calls concatenated; tool calls by index), text_completion chunks into their choices'
// text; logprobs' lists concatenated; the last finish_reason, stop_reason and usage; the rest of
// the first chunk's fields (id, created, model, system_fingerprint, …) as they are. It belongs
// to one answer's goroutine.
type refAggregate struct {
	chat    bool
	top     map[string]json.RawMessage // the first chunk's other fields
	choices []*refChoice
	usage   json.RawMessage
}

type refChoice struct {
	index    int
	role     string
	text     map[string]*bytes.Buffer // content, reasoning_content, reasoning, refusal; text for completions
	textKeys []string                 // in the order first seen
	tools    []*refToolCall
	logprobs map[string][]json.RawMessage // lists concatenated
	lpKeys   []string
	lpNull   bool                       // every chunk's logprobs null
	other    map[string]json.RawMessage // finish_reason, stop_reason, …: the last non-null
}

type refToolCall struct {
	index     int
	id, typ   json.RawMessage
	name      string
	arguments bytes.Buffer
}

// add takes one chunk (an event's data). It returns false when the chunk is not a JSON
// object. It reads the chunk in place (gjson): an assembled answer reads every token's chunk,
// which decoding into maps made the front door's largest cost.
func (g *refAggregate) add(data []byte) bool {
	if !gjson.ValidBytes(data) {
		return false
	}
	c := gjson.ParseBytes(data)
	if !c.IsObject() {
		return false
	}
	if g.top == nil {
		g.top = map[string]json.RawMessage{}
	}
	c.ForEach(func(k, v gjson.Result) bool {
		key := k.String()
		switch {
		case key == "choices":
			v.ForEach(func(_, ch gjson.Result) bool {
				if ch.IsObject() {
					g.choice(int(ch.Get("index").Int())).add(ch, g.chat)
				}
				return true
			})
		case key == "usage":
			if v.Type != gjson.Null {
				g.usage = json.RawMessage(v.Raw)
			}
		case strings.EqualFold(key, "choices"), strings.EqualFold(key, "object"), strings.EqualFold(key, "usage"):
			// The assembled answer's own; a case variant would shadow it for a lenient reader.
		default:
			if _, ok := g.top[key]; !ok {
				g.top[key] = json.RawMessage(v.Raw)
			}
		}
		return true
	})
	return true
}

func (g *refAggregate) choice(idx int) *refChoice {
	for _, c := range g.choices {
		if c.index == idx {
			return c
		}
	}
	c := &refChoice{index: idx, text: map[string]*bytes.Buffer{}, other: map[string]json.RawMessage{}, lpNull: true}
	g.choices = append(g.choices, c)
	return c
}

func (c *refChoice) appendText(k string, v gjson.Result) {
	if v.Type != gjson.String {
		return
	}
	b := c.text[k]
	if b == nil {
		b = &bytes.Buffer{}
		c.text[k] = b
		c.textKeys = append(c.textKeys, k)
	}
	b.WriteString(v.Str)
}

func (c *refChoice) add(ch gjson.Result, chat bool) {
	ch.ForEach(func(k, v gjson.Result) bool {
		switch key := k.String(); key {
		case "index":
		case "delta":
			v.ForEach(func(dk, dv gjson.Result) bool {
				switch dkey := dk.String(); dkey {
				case "role":
					if dv.Type == gjson.String {
						c.role = dv.Str
					}
				case "tool_calls":
					c.addTools(dv)
				default:
					c.appendText(dkey, dv)
				}
				return true
			})
		case "text":
			if !chat {
				c.appendText("text", v)
			}
		case "logprobs":
			c.addLogprobs(v)
		default:
			if v.Type != gjson.Null {
				c.other[key] = json.RawMessage(v.Raw)
			} else if _, ok := c.other[key]; !ok {
				c.other[key] = json.RawMessage("null")
			}
		}
		return true
	})
}

func (c *refChoice) addTools(ds gjson.Result) {
	ds.ForEach(func(_, d gjson.Result) bool {
		if !d.IsObject() {
			return true
		}
		idx := int(d.Get("index").Int())
		i := slices.IndexFunc(c.tools, func(t *refToolCall) bool { return t.index == idx })
		if i < 0 {
			c.tools = append(c.tools, &refToolCall{index: idx})
			i = len(c.tools) - 1
		}
		t := c.tools[i]
		if id := d.Get("id"); id.Exists() && id.Type != gjson.Null {
			t.id = json.RawMessage(id.Raw)
		}
		if typ := d.Get("type"); typ.Exists() && typ.Type != gjson.Null {
			t.typ = json.RawMessage(typ.Raw)
		}
		if n := d.Get("function.name"); n.Type == gjson.String && n.Str != "" {
			t.name = n.Str
		}
		if a := d.Get("function.arguments"); a.Type == gjson.String {
			t.arguments.WriteString(a.Str)
		}
		return true
	})
}

// addLogprobs concatenates an object of lists (chat's content and refusal, completions'
// tokens, token_logprobs, top_logprobs and text_offset).
func (c *refChoice) addLogprobs(v gjson.Result) {
	if !v.IsObject() {
		return
	}
	c.lpNull = false
	if c.logprobs == nil {
		c.logprobs = map[string][]json.RawMessage{}
	}
	v.ForEach(func(k, list gjson.Result) bool {
		if !list.IsArray() {
			return true
		}
		key := k.String()
		if _, ok := c.logprobs[key]; !ok {
			c.lpKeys = append(c.lpKeys, key)
		}
		l := c.logprobs[key]
		list.ForEach(func(_, e gjson.Result) bool {
			l = append(l, json.RawMessage(e.Raw))
			return true
		})
		c.logprobs[key] = l
		return true
	})
}

// bytes returns the assembled answer, its keys in order as encoding/json orders a map's.
func (g *refAggregate) bytes() []byte {
	slices.SortFunc(g.choices, func(a, b *refChoice) int { return a.index - b.index })
	var chs []byte
	chs = append(chs, '[')
	for i, c := range g.choices {
		if i > 0 {
			chs = append(chs, ',')
		}
		chs = c.appendTo(chs, g.chat)
	}
	chs = append(chs, ']')
	var o refObject
	for k, v := range g.top {
		o.raw(k, v)
	}
	o.raw("choices", chs)
	if g.chat {
		o.str("object", "chat.completion")
	} else {
		o.str("object", "text_completion")
	}
	if g.usage != nil {
		o.raw("usage", g.usage)
	} else {
		o.raw("usage", []byte("null"))
	}
	return o.appendTo(make([]byte, 0, 256+len(chs)))
}

func (c *refChoice) appendTo(b []byte, chat bool) []byte {
	var o refObject
	o.raw("index", strconv.AppendInt(nil, int64(c.index), 10))
	for k, v := range c.other {
		o.raw(k, v)
	}
	if _, ok := c.other["finish_reason"]; !ok {
		o.raw("finish_reason", []byte("null"))
	}
	if c.lpNull {
		o.raw("logprobs", []byte("null"))
	} else {
		var lp refObject
		for _, k := range c.lpKeys {
			l := append([]byte(nil), '[')
			for i, e := range c.logprobs[k] {
				if i > 0 {
					l = append(l, ',')
				}
				l = append(l, e...)
			}
			lp.raw(k, append(l, ']'))
		}
		o.raw("logprobs", lp.appendTo(nil))
	}
	if !chat {
		text := ""
		if t := c.text["text"]; t != nil {
			text = t.String()
		}
		o.str("text", text)
		return o.appendTo(b)
	}
	var msg refObject
	role := c.role
	if role == "" {
		role = "assistant"
	}
	msg.str("role", role)
	msg.raw("content", []byte("null"))
	for _, k := range c.textKeys {
		msg.str(k, c.text[k].String())
	}
	if len(c.tools) > 0 {
		slices.SortFunc(c.tools, func(a, b *refToolCall) int { return a.index - b.index })
		calls := append([]byte(nil), '[')
		for i, t := range c.tools {
			if i > 0 {
				calls = append(calls, ',')
			}
			var call, fn refObject
			fn.str("name", t.name)
			fn.str("arguments", t.arguments.String())
			call.raw("function", fn.appendTo(nil))
			if t.id != nil {
				call.raw("id", t.id)
			} else {
				call.raw("id", []byte("null"))
			}
			if t.typ != nil {
				call.raw("type", t.typ)
			} else {
				call.str("type", "function")
			}
			calls = call.appendTo(calls)
		}
		msg.raw("tool_calls", append(calls, ']'))
	}
	o.raw("message", msg.appendTo(nil))
	return o.appendTo(b)
}

// object builds a JSON object of raw values; a later value of a key replaces an earlier one,
// and appendTo writes the keys sorted.
type refObject struct{ kv []refField }

type refField struct {
	k string
	v []byte
}

func (o *refObject) raw(k string, v []byte) {
	for i := range o.kv {
		if o.kv[i].k == k {
			o.kv[i].v = v
			return
		}
	}
	o.kv = append(o.kv, refField{k, v})
}

func (o *refObject) str(k, v string) { o.raw(k, refAppendString(nil, v)) }

func (o *refObject) appendTo(b []byte) []byte {
	slices.SortFunc(o.kv, func(a, b refField) int { return strings.Compare(a.k, b.k) })
	b = append(b, '{')
	for i, f := range o.kv {
		if i > 0 {
			b = append(b, ',')
		}
		b = refAppendString(b, f.k)
		b = append(b, ':')
		b = append(b, f.v...)
	}
	return append(b, '}')
}

// refAppendString appends s as a JSON string, as encoding/json writes it (HTML characters and
// invalid UTF-8 included).
func refAppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
