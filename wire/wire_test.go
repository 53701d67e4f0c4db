package wire_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// readHex reads a commented hex file from testdata: whitespace-separated hex, "#" to the end of
// the line is a comment.
func readHex(tb testing.TB, name string) []byte {
	tb.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	var out []byte
	for i, line := range strings.Split(string(text), "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, f := range strings.Fields(line) {
			b, err := hex.DecodeString(f)
			if err != nil {
				tb.Fatalf("%s:%d: %v", name, i+1, err)
			}
			out = append(out, b...)
		}
	}
	return out
}

// The values the golden files spell out byte by byte.
var (
	goldenRequestTokens = wire.RouteRequest{
		RequestID: "req-1", Model: "llama", Mode: wire.ModeKV,
		HasWeight: true, Weight: 1, HasTemperature: true, Temperature: 0.5,
		Allowed: []uint64{7, 9},
		Tokens:  []uint32{1, 2, 3, 258},
	}
	goldenRequestHashes = wire.RouteRequest{
		Model: "qwen3", LoRA: "sql-adapter", Mode: wire.ModeDirect,
		HasPinned: true, PinnedWorker: 0x0102030405060708, PinnedRank: 2,
		ISL:    48,
		ByHash: true,
		Hashes: []uint64{0xdeadbeefcafef00d, 1},
	}
	goldenResponse = wire.RouteResponse{
		RequestID: "req-1", Mode: wire.ModeKV, Chosen: true, Worker: 9, Rank: 1, Blocks: 3, ISL: 50,
		Candidates: []wire.Candidate{
			{Worker: 9, Rank: 1, CachedBlocks: 3, PrefillTokens: 2, ActiveBlocks: 17, TreeBlocks: 1000, Logit: -0.25},
			{Worker: 7, PrefillTokens: 50, ActiveBlocks: 4, TreeBlocks: 12, Logit: -1.5},
		},
	}
	goldenResponseMatch = wire.RouteResponse{Mode: wire.ModeKV, Blocks: 2, ISL: 32}
	goldenBatch         = wire.EventBatch{
		Worker: 42, Model: "llama",
		Events: []kvevent.Event{
			{Kind: kvevent.Stored, ID: 1, BlockSize: 2, Hashes: []uint64{0x11, 0x22}, Tokens: []uint32{1, 2, 3, 4}},
			{
				Kind: kvevent.Stored, ID: 2, BlockSize: 2, HasParent: true, Parent: 0x22,
				Hashes: []uint64{0x33}, Tokens: []uint32{5, 6}, LoRA: "ad", MM: [][]uint64{{0xaa, 0xbb}},
			},
			{Kind: kvevent.Removed, ID: 3, Rank: 1, Tier: kvevent.Disk, Hashes: []uint64{0x11}},
			{Kind: kvevent.Cleared},
		},
	}
)

// Normalized copies for comparison: an empty slice and nil mean the same on the wire.

func normRequest(r wire.RouteRequest) wire.RouteRequest {
	r.Allowed, r.Tokens, r.Hashes = nilIfEmpty(r.Allowed), nilIfEmpty(r.Tokens), nilIfEmpty(r.Hashes)
	return r
}

func normResponse(r wire.RouteResponse) wire.RouteResponse {
	r.Candidates = nilIfEmpty(r.Candidates)
	return r
}

