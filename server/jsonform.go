package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
)

// A JSON field of the wrong type is answered with the form the field takes and an example,
// so that the client's author sees the fix in the answer: "dp_ranks: a list of ranks, e.g.
// [0,1]; got a number".

// fieldForms are the forms of the fields a client most often writes by hand, by JSON name, in
// the native and Dynamo-compatible bodies alike. Other fields are described from their Go type.
var fieldForms = map[string]string{
	"dp_ranks":               "a list of ranks, e.g. [0,1]",
	"dp_rank":                "a rank, an integer ≥ 0, e.g. 0",
	"token_ids":              "a list of token ids, e.g. [1,2,3]",
	"block_hashes":           "a list of block hashes (64-bit integers), e.g. [700,701]",
	"parent_hash":            "a block hash (a 64-bit integer), e.g. 700",
	"mm_hashes":              "a list per block of its multimodal hashes, e.g. [[11,12],[]]",
	"allowed_workers":        "a list of worker ids, e.g. [1,2]",
	"allowed_worker_ids":     "a list of worker ids, e.g. [1,2]",
	"worker_id":              "a worker id, an integer ≥ 0, e.g. 1",
	"instance_id":            "an instance id, an integer ≥ 0, e.g. 1",
	"model":                  `the model's name, a string, e.g. "llama"`,
	"model_name":             `the model's name, a string, e.g. "llama"`,
	"block_size":             "tokens per block, an integer, e.g. 16",
	"request_id":             `a string, e.g. "r1"`,
	"session_id":             `a string, e.g. "s1"`,
	"pinned_worker":          `an object, e.g. {"worker_id": 1, "dp_rank": 0}`,
	"router_config_override": `an object, e.g. {"overlap_score_weight": 0.5, "router_temperature": 0}`,
	"events":                 `a list of events, e.g. [{"type": "stored", "event_id": 1, "block_hashes": [700], "token_ids": [1,2,3,4]}]`,
	"endpoint":               `a ZMQ endpoint, a string, e.g. "tcp://10.0.0.5:5557"`,
	"replay_endpoint":        `a ZMQ endpoint, a string, e.g. "tcp://10.0.0.5:5558"`,
	"http_endpoint":          `a base URL, a string, e.g. "http://10.0.0.5:8000"`,
	"api_key":                `the worker's own API key, a string of printable ASCII`,
	"generated_tokens":       "the tokens generated so far, an integer ≥ 0, e.g. 12",
}

// typeErrorMsg says which field has the wrong type, the form it takes, and what came instead.
func typeErrorMsg(te *json.UnmarshalTypeError) string {
	name := te.Field[strings.LastIndexByte(te.Field, '.')+1:]
	form, ok := fieldForms[name]
	if !ok {
		form = goForm(te.Type)
	}
	got := gotForm(te.Value)
	// An element of a list: te.Type is the element's type, not the list's.
	inList := ok && strings.HasPrefix(form, "a list") && te.Type.Kind() != reflect.Slice
	if inList {
		got += " in it"
	}
	msg := fmt.Sprintf("%s: %s; got %s", te.Field, form, got)
	if lo, hi, isInt := intRange(te.Type); isInt && strings.HasPrefix(te.Value, "number ") {
		what := "an integer"
		if inList {
			what = "each an integer"
		}
		msg += fmt.Sprintf(" (want %s from %d to %d)", what, lo, hi)
	}
	return msg
}

// jsonErrText is the message for an error of encoding/json's Unmarshal: typeErrorMsg's for a
// field of the wrong type, with that field; the error's own text otherwise.
func jsonErrText(err error) (field, msg string) {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return te.Field, typeErrorMsg(te)
	}
	return "body", err.Error()
}

// gotForm names what encoding/json found ("number", "number -1", "string", "object", …).
func gotForm(v string) string {
	if n, ok := strings.CutPrefix(v, "number "); ok {
		return n
	}
	switch v {
	case "object":
		return "an object"
	case "array":
		return "a list"
	case "bool":
		return "true or false"
	case "":
		return "something else"
	}
	return "a " + v
}

// goForm describes the JSON form of a Go type, with an example.
func goForm(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return `a string, e.g. "text"`
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer, e.g. 1"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer ≥ 0, e.g. 1"
	case reflect.Float32, reflect.Float64:
		return "a number, e.g. 0.5"
	case reflect.Slice, reflect.Array:
		switch e := t.Elem(); e.Kind() {
		case reflect.String:
			return `a list of strings, e.g. ["a","b"]`
		case reflect.Struct, reflect.Map, reflect.Pointer:
			return "a list of objects, e.g. [{}]"
		default:
			if _, _, ok := intRange(e); ok {
				return "a list of integers, e.g. [1,2]"
			}
			return "a list, e.g. [1,2]"
		}
	case reflect.Struct, reflect.Map:
		return "an object, e.g. {}"
	}
	return "another JSON type"
}

// intRange is the range of an integer type; ok is false for other types.
func intRange(t reflect.Type) (lo int64, hi uint64, ok bool) {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits := t.Bits()
		return -1 << (bits - 1), 1<<(bits-1) - 1, true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if t.Bits() == 64 {
			return 0, math.MaxUint64, true
		}
		return 0, 1<<t.Bits() - 1, true
	}
	return 0, 0, false
}
