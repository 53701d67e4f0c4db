package mocker

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The tokenizer's ids (see the package documentation for the rule). They are part of what the
// mocker promises: the same text gives the same ids in every release.
const (
	PadID     uint32 = 0 // <|pad|>
	BOSID     uint32 = 1 // <|bos|>, prepended when special tokens are added
	EOSID     uint32 = 2 // <|eos|>
	IMStartID uint32 = 3 // <|im_start|>, opens a chat message
	IMEndID   uint32 = 4 // <|im_end|>, closes a chat message

	firstWordID = 16   // words[i] is firstWordID + i
	firstHashID = 1024 // other pieces hash into [firstHashID, VocabSize)
	// VocabSize bounds every id the tokenizer makes.
	VocabSize = 32000
)

var specials = [...]string{"<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"}

// words are the pieces with fixed ids, and the only ones generated. Their order is part of the
// id rule: append, never reorder.
var words = [...]string{
	"the", "of", "and", "to", "in", "a", "is", "that", "for", "it",
	"as", "was", "with", "be", "by", "on", "not", "he", "this", "are",
	"or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
	"you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
	"been", "if", "more", "when", "will", "would", "who", "so", "no", "cache",
	"block", "token", "prefix", "router", "worker", "model", "request", "prompt", "stream", "event",
	"fast", "small", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "river",
	"stone", "light", "water", "green", "blue", "red", "cloud", "tree", "sun", "moon",
	"north", "south", "east", "west", "time", "day", "night", "year", "way", "world",
	"system", "user", "assistant", "tool", "hello", "answer", "question", "number", "list", "word",
}

var wordIDs = func() map[string]uint32 {
	m := make(map[string]uint32, len(words))
	for i, w := range words {
		m[w] = firstWordID + uint32(i)
	}
	return m
}()

// AppendTokens appends the ids of text to dst and returns the extended slice, with BOSID first
// when addSpecial is set. The rule: the special tokens' texts (<|bos|>, <|im_start|>, …) are
// their ids wherever they appear; white space separates pieces and is dropped; a run of letters,
// digits and underscores is one piece, any other character a piece of its own; a piece among
// the fixed words has its fixed id, any other one firstHashID + FNV-1a-64(piece's UTF-8 bytes)
// mod (VocabSize − firstHashID). Case is kept. Each byte of invalid UTF-8 is a piece of its own.
func AppendTokens(dst []uint32, text string, addSpecial bool) []uint32 {
	if addSpecial {
		dst = append(dst, BOSID)
	}
	for i := 0; i < len(text); {
		if text[i] == '<' {
			if id, n, ok := special(text[i:]); ok {
				dst = append(dst, id)
				i += n
				continue
			}
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		switch {
		case unicode.IsSpace(r):
			i += size
		case isWordRune(r):
			j := i + size
			for j < len(text) {
				r, n := utf8.DecodeRuneInString(text[j:])
				if !isWordRune(r) {
					break
				}
				j += n
			}
			dst = append(dst, pieceID(text[i:j]))
			i = j
		default:
			dst = append(dst, pieceID(text[i:i+size]))
			i += size
		}
	}
	return dst
}

func isWordRune(r rune) bool {
	return r == '_' || r != utf8.RuneError && (unicode.IsLetter(r) || unicode.IsDigit(r))
}

func special(s string) (uint32, int, bool) {
	if !strings.HasPrefix(s, "<|") {
		return 0, 0, false
	}
	for id, sp := range specials {
		if strings.HasPrefix(s, sp) {
			return uint32(id), len(sp), true
		}
	}
	return 0, 0, false
}

func pieceID(p string) uint32 {
	if id, ok := wordIDs[p]; ok {
		return id
	}
	h := uint64(14695981039346656037) // FNV-1a 64
	for i := 0; i < len(p); i++ {
		h ^= uint64(p[i])
		h *= 1099511628211
	}
	return firstHashID + uint32(h%(VocabSize-firstHashID))
}

// TokenText is id's text: a special token's or a word's own text, "[id]" for any other id (a
// hashed piece cannot be recovered from its id).
func TokenText(id uint32) string {
	switch {
	case int(id) < len(specials):
		return specials[id]
	case id >= firstWordID && int(id-firstWordID) < len(words):
		return words[id-firstWordID]
	}
	return "[" + strconv.FormatUint(uint64(id), 10) + "]"
}

// Decode is the text of ids: their TokenTexts joined by single spaces. Text made of fixed
// words and special tokens tokenizes back to the same ids.
func Decode(ids []uint32) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(TokenText(id))
	}
	return b.String()
}

// OutputSeed is what a request's output is drawn from: FNV-1a-64 of its prompt ids (each as 4
// bytes, little-endian), so that different prompts get different answers.
func OutputSeed(prompt []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, id := range prompt {
		for range 4 {
			h ^= uint64(id & 0xff)
			h *= 1099511628211
			id >>= 8
		}
	}
	return h
}

// OutputToken is the i-th output token (from 0) of a request whose prompt has OutputSeed seed:
// the fixed word (seed + i) mod the number of words. Every output token is a fixed word, so the
// generated text tokenizes back to the generated ids.
func OutputToken(seed uint64, i int) uint32 {
	return firstWordID + uint32((seed%uint64(len(words))+uint64(i))%uint64(len(words)))
}

// OutputText is the text of the i-th output token: its word, after a space except for the
// first, so that the pieces of a response concatenate to Decode of its ids.
func OutputText(id uint32, i int) string {
	if i == 0 {
		return TokenText(id)
	}
	return " " + TokenText(id)
}

// appendOutputText appends OutputText(id, i) to dst, without building the string.
func appendOutputText(dst []byte, id uint32, i int) []byte {
	if i > 0 {
		dst = append(dst, ' ')
	}
	return append(dst, TokenText(id)...)
}

// Message is one chat message: a role and its text.
type Message struct {
	Role    string
	Content string
}

// ChatTemplate is the chat template's options, as vLLM's chat endpoints take them.
type ChatTemplate struct {
	AddGenerationPrompt  bool // open an assistant message at the end
	ContinueFinalMessage bool // leave the last message open (no <|im_end|> after it)
	AddSpecialTokens     bool // prepend <|bos|>
}

// RenderChat renders msgs with the fixed chat template (ChatML): each message is
// "<|im_start|>" + role + "\n" + content + "<|im_end|>\n", except that ContinueFinalMessage
// leaves the last one without its "<|im_end|>\n"; AddGenerationPrompt then appends
// "<|im_start|>assistant\n". The caller refuses both options together, as vLLM does.
func RenderChat(msgs []Message, t ChatTemplate) string {
	var b strings.Builder
	for i, m := range msgs {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		if t.ContinueFinalMessage && i == len(msgs)-1 {
			break
		}
		b.WriteString("<|im_end|>\n")
	}
	if t.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

// AppendChat appends the ids of msgs under the template to dst: AppendTokens of RenderChat,
// with <|bos|> first when t.AddSpecialTokens. /tokenize and the chat endpoint both use it, so
// the ids /tokenize returns are the ones the engine caches.
func AppendChat(dst []uint32, msgs []Message, t ChatTemplate) []uint32 {
	return AppendTokens(dst, RenderChat(msgs, t), t.AddSpecialTokens)
}