func normEvents(evs []kvevent.Event) []kvevent.Event {
	out := make([]kvevent.Event, len(evs))
	for i, e := range evs {
		e.Hashes, e.Tokens = nilIfEmpty(e.Hashes), nilIfEmpty(e.Tokens)
		if len(e.MM) == 0 {
			e.MM = nil
		} else {
			mm := make([][]uint64, len(e.MM))
			for j, x := range e.MM {
				mm[j] = nilIfEmpty(x)
			}
			e.MM = mm
		}
		out[i] = e
	}
	return out
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

func sameBatch(a, b *wire.EventBatch) bool {
	return a.Worker == b.Worker && a.Model == b.Model && reflect.DeepEqual(normEvents(a.Events), normEvents(b.Events))
}

// withPaths runs fn on the machine's fast paths and again on the portable ones.
func withPaths(t *testing.T, fn func(t *testing.T)) {
	t.Run("native", fn)
	t.Run("portable", func(t *testing.T) {
		wire.ForcePortable(t)
		fn(t)
	})
}

func TestGolden(t *testing.T) {
	withPaths(t, func(t *testing.T) {
		req := func(file string, want *wire.RouteRequest) {
			t.Helper()
			b := readHex(t, file)
			var got wire.RouteRequest
			if err := wire.DecodeRouteRequest(b, &got); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if !reflect.DeepEqual(got, *want) {
				t.Fatalf("%s: decoded\n%+v\nwant\n%+v", file, got, *want)
			}
			if enc := wire.AppendRouteRequest(nil, want); !bytes.Equal(enc, b) {
				t.Fatalf("%s: encoded\n%x\nwant\n%x", file, enc, b)
			}
		}
		req("route_request_tokens.hex", &goldenRequestTokens)
		req("route_request_hashes.hex", &goldenRequestHashes)

		resp := func(file string, want *wire.RouteResponse) {
			t.Helper()
			b := readHex(t, file)
			var got wire.RouteResponse
			if err := wire.DecodeRouteResponse(b, &got); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if !reflect.DeepEqual(got, *want) {
				t.Fatalf("%s: decoded\n%+v\nwant\n%+v", file, got, *want)
			}
			if enc := wire.AppendRouteResponse(nil, want); !bytes.Equal(enc, b) {
				t.Fatalf("%s: encoded\n%x\nwant\n%x", file, enc, b)
			}
			// The same message with its records written one by one after the rest.
			head := *want
			head.Candidates = []wire.Candidate{{Worker: 99}} // ignored
			enc, recs := wire.AppendRouteResponseRecords([]byte("xy"), &head, len(want.Candidates))
			for i := range want.Candidates {
				c := &want.Candidates[i]
				wire.PutCandidate(recs[i*wire.CandidateSize:], c.Worker, c.Rank, c.CachedBlocks, c.PrefillTokens, c.ActiveBlocks, c.TreeBlocks, c.Logit)
			}
			if string(enc[:2]) != "xy" || !bytes.Equal(enc[2:], b) {
				t.Fatalf("%s: encoded by records\n%x\nwant\n%x", file, enc[2:], b)
			}
			// And with the chosen worker written last, as an encoder that chooses while it
			// writes the records does.
			if want.Chosen {
				head.Worker, head.Rank = 0, 0
				late, recs := wire.AppendRouteResponseRecords([]byte("xy"), &head, len(want.Candidates))
				copy(recs, enc[len(enc)-len(recs):])
				wire.PutRouteResponseWorker(late[2:], want.Worker, want.Rank)
				if !bytes.Equal(late, enc) {
					t.Fatalf("%s: encoded with the worker put last\n%x\nwant\n%x", file, late[2:], b)
				}
			}
		}
		resp("route_response.hex", &goldenResponse)
		resp("route_response_match.hex", &goldenResponseMatch)

		b := readHex(t, "event_batch.hex")
		var got wire.EventBatch
		if err := wire.DecodeEventBatch(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Worker != goldenBatch.Worker || got.Model != goldenBatch.Model || !reflect.DeepEqual(got.Events, goldenBatch.Events) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, goldenBatch)
		}
		if enc := wire.AppendEventBatch(nil, &goldenBatch); !bytes.Equal(enc, b) {
			t.Fatalf("encoded\n%x\nwant\n%x", enc, b)
		}
	})
}

func TestParseHeader(t *testing.T) {
	f := func(file string, typ wire.Type) {
		t.Helper()
		b := readHex(t, file)
		got, n, err := wire.ParseHeader(b[:wire.HeaderSize])
		if err != nil || got != typ || n != len(b)-wire.HeaderSize {
			t.Fatalf("%s: ParseHeader = %v, %d, %v; want %v, %d", file, got, n, err, typ, len(b)-wire.HeaderSize)
		}
	}
	f("route_request_tokens.hex", wire.TypeRouteRequest)
	f("route_response.hex", wire.TypeRouteResponse)
	f("event_batch.hex", wire.TypeEventBatch)

	b := readHex(t, "event_batch.hex")
	b[6] = 9
	if _, _, err := wire.ParseHeader(b); !errors.Is(err, wire.ErrType) {
		t.Fatalf("type 9: %v", err)
	}
	if _, _, err := wire.ParseHeader(b[:11]); !errors.Is(err, wire.ErrTruncated) {
		t.Fatalf("11 bytes: %v", err)
	}
}

// Generators of valid values of every shape.

func randRequest(r *rand.Rand, tokens, hashes int) *wire.RouteRequest {
	req := &wire.RouteRequest{
		RequestID: randString(r, r.IntN(40)),
		Model:     randString(r, r.IntN(20)),
		Mode:      wire.Mode(r.IntN(6)),
		ISL:       r.Uint32(),
	}
	if r.IntN(2) == 0 {
		req.LoRA = randString(r, r.IntN(30))
	}
	if r.IntN(2) == 0 {
		req.HasWeight, req.Weight = true, r.Float64()
	}
	if r.IntN(2) == 0 {
		req.HasTemperature, req.Temperature = true, r.NormFloat64()
	}
	if r.IntN(2) == 0 {
		req.HasPinned, req.PinnedWorker, req.PinnedRank = true, r.Uint64(), r.Uint32()
	}
	for range r.IntN(10) {
		req.Allowed = append(req.Allowed, r.Uint64())
	}
	if r.IntN(2) == 0 {
		req.PriorityJump, req.StrictPriority = r.Float64()*100, r.Uint32()
		req.MaxWaitMs, req.ExpectedOSL = r.Uint32(), r.Uint32()
		req.TrackPrefill, req.AssumeReuse = wire.Opt(r.IntN(3)), wire.Opt(r.IntN(3))
		if r.IntN(2) == 0 {
			req.SessionID = randString(r, r.IntN(30))
		}
		if r.IntN(2) == 0 {
			req.HasCredit, req.OverlapCredit = true, r.Float64()
		}
		if r.IntN(2) == 0 {
			req.HasLoadScale, req.PrefillLoadScale = true, r.Float64()*2
		}
		req.Disagg = r.IntN(2) == 0
	}
	if hashes > 0 {
		req.ByHash = true
		for range hashes {
			req.Hashes = append(req.Hashes, r.Uint64())
		}
	} else {
		for range tokens {
			req.Tokens = append(req.Tokens, r.Uint32())
		}
	}
	return req
}

