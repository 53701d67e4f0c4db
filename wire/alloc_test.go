package wire_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// TestAllocs checks that encoding into a reused buffer and decoding into a reused value
// allocate nothing once both have grown.
func TestAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	f := func(name string, run func()) {
		t.Helper()
		run() // warm up: buffers and values grow here
		if n := testing.AllocsPerRun(100, run); n != 0 {
			t.Errorf("%s: %v allocations per run, want 0", name, n)
		}
	}
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	buf := make([]byte, 0, 64)

	tokens := randRequest(r, 2048, 0)
	hashes := randRequest(r, 0, 128)
	var req wire.RouteRequest
	for name, x := range map[string]*wire.RouteRequest{"tokens=2048": tokens, "hashes=128": hashes} {
		msg := wire.AppendRouteRequest(nil, x)
		f("AppendRouteRequest "+name, func() { buf = wire.AppendRouteRequest(buf[:0], x) })
		f("DecodeRouteRequest "+name, func() { must(wire.DecodeRouteRequest(msg, &req)) })
	}

	resp := randResponse(r, 1000)
	respMsg := wire.AppendRouteResponse(nil, resp)
	var dresp wire.RouteResponse
	f("AppendRouteResponse", func() { buf = wire.AppendRouteResponse(buf[:0], resp) })
	f("DecodeRouteResponse", func() { must(wire.DecodeRouteResponse(respMsg, &dresp)) })

	batch := randBatch(r, 256, 16, 16)
	batchMsg := wire.AppendEventBatch(nil, batch)
	var dbatch wire.EventBatch
	f("AppendEventBatch", func() { buf = wire.AppendEventBatch(buf[:0], batch) })
	f("DecodeEventBatch", func() { must(wire.DecodeEventBatch(batchMsg, &dbatch)) })

	// The golden batch has multimodal hashes and LoRA names.
	golden := readHex(t, "event_batch.hex")
	f("DecodeEventBatch golden", func() { must(wire.DecodeEventBatch(golden, &dbatch)) })
}
