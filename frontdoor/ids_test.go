package frontdoor

import (
	"encoding/json"
	"slices"
	"testing"
)

// idsCases are token id lists and what is not one.
var idsCases = []string{`[]`, ` [ ] `, `[0]`, `[1,2,3]`, "[ 1 ,\n2\t]", `[4294967295]`, `[4294967296]`,
	`[-1]`, `[1.0]`, `[1e2]`, `[01]`, `[1,]`, `[,1]`, `[1 2]`, `[null]`, `null`, `"[1]"`, `{}`, `[1]x`,
	`[1`, ``, `[18446744073709551616]`, `[true]`, `[[1]]`}

// TestTokenIDs: the hand decoder and encoding/json agree on every case: ids and error alike.
func TestTokenIDs(t *testing.T) {
	for _, c := range idsCases {
		checkTokenIDs(t, []byte(c))
	}
}

func checkTokenIDs(t *testing.T, b []byte) {
	t.Helper()
	var want []uint32
	wantErr := json.Unmarshal(b, &want)
	var got tokenIDs
	err := got.UnmarshalJSON(b)
	if !json.Valid(b) {
		return // encoding/json checks validity before it calls a decoder: not ours to
	}
	if (err != nil) != (wantErr != nil) || !slices.Equal(got, want) || (got == nil) != (want == nil) {
		t.Fatalf("%q: %v %v, want %v %v", b, got, err, want, wantErr)
	}
}

// FuzzTokenIDs: the hand decoder agrees with encoding/json on any JSON.
func FuzzTokenIDs(f *testing.F) {
	for _, c := range idsCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkTokenIDs)
}