func randResponse(r *rand.Rand, candidates int) *wire.RouteResponse {
	resp := &wire.RouteResponse{
		RequestID: randString(r, r.IntN(40)),
		Mode:      wire.Mode(1 + r.IntN(5)),
		Blocks:    r.Uint32(),
		ISL:       r.Uint32(),
	}
	if r.IntN(4) != 0 {
		resp.Chosen, resp.Worker, resp.Rank = true, r.Uint64(), r.Uint32()
		if r.IntN(3) == 0 {
			resp.Prefill, resp.PrefillWorker, resp.PrefillRank = true, r.Uint64(), r.Uint32()
		}
	}
	for range candidates {
		resp.Candidates = append(resp.Candidates, wire.Candidate{
			Worker: r.Uint64(), Rank: r.Uint32(), CachedBlocks: r.Uint32(), PrefillTokens: r.Uint32(),
			ActiveBlocks: r.Uint32(), TreeBlocks: r.Uint64(), Logit: r.NormFloat64(),
		})
	}
	return resp
}

func randBatch(r *rand.Rand, events, blocks, blockSize int) *wire.EventBatch {
	b := &wire.EventBatch{Worker: r.Uint64(), Model: randString(r, r.IntN(20))}
	for i := range events {
		e := kvevent.Event{ID: uint64(i), Rank: uint32(r.IntN(4)), Tier: kvevent.Tier(r.IntN(4))}
		switch r.IntN(10) {
		case 0:
			e.Kind = kvevent.Cleared
		case 1, 2, 3:
			e.Kind = kvevent.Removed
			for range 1 + r.IntN(blocks) {
				e.Hashes = append(e.Hashes, r.Uint64())
			}
		default:
			e.Kind = kvevent.Stored
			n := 1 + r.IntN(blocks)
			e.BlockSize = blockSize
			for range n {
				e.Hashes = append(e.Hashes, r.Uint64())
			}
			for range n * blockSize {
				e.Tokens = append(e.Tokens, r.Uint32N(150000))
			}
			if r.IntN(2) == 0 {
				e.HasParent, e.Parent = true, r.Uint64()
			}
			if r.IntN(4) == 0 {
				e.LoRA = randString(r, 1+r.IntN(20))
			}
			if r.IntN(4) == 0 {
				e.MM = make([][]uint64, n)
				for j := range e.MM {
					for range r.IntN(3) {
						e.MM[j] = append(e.MM[j], r.Uint64())
					}
				}
			}
			if r.IntN(4) == 0 {
				e.Salt = randString(r, 1+r.IntN(20))
			}
			if r.IntN(4) == 0 { // a Dynamo dump's event: local hashes instead of tokens
				e.Tokens = nil
				e.Locals = make([]uint64, n)
				for j := range e.Locals {
					e.Locals[j] = r.Uint64()
				}
			}
		}
		b.Events = append(b.Events, e)
	}
	return b
}

func randString(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return string(b)
}

func TestRoundTrip(t *testing.T) {
	withPaths(t, func(t *testing.T) {
		var dr wire.RouteRequest // reused across cases, so stale state would show
		req := func(r *wire.RouteRequest) {
			t.Helper()
			if err := r.Validate(); err != nil {
				t.Fatal(err)
			}
			b := wire.AppendRouteRequest(nil, r)
			if err := wire.DecodeRouteRequest(b, &dr); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normRequest(dr), normRequest(*r)) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", dr, *r)
			}
			if b2 := wire.AppendRouteRequest(nil, &dr); !bytes.Equal(b, b2) {
				t.Fatal("re-encoding differs")
			}
		}
		req(&wire.RouteRequest{})
		req(&wire.RouteRequest{ByHash: true})
		long := strings.Repeat("x", wire.MaxString)
		req(&wire.RouteRequest{RequestID: long, Model: long, LoRA: long, Tokens: []uint32{math.MaxUint32}})
		req(&wire.RouteRequest{HasWeight: true, Weight: math.Inf(-1), HasTemperature: true, Temperature: math.Copysign(0, -1)})
		req(&wire.RouteRequest{HasPinned: true, Mode: wire.ModeDirect}) // pinned worker 0 rank 0 is a value
		r := rand.New(rand.NewPCG(1, 2))
		for i := range 200 {
			if i%2 == 0 {
				req(randRequest(r, r.IntN(3000), 0))
			} else {
				req(randRequest(r, 0, r.IntN(200)))
			}
		}

		var dresp wire.RouteResponse
		resp := func(x *wire.RouteResponse) {
			t.Helper()
			if err := x.Validate(); err != nil {
				t.Fatal(err)
			}
			b := wire.AppendRouteResponse(nil, x)
			if err := wire.DecodeRouteResponse(b, &dresp); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normResponse(dresp), normResponse(*x)) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", dresp, *x)
			}
			if b2 := wire.AppendRouteResponse(nil, &dresp); !bytes.Equal(b, b2) {
				t.Fatal("re-encoding differs")
			}
		}
		resp(&wire.RouteResponse{Mode: wire.ModeRandom})
		resp(&wire.RouteResponse{Mode: wire.ModeLeastLoaded, RequestID: long, Chosen: true})
		for range 100 {
			resp(randResponse(r, r.IntN(1100)))
		}

		var db wire.EventBatch
		batch := func(x *wire.EventBatch) {
			t.Helper()
			if err := x.Validate(); err != nil {
				t.Fatal(err)
			}
			b := wire.AppendEventBatch(nil, x)
			if err := wire.DecodeEventBatch(b, &db); err != nil {
				t.Fatal(err)
			}
			if !sameBatch(&db, x) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", db, *x)
			}
			if b2 := wire.AppendEventBatch(nil, &db); !bytes.Equal(b, b2) {
				t.Fatal("re-encoding differs")
			}
		}
		batch(&wire.EventBatch{})
		batch(&wire.EventBatch{Model: long, Events: []kvevent.Event{
			{Kind: kvevent.Stored, LoRA: long},
			{Kind: kvevent.Stored, Hashes: []uint64{1, 2}, MM: [][]uint64{nil, {}}}, // empty lists read back as nil
			{Kind: kvevent.Stored, Hashes: []uint64{1}, MM: [][]uint64{make([]uint64, 1<<16-1)}},
			{Kind: kvevent.Removed},
			{Kind: kvevent.Cleared, Tier: kvevent.External, Rank: math.MaxUint32, ID: math.MaxUint64},
		}})
		maxEvents := &wire.EventBatch{Events: make([]kvevent.Event, wire.MaxEvents)}
		for i := range maxEvents.Events {
			maxEvents.Events[i].Kind = kvevent.Cleared
		}
		batch(maxEvents)
		for range 100 {
			batch(randBatch(r, r.IntN(50), 20, 16))
		}
	})
}

