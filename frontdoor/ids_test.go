package frontdoor

import (
	"encoding/json"
	"reflect"
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

// objectCases are request bodies and what is not one.
var objectCases = []string{`{}`, ` {"model":"m","stream":true,"nvext":{"token_data":[1,2]}} `, `{"a":1,"a":2}`,
	`{"a\u0041":"\u00e9","b":[1,{"c":null}]}`, `null`, `[]`, `"x"`, `{"a":01}`, `{"a":1,}`, `{"a":"\x01"}`,
	"{\"a\":\"\xff\"}", `{"a":1}x`, `{`, ``, `{"a":1e400}`, `{"a":-0.0e-0}`, `{"a":tru}`}

// TestDecodeObject: decodeObject answers as json.Unmarshal into a map of raw values does, errors
// alike.
func TestDecodeObject(t *testing.T) {
	for _, c := range objectCases {
		checkDecodeObject(t, []byte(c))
	}
}

func checkDecodeObject(t *testing.T, b []byte) {
	t.Helper()
	var want map[string]json.RawMessage
	wantErr := json.Unmarshal(b, &want)
	got, err := decodeObject(b)
	if (err != nil) != (wantErr != nil) || (got == nil) != (want == nil) || len(got) != len(want) {
		t.Fatalf("%q: %v %v, want %v %v", b, got, err, want, wantErr)
	}
	for k, v := range want {
		if string(got[k]) != string(v) {
			t.Fatalf("%q: %q is %q, want %q", b, k, got[k], v)
		}
	}
}

// FuzzDecodeObject: decodeObject agrees with json.Unmarshal on any bytes.
func FuzzDecodeObject(f *testing.F) {
	for _, c := range objectCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkDecodeObject)
}

// TestNvextDecode: nvext's decoding answers as json.Unmarshal does, by hand or not.
func TestNvextDecode(t *testing.T) {
	for _, c := range []string{`{"token_data":[1,2]}`, ` { "token_data" : [ 3 ] } `, `{"token_data":[1],"token_data":[2,3]}`,
		`{"token_data":[1,2],"cache_salt":"x"}`, `{"Token_Data":[1]}`, `null`, `5`, `[]`, `{}`, `{"token_data":"x"}`,
		`{"token_data":[-1]}`, `{"token_data":null}`, `{"backend_instance_id":7,"token_data":[4]}`} {
		var want, got nvext
		wantErr := json.Unmarshal([]byte(c), &want)
		err := got.decode(json.RawMessage(c))
		if (err != nil) != (wantErr != nil) || (wantErr == nil && !reflect.DeepEqual(got, want)) {
			t.Errorf("%s: %+v %v, want %+v %v", c, got, err, want, wantErr)
		}
	}
}
