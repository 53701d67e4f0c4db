package wire_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// The fuzz targets check that decoding arbitrary bytes never panics, and that whatever decodes
// re-encodes to the identical bytes: the format is canonical. Each also decodes into a value
// that held another message first, and the result must not depend on it.

func FuzzDecodeRouteRequest(f *testing.F) {
	prev := readHex(f, "route_request_hashes.hex")
	f.Add(readHex(f, "route_request_tokens.hex"))
	f.Add(prev)
	f.Add(wire.AppendRouteRequest(nil, randRequest(rand.New(rand.NewPCG(1, 1)), 20, 0)))
	f.Add(wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "r", Model: "m", Tokens: []uint32{1, 2},
		PriorityJump: 2, StrictPriority: 1, SessionID: "s", TrackPrefill: wire.False, HasCredit: true, OverlapCredit: 0.5}))
	f.Add(wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "r", Model: "m", Tokens: []uint32{1, 2}, Disagg: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fresh, reused wire.RouteRequest
		if err := wire.DecodeRouteRequest(prev, &reused); err != nil {
			t.Fatal(err)
		}
		err := wire.DecodeRouteRequest(b, &fresh)
		if err2 := wire.DecodeRouteRequest(b, &reused); (err == nil) != (err2 == nil) {
			t.Fatalf("fresh: %v, reused: %v", err, err2)
		}
		if err != nil {
			return
		}
		if err := fresh.Validate(); err != nil {
			t.Fatalf("decoded a value that does not validate: %v", err)
		}
		if enc := wire.AppendRouteRequest(nil, &fresh); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", enc, b)
		}
		if enc := wire.AppendRouteRequest(nil, &reused); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded after reuse\n%x\nfrom\n%x", enc, b)
		}
	})
}

func FuzzDecodeRouteResponse(f *testing.F) {
	prev := readHex(f, "route_response.hex")
	f.Add(prev)
	f.Add(readHex(f, "route_response_match.hex"))
	f.Add(wire.AppendRouteResponse(nil, randResponse(rand.New(rand.NewPCG(1, 1)), 3)))
	f.Add(wire.AppendRouteResponse(nil, &wire.RouteResponse{RequestID: "r", Mode: 1, Chosen: true, Worker: 7, Rank: 1,
		Candidates: []wire.Candidate{{Worker: 7, Rank: 1}}, Prefill: true, PrefillWorker: 3, PrefillRank: 2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fresh, reused wire.RouteResponse
		if err := wire.DecodeRouteResponse(prev, &reused); err != nil {
			t.Fatal(err)
		}
		err := wire.DecodeRouteResponse(b, &fresh)
		if err2 := wire.DecodeRouteResponse(b, &reused); (err == nil) != (err2 == nil) {
			t.Fatalf("fresh: %v, reused: %v", err, err2)
		}
		if err != nil {
			return
		}
		if err := fresh.Validate(); err != nil {
			t.Fatalf("decoded a value that does not validate: %v", err)
		}
		if enc := wire.AppendRouteResponse(nil, &fresh); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", enc, b)
		}
		if enc := wire.AppendRouteResponse(nil, &reused); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded after reuse\n%x\nfrom\n%x", enc, b)
		}
	})
}

func FuzzDecodeEventBatch(f *testing.F) {
	prev := readHex(f, "event_batch.hex")
	f.Add(prev)
	f.Add(wire.AppendEventBatch(nil, randBatch(rand.New(rand.NewPCG(1, 1)), 6, 3, 2)))
	f.Add(wire.AppendEventBatch(nil, &wire.EventBatch{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fresh, reused wire.EventBatch
		if err := wire.DecodeEventBatch(prev, &reused); err != nil {
			t.Fatal(err)
		}
		err := wire.DecodeEventBatch(b, &fresh)
		if err2 := wire.DecodeEventBatch(b, &reused); (err == nil) != (err2 == nil) {
			t.Fatalf("fresh: %v, reused: %v", err, err2)
		}
		if err != nil {
			return
		}
		if err := fresh.Validate(); err != nil {
			t.Fatalf("decoded a value that does not validate: %v", err)
		}
		if enc := wire.AppendEventBatch(nil, &fresh); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", enc, b)
		}
		if enc := wire.AppendEventBatch(nil, &reused); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded after reuse\n%x\nfrom\n%x", enc, b)
		}
	})
}