// TestDecodeReuse checks that decoding into a value that held something bigger leaves nothing
// of it behind, and that slices from a decode are not disturbed by appends to them.
func TestDecodeReuse(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	big := wire.AppendEventBatch(nil, randBatch(r, 200, 30, 16))
	var db wire.EventBatch
	if err := wire.DecodeEventBatch(big, &db); err != nil {
		t.Fatal(err)
	}
	small := readHex(t, "event_batch.hex")
	if err := wire.DecodeEventBatch(small, &db); err != nil {
		t.Fatal(err)
	}
	if !sameBatch(&db, &goldenBatch) {
		t.Fatalf("after reuse: %+v", db)
	}
	// Appending to one event's hashes must not overwrite the next event's.
	_ = append(db.Events[0].Hashes, 0xdead)
	if db.Events[1].Hashes[0] != 0x33 {
		t.Fatal("append to a decoded slice overwrote its neighbour")
	}

	var dr wire.RouteRequest
	if err := wire.DecodeRouteRequest(readHex(t, "route_request_tokens.hex"), &dr); err != nil {
		t.Fatal(err)
	}
	if err := wire.DecodeRouteRequest(readHex(t, "route_request_hashes.hex"), &dr); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normRequest(dr), normRequest(goldenRequestHashes)) {
		t.Fatalf("after reuse: %+v", dr)
	}
}

// decoders by message type, for the tests that treat all three alike.
var decoders = map[string]func([]byte) error{
	"route request":  func(b []byte) error { var r wire.RouteRequest; return wire.DecodeRouteRequest(b, &r) },
	"route response": func(b []byte) error { var r wire.RouteResponse; return wire.DecodeRouteResponse(b, &r) },
	"event batch":    func(b []byte) error { var r wire.EventBatch; return wire.DecodeEventBatch(b, &r) },
}

// checkError checks that err is an *Error of the message kind, wrapping want, at field and
// offset (offset -2: any).
func checkError(t *testing.T, err error, msg string, want error, field string, offset int) {
	t.Helper()
	var e *wire.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want a *wire.Error", err, err)
	}
	if !errors.Is(err, want) || e.Msg != msg || (field != "" && e.Field != field) || (offset != -2 && e.Offset != offset) {
		t.Fatalf("error %q\n{Msg:%q Field:%q Offset:%d Err:%v}\nwant %v at field %q offset %d", err, e.Msg, e.Field, e.Offset, e.Err, want, field, offset)
	}
}

func TestTruncatedEverywhere(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	msgs := map[string][][]byte{
		"route request": {
			readHex(t, "route_request_tokens.hex"), readHex(t, "route_request_hashes.hex"),
			wire.AppendRouteRequest(nil, randRequest(r, 50, 0)),
		},
		"route response": {
			readHex(t, "route_response.hex"), readHex(t, "route_response_match.hex"),
			wire.AppendRouteResponse(nil, randResponse(r, 5)),
		},
		"event batch": {readHex(t, "event_batch.hex"), wire.AppendEventBatch(nil, randBatch(r, 20, 4, 4))},
	}
	for msg, list := range msgs {
		decode := decoders[msg]
		for _, b := range list {
			if err := decode(b); err != nil {
				t.Fatal(err)
			}
			for n := range len(b) {
				// As cut, the header's body length no longer matches.
				err := decode(b[:n])
				checkError(t, err, msg, wire.ErrTruncated, "", -2)
				if n < wire.HeaderSize {
					continue
				}
				// With the body length patched to match, the body itself ends too soon.
				c := slices.Clone(b[:n])
				binary.LittleEndian.PutUint32(c[8:], uint32(n-wire.HeaderSize))
				err = decode(c)
				checkError(t, err, msg, wire.ErrTruncated, "", -2)
				if e := err.(*wire.Error); e.Offset < wire.HeaderSize || e.Offset > n || e.Field == "body_length" {
					t.Fatalf("cut at %d: %v", n, err)
				}
			}
		}
	}
}

