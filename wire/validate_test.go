package wire_test

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestInvalidValues checks, for values the format cannot carry, that Validate names the field
// and that what the Append function writes for them is rejected by the decoder rather than read
// as some other valid message.
func TestInvalidValues(t *testing.T) {
	check := func(t *testing.T, msg string, verr error, want error, field string, encoded []byte, decode func([]byte) error) {
		t.Helper()
		var e *wire.Error
		if !errors.As(verr, &e) || !errors.Is(verr, want) || e.Field != field || e.Offset != -1 || e.Msg != msg {
			t.Fatalf("Validate: %v, want %v at field %q", verr, want, field)
		}
		if !strings.Contains(verr.Error(), `field "`+field+`": `) {
			t.Fatalf("Validate error reads %q", verr)
		}
		if err := decode(encoded); err == nil {
			t.Fatalf("the encoding of an invalid value decodes without error")
		} else if !errors.As(err, &e) {
			t.Fatalf("decode: %v is not a *wire.Error", err)
		}
	}
	long := strings.Repeat("y", wire.MaxString+1)
	huge := strings.Repeat("z", 1<<16+5)

	t.Run("route request", func(t *testing.T) {
		f := func(mutate func(r *wire.RouteRequest), want error, field string) {
			t.Helper()
			r := goldenRequestTokens
			mutate(&r)
			check(t, "route request", r.Validate(), want, field, wire.AppendRouteRequest(nil, &r), decoders["route request"])
		}
		f(func(r *wire.RouteRequest) { r.RequestID = long }, wire.ErrTooLong, "request_id")
		f(func(r *wire.RouteRequest) { r.Model = huge }, wire.ErrTooLong, "model")
		f(func(r *wire.RouteRequest) { r.LoRA = long }, wire.ErrTooLong, "lora_name")
		f(func(r *wire.RouteRequest) { r.Mode = wire.ModeMax + 1 }, wire.ErrInvalid, "mode")
		f(func(r *wire.RouteRequest) { r.HasWeight = false }, wire.ErrInvalid, "overlap_score_weight")
		f(func(r *wire.RouteRequest) { r.HasWeight, r.Weight = false, math.Copysign(0, -1) }, wire.ErrInvalid, "overlap_score_weight")
		f(func(r *wire.RouteRequest) { r.HasTemperature = false }, wire.ErrInvalid, "router_temperature")
		f(func(r *wire.RouteRequest) { r.PinnedWorker = 3 }, wire.ErrInvalid, "pinned_worker")
		f(func(r *wire.RouteRequest) { r.PinnedRank = 3 }, wire.ErrInvalid, "pinned_rank")
		f(func(r *wire.RouteRequest) { r.ByHash = true }, wire.ErrInvalid, "token_ids")
		f(func(r *wire.RouteRequest) { r.Hashes = []uint64{1} }, wire.ErrInvalid, "block_hashes")
	})

	t.Run("route response", func(t *testing.T) {
		f := func(mutate func(r *wire.RouteResponse), want error, field string) {
			t.Helper()
			r := goldenResponse
			mutate(&r)
			check(t, "route response", r.Validate(), want, field, wire.AppendRouteResponse(nil, &r), decoders["route response"])
		}
		f(func(r *wire.RouteResponse) { r.RequestID = huge }, wire.ErrTooLong, "request_id")
		f(func(r *wire.RouteResponse) { r.Mode = wire.ModeDefault }, wire.ErrInvalid, "mode")
		f(func(r *wire.RouteResponse) { r.Mode = 200 }, wire.ErrInvalid, "mode")
		f(func(r *wire.RouteResponse) { r.Chosen = false }, wire.ErrInvalid, "worker")
		f(func(r *wire.RouteResponse) { r.Chosen, r.Worker = false, 0 }, wire.ErrInvalid, "rank")
	})

	t.Run("event batch", func(t *testing.T) {
		f := func(mutate func(b *wire.EventBatch), want error, field string) {
			t.Helper()
			b := goldenBatch
			b.Events = normEvents(goldenBatch.Events) // a deep copy
			mutate(&b)
			check(t, "event batch", b.Validate(), want, field, wire.AppendEventBatch(nil, &b), decoders["event batch"])
		}
		ev := func(i int, mutate func(e *kvevent.Event)) func(b *wire.EventBatch) {
			return func(b *wire.EventBatch) { mutate(&b.Events[i]) }
		}
		f(func(b *wire.EventBatch) { b.Model = long }, wire.ErrTooLong, "model")
		f(func(b *wire.EventBatch) {
			b.Events = make([]kvevent.Event, wire.MaxEvents+1)
			for i := range b.Events {
				b.Events[i].Kind = kvevent.Cleared
			}
		}, wire.ErrTooLong, "n_events")
		f(ev(0, func(e *kvevent.Event) { e.Kind = 0 }), wire.ErrInvalid, "events[0].kind")
		f(ev(3, func(e *kvevent.Event) { e.Kind = 4 }), wire.ErrInvalid, "events[3].kind")
		f(ev(1, func(e *kvevent.Event) { e.Tier = 4 }), wire.ErrInvalid, "events[1].tier")
		f(ev(2, func(e *kvevent.Event) { e.HasParent = true }), wire.ErrInvalid, "events[2].flags")
		f(ev(2, func(e *kvevent.Event) { e.Parent = 5 }), wire.ErrInvalid, "events[2].parent")
		f(ev(2, func(e *kvevent.Event) { e.BlockSize = 16 }), wire.ErrInvalid, "events[2].block_size")
		f(ev(2, func(e *kvevent.Event) { e.Tokens = []uint32{1} }), wire.ErrInvalid, "events[2].token_ids")
		f(ev(2, func(e *kvevent.Event) { e.LoRA = "a" }), wire.ErrInvalid, "events[2].lora_name")
		f(ev(2, func(e *kvevent.Event) { e.MM = [][]uint64{{1}} }), wire.ErrInvalid, "events[2].mm")
		f(ev(3, func(e *kvevent.Event) { e.Hashes = []uint64{1} }), wire.ErrInvalid, "events[3].block_hashes")
		f(ev(3, func(e *kvevent.Event) { e.Tokens = []uint32{1} }), wire.ErrInvalid, "events[3].token_ids")
		f(ev(0, func(e *kvevent.Event) { e.Parent = 1 }), wire.ErrInvalid, "events[0].parent")
		f(ev(0, func(e *kvevent.Event) { e.BlockSize = -1 }), wire.ErrInvalid, "events[0].block_size")
		if strconv.IntSize == 64 {
			over := uint64(math.MaxUint32) + 1
			f(ev(0, func(e *kvevent.Event) { e.BlockSize = int(over) }), wire.ErrInvalid, "events[0].block_size")
		}
		f(ev(1, func(e *kvevent.Event) { e.LoRA = huge }), wire.ErrTooLong, "events[1].lora_name")
		f(ev(0, func(e *kvevent.Event) { e.MM = [][]uint64{{1}} }), wire.ErrInvalid, "events[0].n_mm")
		f(ev(1, func(e *kvevent.Event) { e.MM = [][]uint64{make([]uint64, 1<<16)} }), wire.ErrTooLong, "events[1].mm[0].hashes")
	})
}
