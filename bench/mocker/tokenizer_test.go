package mocker

import (
	"hash/fnv"
	"slices"
	"strings"
	"testing"
)

// hashed is the id the rule gives a piece outside the fixed words, computed with the standard
// library's FNV-1a.
func hashed(p string) uint32 {
	h := fnv.New64a()
	h.Write([]byte(p))
	return firstHashID + uint32(h.Sum64()%(VocabSize-firstHashID))
}

func word(w string) uint32 {
	i := slices.Index(words[:], w)
	if i < 0 {
		panic(w + " is not a fixed word")
	}
	return firstWordID + uint32(i)
}

func TestTokenizerRule(t *testing.T) {
	f := func(text string, bos bool, want ...uint32) {
		t.Helper()
		if got := AppendTokens(nil, text, bos); !slices.Equal(got, want) {
			t.Errorf("AppendTokens(%q, %v) = %v, want %v", text, bos, got, want)
		}
	}
	f("", false)
	f("", true, BOSID)
	f("  \n\t ", false)
	f("Hello, world!", true, BOSID, hashed("Hello"), hashed(","), word("world"), hashed("!"))
	f("the  cache\nblock", false, word("the"), word("cache"), word("block"))
	f("The cache", false, hashed("The"), word("cache")) // case is kept
	f("snake_case x42 42", false, hashed("snake_case"), hashed("x42"), hashed("42"))
	f("naïve 東京。", false, hashed("naïve"), hashed("東京"), hashed("。"))
	f("<|im_start|>user\nhi<|im_end|>", false, IMStartID, word("user"), hashed("hi"), IMEndID)
	f("a<|eos|>b <|pad|><|bos|>", false, word("a"), EOSID, hashed("b"), PadID, BOSID)
	f("<|nope|>", false, hashed("<"), hashed("|"), hashed("nope"), hashed("|"), hashed(">"))
	f("a\xffb", false, word("a"), hashed("\xff"), hashed("b"))

	// Golden ids: the rule may never change what a text gives.
	f("Hello, world!", true, 1, 26987, 29515, 105, 13772)

	for _, id := range AppendTokens(nil, strings.Repeat("any text at all, 12 ∑ pieces! ", 20), true) {
		if id >= VocabSize {
			t.Fatalf("id %d ≥ VocabSize", id)
		}
	}
}

func TestDecodeAndOutput(t *testing.T) {
	ids := AppendTokens(nil, "<|im_start|>assistant\nthe quick brown fox<|im_end|>", true)
	if got := Decode(ids); got != "<|bos|> <|im_start|> assistant the quick brown fox <|im_end|>" {
		t.Errorf("Decode = %q", got)
	}
	if back := AppendTokens(nil, Decode(ids), false); !slices.Equal(back, ids) {
		t.Errorf("fixed words and specials do not round-trip: %v, want %v", back, ids)
	}
	if got := TokenText(hashed("Hello")); got != "[26987]" {
		t.Errorf("TokenText of a hashed piece = %q", got)
	}

	// The generated text tokenizes back to the generated ids, which cycle through the words
	// from the prompt's seed on.
	prompt := []uint32{7, 50000}
	seed := OutputSeed(prompt)
	h := fnv.New64a()
	h.Write([]byte{7, 0, 0, 0, 0x50, 0xc3, 0, 0})
	if seed != h.Sum64() {
		t.Fatalf("OutputSeed = %x, want FNV-1a of the ids' bytes %x", seed, h.Sum64())
	}
	if OutputSeed([]uint32{50000, 7}) == seed {
		t.Errorf("the seed ignores the order of the ids")
	}
	var out []uint32
	var text strings.Builder
	for i := range 250 {
		id := OutputToken(seed, i)
		if want := firstWordID + uint32((seed%uint64(len(words))+uint64(i))%uint64(len(words))); id != want {
			t.Fatalf("OutputToken(%d) = %d, want %d", i, id, want)
		}
		out = append(out, id)
		text.WriteString(OutputText(id, i))
	}
	if got := AppendTokens(nil, text.String(), false); !slices.Equal(got, out) {
		t.Errorf("generated text tokenizes to %v, want %v", got[:8], out[:8])
	}
	if first := TokenText(out[0]); !strings.HasPrefix(text.String(), first+" "+TokenText(out[1])) {
		t.Errorf("text %.30q", text.String())
	}
}

func TestChatTemplate(t *testing.T) {
	msgs := []Message{{"system", "Be brief."}, {"user", "Hi there"}}
	f := func(tpl ChatTemplate, want string) {
		t.Helper()
		if got := RenderChat(msgs, tpl); got != want {
			t.Errorf("RenderChat(%+v) = %q, want %q", tpl, got, want)
		}
		ids := AppendChat(nil, msgs, tpl)
		if wantIDs := AppendTokens(nil, want, tpl.AddSpecialTokens); !slices.Equal(ids, wantIDs) {
			t.Errorf("AppendChat(%+v) = %v, want %v", tpl, ids, wantIDs)
		}
	}
	f(ChatTemplate{AddGenerationPrompt: true},
		"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
	f(ChatTemplate{}, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n")
	f(ChatTemplate{ContinueFinalMessage: true, AddSpecialTokens: true},
		"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there")

	ids := AppendChat(nil, msgs, ChatTemplate{AddGenerationPrompt: true, AddSpecialTokens: true})
	want := []uint32{BOSID, IMStartID, word("system"), hashed("Be"), hashed("brief"), hashed("."), IMEndID,
		IMStartID, word("user"), hashed("Hi"), word("there"), IMEndID, IMStartID, word("assistant")}
	if !slices.Equal(ids, want) {
		t.Errorf("chat ids %v, want %v", ids, want)
	}
}

func BenchmarkAppendTokens(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog, again and again. ", 64)
	var dst []uint32
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		dst = AppendTokens(dst[:0], text, true)
	}
}