// TestCutFields checks which field a message cut short names.
func TestCutFields(t *testing.T) {
	f := func(file string, n int, field string, offset int) {
		t.Helper()
		b := slices.Clone(readHex(t, file)[:n])
		binary.LittleEndian.PutUint32(b[8:], uint32(n-wire.HeaderSize))
		var err error
		switch {
		case strings.HasPrefix(file, "route_request"):
			err = wire.DecodeRouteRequest(b, new(wire.RouteRequest))
		case strings.HasPrefix(file, "route_response"):
			err = wire.DecodeRouteResponse(b, new(wire.RouteResponse))
		default:
			err = wire.DecodeEventBatch(b, new(wire.EventBatch))
		}
		var e *wire.Error
		if !errors.As(err, &e) || !errors.Is(err, wire.ErrTruncated) || e.Field != field || e.Offset != offset {
			t.Fatalf("%s cut at %d: %v, want field %q at offset %d", file, n, err, field, offset)
		}
	}
	f("route_request_tokens.hex", 12, "flags", 12)
	f("route_request_tokens.hex", 16, "mode", 16)
	f("route_request_tokens.hex", 27, "overlap_score_weight", 20)
	f("route_request_tokens.hex", 51, "isl", 48)
	f("route_request_tokens.hex", 53, "request_id", 52)
	f("route_request_tokens.hex", 58, "request_id", 52)
	f("route_request_tokens.hex", 70, "n_allowed", 68)
	f("route_request_tokens.hex", 80, "allowed", 72)
	f("route_request_tokens.hex", 107, "token_ids", 92)
	f("route_response.hex", 43, "reserved", 40)
	f("route_response.hex", 94, "candidates", 55)
	f("event_batch.hex", 30, "n_events", 27)
	f("event_batch.hex", 110, "events[1].rank", 109)
	f("event_batch.hex", 226, "events[3].id", 219)
	f("event_batch.hex", 90, "events", 31) // 4 events need at least 64 bytes
	f("event_batch.hex", 212, "events[3].tier", 212)
	f("event_batch.hex", 130, "events[1].parent", 125)
	f("event_batch.hex", 166, "events[1].mm", 165) // n_mm 1 needs at least 2 bytes
	f("event_batch.hex", 180, "events[1].mm[0].hashes", 167)
	f("event_batch.hex", 200, "events[2].n_hashes", 199)
}

func TestHeaderErrors(t *testing.T) {
	for msg, decode := range decoders {
		var b []byte
		switch msg {
		case "route request":
			b = readHex(t, "route_request_tokens.hex")
		case "route response":
			b = readHex(t, "route_response.hex")
		default:
			b = readHex(t, "event_batch.hex")
		}
		f := func(mutate func(b []byte) []byte, want error, field string, offset int) {
			t.Helper()
			checkError(t, decode(mutate(slices.Clone(b))), msg, want, field, offset)
		}
		f(func(b []byte) []byte { return b[:0] }, wire.ErrTruncated, "magic", 0)
		f(func(b []byte) []byte { return b[:5] }, wire.ErrTruncated, "version", 4)
		f(func(b []byte) []byte { return b[:11] }, wire.ErrTruncated, "body_length", 8)
		f(func(b []byte) []byte { b[3] = 'X'; return b }, wire.ErrMagic, "magic", 0)
		f(func(b []byte) []byte { b[4] = 2; return b }, wire.ErrVersion, "version", 4)
		f(func(b []byte) []byte { b[6] = 7; return b }, wire.ErrType, "type", 6)
		f(func(b []byte) []byte { return append(b, 0) }, wire.ErrTrailing, "body_length", 8)
		f(func(b []byte) []byte { return b[:len(b)-1] }, wire.ErrTruncated, "body_length", 8)
		// Bytes past the last field, inside the announced body.
		f(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], uint32(len(b)-wire.HeaderSize+3))
			return append(b, 0, 0, 0)
		}, wire.ErrTrailing, "body", len(b))
	}

	// Each decoder refuses the others' messages.
	b := readHex(t, "route_response.hex")
	var r wire.RouteRequest
	err := wire.DecodeRouteRequest(b, &r)
	checkError(t, err, "route request", wire.ErrType, "type", 6)
	if want := `wire: route request: field "type" at offset 6: wrong message type: got 2 (route response), want 1 (route request)`; err.Error() != want {
		t.Fatalf("error reads\n%s\nwant\n%s", err, want)
	}
	b[4] = 2
	err = wire.DecodeRouteResponse(b, new(wire.RouteResponse))
	if want := `wire: route response: field "version" at offset 4: unsupported version: got version 2, this decoder supports version 1`; err.Error() != want {
		t.Fatalf("error reads\n%s\nwant\n%s", err, want)
	}
}

