package mocker

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// refStop is a plain model of vLLM's stop checks over a request's output: after each token,
// the text so far (a stop token's own text left out, unless include) either contains a stop
// string for the first time — the first such one in the request's order wins and the text is
// cut before it (after it, with include) — or the token is a stop token (but the last allowed
// one, which ends the request by length). It returns the tokens generated, the text and the
// stop reason ("" when none: finish_reason "length").
func refStop(seed uint64, limit int, strs []string, ids []uint32, include bool) (n int, text, reason string) {
	var b strings.Builder
	for i := range limit {
		id := OutputToken(seed, i)
		byID := i+1 < limit && slices.Contains(ids, id)
		if !byID || include {
			b.WriteString(OutputText(id, i))
		}
		t := b.String()
		for _, s := range strs {
			if k := strings.Index(t, s); k >= 0 {
				if include {
					k += len(s)
				}
				return i + 1, t[:k], strconv.Quote(s)
			}
		}
		if byID {
			return i + 1, t, strconv.FormatUint(uint64(id), 10)
		}
	}
	return limit, b.String(), ""
}

// follow runs the mocker's stop logic for a request: the tokens the engine is asked for, then
// each token's streamed delta, then the text a non-streamed answer carries.
func follow(t *testing.T, s *stopSpec, seed uint64, limit int) (n int, deltas []string, text, reason string) {
	t.Helper()
	n = stopAt(s, seed, limit)
	d := &detokenizer{stop: s, seed: seed, limit: limit}
	for d.n < n {
		stopped := d.add()
		if stopped != (d.reason != nil) || (stopped && d.n != n) {
			t.Fatalf("token %d of %d: stopped %v, reason %s", d.n, n, stopped, d.reason)
		}
		deltas = append(deltas, string(d.delta(d.n == n)))
	}
	if d.finish() == "stop" {
		reason = string(d.reason)
	}
	return n, deltas, string(d.text), reason
}

func TestStopStrings(t *testing.T) {
	seed := OutputSeed([]uint32{1, 2, 3})
	var full strings.Builder
	for i := range 300 {
		full.WriteString(OutputText(OutputToken(seed, i), i))
	}
	out := full.String()
	f := func(limit int, stop string, ids []uint32, include bool, wantN int, wantText, wantReason string) {
		t.Helper()
		s, err := parseStop(json.RawMessage(stop), ids, include)
		if err != nil {
			t.Fatal(err)
		}
		n, deltas, text, reason := follow(t, s, seed, limit)
		if n != wantN || text != wantText || reason != wantReason || strings.Join(deltas, "") != text {
			t.Errorf("stop %s ids %v include %v: %d tokens, %q, reason %s, deltas %q; want %d, %q, %s",
				stop, ids, include, n, text, reason, deltas, wantN, wantText, wantReason)
		}
	}
	words := strings.Fields(out)
	w3 := " " + words[3] + " " + words[4] // completed by token 4
	at := strings.Index(out, w3)
	f(10, `null`, nil, false, 10, out[:len(strings.Join(words[:10], " "))], "")
	f(10, strconv.Quote(w3), nil, false, 5, out[:at], strconv.Quote(w3))
	f(10, `["zzz",`+strconv.Quote(w3)+`]`, nil, true, 5, out[:at+len(w3)], strconv.Quote(w3))
	f(4, strconv.Quote(w3), nil, false, 4, strings.Join(words[:4], " "), "") // the limit comes first
	f(5, strconv.Quote(w3), nil, false, 5, out[:at], strconv.Quote(w3))      // a stop string on the last token wins
	// A stop token: its text left out, kept with include; the last allowed token is no stop.
	id2 := OutputToken(seed, 2)
	f(10, ``, []uint32{id2}, false, 3, strings.Join(words[:2], " "), strconv.Itoa(int(id2)))
	f(10, ``, []uint32{id2}, true, 3, strings.Join(words[:3], " "), strconv.Itoa(int(id2)))
	f(3, ``, []uint32{id2}, false, 3, strings.Join(words[:3], " "), "")
	// The output cycles through the fixed words: what is not met within one cycle never is,
	// and stopAt does not run the whole limit to learn it.
	never, _ := parseStop(json.RawMessage(`["never there"]`), []uint32{0}, false)
	if n := stopAt(never, seed, 1<<40); n != 1<<40 {
		t.Errorf("a stop string never met: %d tokens", n)
	}

	for _, bad := range []string{`""`, `["a",""]`, `3`, `[1]`, `{"a":1}`} {
		if _, err := parseStop(json.RawMessage(bad), nil, false); err == nil {
			t.Errorf("stop %s accepted", bad)
		}
	}
	if s, err := parseStop(json.RawMessage(`[]`), nil, false); s != nil || err != nil {
		t.Errorf("stop []: %v %v", s, err)
	}
}

// TestStopStringsRandomized checks the mocker's stop logic against refStop under random stop
// strings (pieces of the output, and strings that never occur), stop tokens, limits and
// include_stop_str_in_output; a stream's deltas add up to the answer's text, and none of them
// shows a piece of a stop string that the answer leaves out.
func TestStopStringsRandomized(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := map[string]int{}
	for iter := range 3000 {
		seed := rng.Uint64()
		var full strings.Builder
		for i := range 400 {
			full.WriteString(OutputText(OutputToken(seed, i), i))
		}
		out := full.String()
		var strs []string
		for range rng.IntN(4) {
			if rng.IntN(5) == 0 {
				strs = append(strs, "q"+strconv.Itoa(rng.IntN(100)))
				continue
			}
			at := rng.IntN(len(out) - 20)
			strs = append(strs, out[at:at+1+rng.IntN(12)])
		}
		var ids []uint32
		for range rng.IntN(3) {
			ids = append(ids, firstWordID+uint32(rng.IntN(len(words)+20)))
		}
		include := rng.IntN(3) == 0
		limit := 1 + rng.IntN(300)
		if len(strs) == 0 && len(ids) == 0 {
			ids = []uint32{0} // no word: something to parse, nothing that stops
		}
		raw, _ := json.Marshal(strs)
		s, err := parseStop(raw, ids, include)
		if err != nil {
			t.Fatal(err)
		}
		n, deltas, text, reason := follow(t, s, seed, limit)
		wn, wtext, wreason := refStop(seed, limit, strs, ids, include)
		if n != wn || text != wtext || reason != wreason || strings.Join(deltas, "") != text {
			t.Fatalf("iteration %d: seed %d limit %d stop %q ids %v include %v:\n got %d %q %s\nwant %d %q %s\ndeltas %q",
				iter, seed, limit, strs, ids, include, n, text, reason, wn, wtext, wreason, deltas)
		}
		switch {
		case reason == "":
			kinds["length"]++
		case reason[0] == '"':
			kinds["string"]++
		default:
			kinds["token"]++
		}
		// While the request runs, what was streamed is a prefix of the final text.
		var sent strings.Builder
		for _, d := range deltas {
			sent.WriteString(d)
			if !strings.HasPrefix(text, sent.String()) {
				t.Fatalf("iteration %d: streamed %q, not a prefix of %q", iter, sent.String(), text)
			}
		}
	}
	if kinds["length"] < 100 || kinds["string"] < 100 || kinds["token"] < 100 {
		t.Errorf("requests ended by kind: %v", kinds)
	}
}
