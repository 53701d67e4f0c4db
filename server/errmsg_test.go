package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestErrorsTellTheFix: a refused request's answer names the field (or the flag) at fault and
// says what to write instead: the body limit and --max-body-bytes for a 413, the form and an
// example for a field of the wrong type (native and Dynamo-compatible bodies, nested fields,
// list elements), and the model's field when a request names none.
func TestErrorsTellTheFix(t *testing.T) {
	h := newHarness(t)
	if err := h.c.Register(client.Worker{ID: 1, Model: "m", BlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	f := func(path, ctype string, body []byte, status int, field string, says ...string) {
		t.Helper()
		code, answer := h.post(path, ctype, body)
		var e struct{ Error, Field string }
		if err := json.Unmarshal([]byte(answer), &e); err != nil {
			t.Fatalf("%s %.60s: answer %q is not a JSON error", path, body, answer)
		}
		if code != status || e.Field != field {
			t.Fatalf("%s %.60s: %d field %q (%s), want %d naming %q", path, body, code, e.Field, e.Error, status, field)
		}
		for _, s := range says {
			if !strings.Contains(e.Error, s) {
				t.Fatalf("%s %.60s: %q does not say %q", path, body, e.Error, s)
			}
		}
	}
	js := func(s string) []byte { return []byte(s) }

	// The body limit (64 KiB in the harness) and the flag that raises it.
	f("/v1/route", "", make([]byte, 65<<10), 413, "body", "limit of 65536 bytes", "--max-body-bytes")

	// A field of the wrong type: its form and an example, and what came instead.
	f("/v1/workers", "", js(`{"worker_id":2,"model":"m","dp_ranks":2}`), 400, "dp_ranks",
		"dp_ranks: a list of ranks, e.g. [0,1]; got a number")
	f("/v1/workers", "", js(`{"worker_id":"2","model":"m"}`), 400, "worker_id", "worker_id: a worker id, an integer ≥ 0, e.g. 1; got a string")
	f("/v1/workers", "", js(`{"worker_id":2,"model":7}`), 400, "model", `model: the model's name, a string, e.g. "llama"; got a number`)
	f("/v1/route", "", js(`{"request_id":"r","model":"m","token_ids":"1 2 3"}`), 400, "token_ids",
		"token_ids: a list of token ids, e.g. [1,2,3]; got a string")
	f("/v1/route", "", js(`{"request_id":"r","model":"m","token_ids":[1,-2]}`), 400, "token_ids",
		"got -2 in it (want each an integer from 0 to 4294967295)")
	f("/v1/route", "", js(`{"request_id":"r","model":"m","token_ids":[1],"pinned_worker":1}`), 400, "pinned_worker",
		`pinned_worker: an object, e.g. {"worker_id": 1, "dp_rank": 0}; got a number`)
	f("/v1/route", "", js(`{"request_id":"r","model":"m","token_ids":[1],"router_config_override":{"router_temperature":"hot"}}`), 400,
		"router_config_override.router_temperature", "router_config_override.router_temperature: a number, e.g. 0.5; got a string")
	f("/v1/route", "", js(`{"request_id":"r","model":"m","token_ids":[1],"disagg":"yes"}`), 400, "disagg", "disagg: true or false; got a string")
	f("/v1/events", "", js(`{"worker_id":1,"events":[{"type":"stored","block_hashes":700}]}`), 400, "events.block_hashes",
		"events.block_hashes: a list of block hashes (64-bit integers), e.g. [700,701]; got a number")
	f("/v1/events", "", js(`{"worker_id":1,"events":{"type":"stored"}}`), 400, "events", "events: a list of events, e.g. [{")
	f("/v1/requests/r/output", "", js(`{"generated_tokens":"12"}`), 400, "generated_tokens",
		"generated_tokens: the tokens generated so far, an integer ≥ 0, e.g. 12; got a string")
	// Dynamo's bodies: 422, as Dynamo answers a type error, with the same help.
	f("/register", "", js(`{"instance_id":3,"model_name":"m","block_size":4,"dp_rank":"0"}`), 422, "dp_rank",
		"dp_rank: a rank, an integer ≥ 0, e.g. 0; got a string")
	f("/query", "", js(`{"model_name":"m","token_ids":[[1,2]]}`), 422, "token_ids", "token_ids: a list of token ids, e.g. [1,2,3]; got a list in it")

	// No model: the field the endpoint calls it, required.
	f("/v1/route", "", js(`{"request_id":"r","token_ids":[1,2,3,4]}`), 400, "model", `"model"`, "required", `e.g. "llama"`)
	f("/v1/match", "", js(`{"token_ids":[1,2,3,4]}`), 400, "model", "required")
	f("/v1/route", wire.ContentType, wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "r", Tokens: []uint32{1, 2, 3, 4}}), 400, "model", "required")
	f("/v1/workers", "", js(`{"worker_id":2}`), 400, "model", "required: the name of the model the worker serves")
	f("/register", "", js(`{"instance_id":3,"block_size":4}`), 422, "model_name", "missing field `model_name`")
	f("/register", "", js(`{"instance_id":3,"model_name":"","block_size":4}`), 400, "model_name", "required")
	f("/query", "", js(`{"token_ids":[1,2,3,4]}`), 422, "model_name", "missing field `model_name`")
}