func TestRouteRequestExtension(t *testing.T) {
	req := wire.RouteRequest{RequestID: "r", Model: "m", Tokens: []uint32{1, 2, 3}, PriorityJump: 2.5,
		StrictPriority: 3, MaxWaitMs: 1500, ExpectedOSL: 128, SessionID: "s-1",
		TrackPrefill: wire.False, AssumeReuse: wire.True, HasCredit: true, OverlapCredit: 0.5}
	b := wire.AppendRouteRequest(nil, &req)
	var got wire.RouteRequest
	if err := wire.DecodeRouteRequest(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, req) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, req)
	}
	// A request without the extension clears a reused value's.
	plain := wire.RouteRequest{RequestID: "r", Model: "m", Tokens: []uint32{1}}
	if err := wire.DecodeRouteRequest(wire.AppendRouteRequest(nil, &plain), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, plain) {
		t.Fatalf("reused value kept extension fields: %+v", got)
	}
	ext := len(b) - 40 - (2 + len(req.SessionID)) // ext_flags' offset
	for _, tc := range []struct {
		off   int
		v     byte
		field string
		at    int
	}{
		{ext, 0x03, "ext_flags", ext},         // track_prefill_tokens 3
		{ext, 0x0c | 0x01, "ext_flags", ext},  // assume_kv_reuse 3
		{ext + 3, 0x01, "ext_flags", ext},     // unknown bit 24
		{ext, 0x09 &^ 0x10, "ext_flags", ext}, // (valid Opts) credit bit cleared: its value must be 0
		{ext + 31, 0x3f, "prefill_load_scale", ext + 24},
	} {
		c := slices.Clone(b)
		c[tc.off] = tc.v
		field, at := tc.field, tc.at
		if tc.v == 0x09&^0x10 {
			field, at = "overlap_score_credit", ext+16
		}
		checkError(t, wire.DecodeRouteRequest(c, &got), "route request", wire.ErrInvalid, field, at)
	}
	// An empty extension is not canonical (a writer leaves it out): refused. A priority jump of
	// −0 is something, and round-trips.
	empty := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "r", Model: "m", Tokens: []uint32{1}, PriorityJump: math.Copysign(0, -1)})
	if err := wire.DecodeRouteRequest(empty, &got); err != nil || math.Float64bits(got.PriorityJump) != 1<<63 {
		t.Fatalf("−0 priority jump: %v %v", got.PriorityJump, err)
	}
	if !bytes.Equal(wire.AppendRouteRequest(nil, &got), empty) {
		t.Fatal("−0 priority jump re-encodes differently")
	}
	binary.LittleEndian.PutUint64(empty[len(empty)-2-40+8:], 0) // priority_jump := +0
	checkError(t, wire.DecodeRouteRequest(empty, &got), "route request", wire.ErrInvalid, "ext_flags", len(empty)-2-40)
	if err := (&wire.RouteRequest{TrackPrefill: 3}).Validate(); err == nil {
		t.Error("Validate accepted an Opt of 3")
	}
	bad := req
	bad.TrackPrefill = 3
	if err := wire.DecodeRouteRequest(wire.AppendRouteRequest(nil, &bad), &got); err == nil {
		t.Error("an Opt of 3 was encoded into a valid message")
	}
}

func TestRouteRequestErrors(t *testing.T) {
	golden := readHex(t, "route_request_tokens.hex")
	hashes := readHex(t, "route_request_hashes.hex")
	f := func(src []byte, mutate func(b []byte), want error, field string, offset int) {
		t.Helper()
		b := slices.Clone(src)
		mutate(b)
		var r wire.RouteRequest
		checkError(t, wire.DecodeRouteRequest(b, &r), "route request", want, field, offset)
	}
	put32 := func(off int, v uint32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint32(b[off:], v) }
	}
	put16 := func(off int, v uint16) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint16(b[off:], v) }
	}
	set := func(off int, v byte) func([]byte) { return func(b []byte) { b[off] = v } }

	f(golden, set(12, 0x23), wire.ErrInvalid, "flags", 12)
	f(golden, set(12, 0x13), wire.ErrTruncated, "ext_flags", 108) // bit 4 without the extension
	f(golden, set(15, 0x80), wire.ErrInvalid, "flags", 12)
	f(golden, set(16, 8), wire.ErrInvalid, "mode", 16)
	f(golden, set(16, 0xff), wire.ErrInvalid, "mode", 16)
	f(golden, set(17, 1), wire.ErrInvalid, "reserved", 17)

	// max_candidates (body offset 6, message offset 18) is a plain u16: any value decodes.
	mc := slices.Clone(golden)
	binary.LittleEndian.PutUint16(mc[18:], 0x0102)
	var r wire.RouteRequest
	if err := wire.DecodeRouteRequest(mc, &r); err != nil || r.MaxCandidates != 0x0102 {
		t.Errorf("max_candidates 0x0102: got %#x, %v", r.MaxCandidates, err)
	}
	if back := wire.AppendRouteRequest(nil, &r); !bytes.Equal(back, mc) {
		t.Errorf("max_candidates does not re-encode to the same bytes:\n%x\n%x", back, mc)
	}
	f(golden, set(12, 0x02), wire.ErrInvalid, "overlap_score_weight", 20)     // weight without bit0
	f(golden, set(12, 0x01), wire.ErrInvalid, "router_temperature", 28)       // temperature without bit1
	f(golden, set(40, 1), wire.ErrInvalid, "pinned_worker", 36)               // worker without bit2
	f(golden, set(44, 1), wire.ErrInvalid, "pinned_rank", 44)                 // rank without bit2
	f(golden, put16(52, wire.MaxString+1), wire.ErrTooLong, "request_id", 52) // string too long
	f(golden, put16(59, 0xffff), wire.ErrTooLong, "model", 59)                // string too long
	f(golden, put16(59, 600), wire.ErrTruncated, "model", 59)                 // a length past the end
	f(golden, put32(68, 0xffffffff), wire.ErrTruncated, "allowed", 72)        // lying n_allowed
	f(golden, put32(88, 0xffffffff), wire.ErrTruncated, "token_ids", 92)      // lying n_items
	f(golden, put32(88, 5), wire.ErrTruncated, "token_ids", 92)               // one too many
	f(golden, put32(88, 3), wire.ErrTrailing, "body", 104)                    // one too few
	f(golden, set(12, 0x0b), wire.ErrTruncated, "block_hashes", 92)           // 4 tokens read as 4 hashes
	f(hashes, put32(78, 0xffffffff), wire.ErrTruncated, "block_hashes", 82)   // lying n_items, hash mode
	f(hashes, put32(74, 0x10000000), wire.ErrTruncated, "allowed", 78)        // lying n_allowed
	f(hashes, set(12, 0x04), wire.ErrTrailing, "body", 90)                    // 2 hashes read as 2 tokens
	f(hashes, put16(61, wire.MaxString+1), wire.ErrTooLong, "lora_name", 61)

	// The message of the example in the package's error documentation.
	b := slices.Clone(golden)
	binary.LittleEndian.PutUint16(b[59:], 68)
	err := wire.DecodeRouteRequest(b, new(wire.RouteRequest))
	if want := `wire: route request: field "model" at offset 59: truncated: need 70 bytes, have 49`; err == nil || err.Error() != want {
		t.Fatalf("error reads\n%v\nwant\n%s", err, want)
	}
}

