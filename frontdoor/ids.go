package frontdoor

import (
	"encoding/json"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// tokenIDs is a list of token ids in JSON (nvext.token_data, a completion's prompt, /tokenize's
// answer). Its decoder reads a list of plain integers by hand, which encoding/json's reflection
// made a large part of a request's decoding; any other JSON (null, a number with a fraction or
// an exponent, one out of range, a string, …) is left to encoding/json, so that the two always
// agree, errors included.
type tokenIDs []uint32

func (t *tokenIDs) UnmarshalJSON(b []byte) error {
	if ids, ok := appendIDs((*t)[:0], b); ok {
		*t = ids
		return nil
	}
	var ids []uint32
	err := json.Unmarshal(b, &ids)
	*t = ids
	return err
}

// appendIDs appends the ids of b, a JSON list of integers in [0, 2^32), to dst; ok is false
// when b is anything else.
func appendIDs[B ~string | ~[]byte](dst []uint32, b B) (ids []uint32, ok bool) {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '[' {
		return nil, false
	}
	if dst == nil {
		dst = []uint32{}
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return dst, skipSpace(b, i+1) == len(b)
	}
	for {
		start := i
		var v uint64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			v = v*10 + uint64(b[i]-'0')
			if v > math.MaxUint32 {
				return nil, false
			}
			i++
		}
		if i == start || (b[start] == '0' && i-start > 1) {
			return nil, false
		}
		dst = append(dst, uint32(v))
		i = skipSpace(b, i)
		if i == len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return dst, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

func skipSpace[B ~string | ~[]byte](b B, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// decodeObject decodes a request body, a JSON object, into its members' raw values, as
// json.Unmarshal into a map[string]json.RawMessage does (the last of a key twice wins; a body
// of null is a nil map), in one pass of gjson: encoding/json's reflection took most of a
// request's decoding. What gjson finds invalid, or is not an object, goes to json.Unmarshal,
// for its answer and its error.
func decodeObject(b []byte) (map[string]json.RawMessage, error) {
	if !gjson.ValidBytes(b) {
		return decodeObjectJSON(b)
	}
	root := gjson.Parse(unsafeString(b))
	if !root.IsObject() {
		return decodeObjectJSON(b)
	}
	m := make(map[string]json.RawMessage, 8)
	odd := false
	root.ForEach(func(k, v gjson.Result) bool {
		if strings.IndexByte(k.Raw, '\\') >= 0 || !utf8.ValidString(k.Raw) {
			odd = true // a key escaped or not UTF-8: encoding/json's reading of it is the one
			return false
		}
		m[strings.Clone(k.Str)] = json.RawMessage(v.Raw) // copies: b is the request's
		return true
	})
	if odd {
		return decodeObjectJSON(b)
	}
	return m, nil
}

func decodeObjectJSON(b []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	err := json.Unmarshal(b, &m)
	return m, err
}
