package frontdoor

import (
	"encoding/json"
	"math"
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
func appendIDs(dst []uint32, b []byte) (ids []uint32, ok bool) {
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

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