func TestRouteResponseErrors(t *testing.T) {
	golden := readHex(t, "route_response.hex")
	f := func(mutate func(b []byte), want error, field string, offset int) {
		t.Helper()
		b := slices.Clone(golden)
		mutate(b)
		var r wire.RouteResponse
		checkError(t, wire.DecodeRouteResponse(b, &r), "route response", want, field, offset)
	}
	set := func(off int, v byte) func([]byte) { return func(b []byte) { b[off] = v } }
	put32 := func(off int, v uint32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint32(b[off:], v) }
	}
	f(set(12, 5), wire.ErrInvalid, "flags", 12)
	f(set(16, 0), wire.ErrInvalid, "mode", 16)
	f(set(16, 8), wire.ErrInvalid, "mode", 16)
	f(set(19, 1), wire.ErrInvalid, "reserved", 17)
	f(set(12, 0), wire.ErrInvalid, "worker", 20) // chosen worker without bit0
	f(set(43, 1), wire.ErrInvalid, "reserved", 40)
	f(put32(44, wire.MaxString+1), wire.ErrTooLong, "request_id", 44) // low u16 is the length
	f(put32(51, 0xffffffff), wire.ErrTruncated, "candidates", 55)
	f(put32(51, 3), wire.ErrTruncated, "candidates", 55)
	f(put32(51, 1), wire.ErrTrailing, "body", 95)

	b := slices.Clone(goldenResponseMatchBytes(t))
	b[28] = 1 // a rank while nothing was chosen
	checkError(t, wire.DecodeRouteResponse(b, new(wire.RouteResponse)), "route response", wire.ErrInvalid, "rank", 28)
}

func goldenResponseMatchBytes(t *testing.T) []byte { return readHex(t, "route_response_match.hex") }

func TestEventBatchErrors(t *testing.T) {
	golden := readHex(t, "event_batch.hex")
	f := func(mutate func(b []byte), want error, field string, offset int) {
		t.Helper()
		b := slices.Clone(golden)
		mutate(b)
		var out wire.EventBatch
		checkError(t, wire.DecodeEventBatch(b, &out), "event batch", want, field, offset)
	}
	set := func(off int, v byte) func([]byte) { return func(b []byte) { b[off] = v } }
	put16 := func(off int, v uint16) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint16(b[off:], v) }
	}
	put32 := func(off int, v uint32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint32(b[off:], v) }
	}

	f(put16(20, wire.MaxString+1), wire.ErrTooLong, "model", 20)
	f(put32(27, wire.MaxEvents+1), wire.ErrTooLong, "n_events", 27)
	f(put32(27, wire.MaxEvents), wire.ErrTruncated, "events", 31) // 65536 × 16 bytes are not there
	f(put32(27, 0xffffffff), wire.ErrTooLong, "n_events", 27)
	f(put32(27, 5), wire.ErrTruncated, "events[4].kind", 227)
	f(put32(27, 3), wire.ErrTrailing, "body", 211)
	f(set(31, 0), wire.ErrInvalid, "events[0].kind", 31)
	f(set(105, 4), wire.ErrInvalid, "events[1].kind", 105)
	f(set(32, 4), wire.ErrInvalid, "events[0].tier", 32)
	f(set(33, 8), wire.ErrInvalid, "events[0].flags", 33)
	f(set(107, 0x81), wire.ErrInvalid, "events[1].flags", 107)
	f(set(185, 1), wire.ErrInvalid, "events[2].flags", 185) // has_parent on a removal
	f(set(213, 1), wire.ErrInvalid, "events[3].flags", 213)
	f(set(34, 1), wire.ErrInvalid, "events[0].reserved", 34)
	f(set(107, 0), wire.ErrInvalid, "events[1].parent", 125) // a parent without has_parent
	f(put32(59, 0xffffffff), wire.ErrTruncated, "events[0].block_hashes", 63)
	f(put32(79, 0x40000000), wire.ErrTruncated, "events[0].token_ids", 83)
	f(put16(99, wire.MaxString+1), wire.ErrTooLong, "events[0].lora_name", 99)
	f(put32(101, 1), wire.ErrInvalid, "events[0].n_mm", 101)  // neither 0 nor n_hashes
	f(put32(161, 0), wire.ErrInvalid, "events[2].flags", 167) // the mm bytes then read as event 2
	f(put16(165, 0xffff), wire.ErrTruncated, "events[1].mm[0].hashes", 167)
	f(put32(199, 0x20000000), wire.ErrTruncated, "events[2].block_hashes", 203)
	f(set(211, 9), wire.ErrInvalid, "events[3].kind", 211)

	b := slices.Clone(golden)
	b[185] = 1
	err := wire.DecodeEventBatch(b, new(wire.EventBatch))
	if want := `wire: event batch: field "events[2].flags" at offset 185: invalid value: 0x1 on a removed event, must be 0`; err == nil || err.Error() != want {
		t.Fatalf("error reads\n%v\nwant\n%s", err, want)
	}

	// n_mm = n_hashes passes the count check; event 1's bytes then read as multimodal lists.
	b = slices.Clone(golden)
	binary.LittleEndian.PutUint32(b[101:], 2)
	checkError(t, wire.DecodeEventBatch(b, new(wire.EventBatch)), "event batch", wire.ErrInvalid, "", -2)
}

// TestDisaggFields holds the disaggregated decision's fields to the format: a request's
// ext_flags bit 6, and a response's flags bit 1 with its 16-byte prefill trailer after the
// candidates, each round-tripping and each misuse refused at its field.
func TestDisaggFields(t *testing.T) {
	req := wire.RouteRequest{RequestID: "r", Model: "m", Tokens: []uint32{1, 2, 3}, Disagg: true}
	b := wire.AppendRouteRequest(nil, &req)
	var got wire.RouteRequest
	if err := wire.DecodeRouteRequest(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, req) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, req)
	}
	ext := len(b) - 40 - 2 // ext_flags' offset: the extension's fixed part, then an empty session id
	if b[ext] != 1<<6 {
		t.Fatalf("ext_flags = %#x, want bit 6 alone", b[ext])
	}
	// Decoding a request without it into the same value clears it.
	plain := wire.RouteRequest{RequestID: "r", Model: "m", Tokens: []uint32{1}}
	if err := wire.DecodeRouteRequest(wire.AppendRouteRequest(nil, &plain), &got); err != nil || got.Disagg {
		t.Fatalf("reused value kept Disagg: %+v %v", got, err)
	}

	resp := wire.RouteResponse{RequestID: "r", Mode: 1, Chosen: true, Worker: 7, Rank: 1, Blocks: 2, ISL: 40,
		Candidates: []wire.Candidate{{Worker: 7, Rank: 1, CachedBlocks: 2}},
		Prefill:    true, PrefillWorker: 3, PrefillRank: 2}
	rb := wire.AppendRouteResponse(nil, &resp)
	var gr wire.RouteResponse
	if err := wire.DecodeRouteResponse(rb, &gr); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gr, resp) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", gr, resp)
	}
	if n := len(wire.AppendRouteResponse(nil, &wire.RouteResponse{RequestID: "r", Mode: 1, Chosen: true, Worker: 7, Rank: 1, Blocks: 2, ISL: 40,
		Candidates: resp.Candidates})); len(rb) != n+16 {
		t.Fatalf("the trailer adds %d bytes, want 16", len(rb)-n)
	}
	// The records form writes the same bytes.
	msg, recs := wire.AppendRouteResponseRecords(nil, &resp, 1)
	wire.PutCandidate(recs, 7, 1, 2, 0, 0, 0, 0)
	if !bytes.Equal(msg, rb) {
		t.Fatalf("records form:\n%x\nwant\n%x", msg, rb)
	}
	// A plain answer decoded into the same value clears the prefill fields.
	plainResp := wire.RouteResponse{RequestID: "r", Mode: 1, Chosen: true, Worker: 7}
	if err := wire.DecodeRouteResponse(wire.AppendRouteResponse(nil, &plainResp), &gr); err != nil || gr.Prefill || gr.PrefillWorker != 0 {
		t.Fatalf("reused value kept the prefill stage: %+v %v", gr, err)
	}

	trailer := len(rb) - 16
	c := slices.Clone(rb)
	c[len(c)-1] = 1
	checkError(t, wire.DecodeRouteResponse(c, &gr), "route response", wire.ErrInvalid, "reserved", trailer+12)
	c = slices.Clone(rb)
	c[12] = 2 // a prefill stage without a chosen worker
	binary.LittleEndian.PutUint64(c[20:], 0)
	binary.LittleEndian.PutUint32(c[28:], 0)
	checkError(t, wire.DecodeRouteResponse(c, &gr), "route response", wire.ErrInvalid, "flags", 12)
	c = slices.Clone(rb[:len(rb)-10])
	binary.LittleEndian.PutUint32(c[8:], uint32(len(c)-12)) // body_length
	checkError(t, wire.DecodeRouteResponse(c, &gr), "route response", wire.ErrTruncated, "prefill_worker", trailer)
	// Prefill fields without Prefill do not validate, and are encoded so that the decoder
	// refuses them rather than reading another answer.
	bad := resp
	bad.Prefill = false
	if err := bad.Validate(); err == nil {
		t.Error("Validate accepted a prefill worker without Prefill")
	}
	if err := wire.DecodeRouteResponse(wire.AppendRouteResponse(nil, &bad), &gr); err == nil {
		t.Error("a prefill worker without Prefill was encoded into a valid message")
	}
}
