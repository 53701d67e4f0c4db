package router

import (
	"reflect"
	"testing"

	"github.com/kvrouterd/kvrouterd/wire"
)

// rankEndpoints lists each registered rank's endpoints from Workers.
func rankEndpoints(r *Router, id uint64) []RankEndpoint {
	var out []RankEndpoint
	for _, w := range r.Workers() {
		if w.ID == id {
			out = append(out, RankEndpoint{Rank: w.Rank, Endpoint: w.Endpoint, Replay: w.Replay})
		}
	}
	return out
}

// TestRankEndpointsOneAtATime: ranks of one engine registered one at a time (as Dynamo's
// /register does, one dp_rank per call) each keep their own endpoints, in the listing, in what
// the endpoint watcher is told, and through a snapshot and restore; a registration of several
// ranks gives the later ones the port + rank offset.
func TestRankEndpointsOneAtATime(t *testing.T) {
	w := &watchLog{}
	r := New(Config{Logger: quiet(), Endpoints: w})
	defer r.Close()
	for _, g := range []Registration{
		{ID: 1, Model: "m", Ranks: []uint32{0}, Endpoint: "tcp://h:5557", Replay: "tcp://h:6557"},
		{ID: 1, Model: "m", Ranks: []uint32{1}, Endpoint: "tcp://h:5558", Replay: "tcp://h:6558"},
		{ID: 2, Model: "m", Ranks: []uint32{2, 3}, Endpoint: "tcp://g:7000"},
		{ID: 3, Model: "m", Ranks: []uint32{0}}, // no endpoint
	} {
		if err := r.Register(g); err != nil {
			t.Fatal(err)
		}
	}
	want1 := []RankEndpoint{{0, "tcp://h:5557", "tcp://h:6557"}, {1, "tcp://h:5558", "tcp://h:6558"}}
	want2 := []RankEndpoint{{2, "tcp://g:7000", ""}, {3, "tcp://g:7001", ""}}
	check := func(r *Router, when string) {
		t.Helper()
		if got := rankEndpoints(r, 1); !reflect.DeepEqual(got, want1) {
			t.Errorf("%s: worker 1 %+v, want %+v", when, got, want1)
		}
		if got := rankEndpoints(r, 2); !reflect.DeepEqual(got, want2) {
			t.Errorf("%s: worker 2 %+v, want %+v", when, got, want2)
		}
		if got := rankEndpoints(r, 3); !reflect.DeepEqual(got, []RankEndpoint{{Rank: 0}}) {
			t.Errorf("%s: worker 3 %+v, want no endpoint", when, got)
		}
	}
	check(r, "registered")
	told := [][]RankEndpoint{want1[:1], want1[1:], want2}
	if !reflect.DeepEqual(w.got, told) {
		t.Errorf("the watcher was told %+v, want %+v", w.got, told)
	}
	restart, _ := restored(t, r, 0)
	check(restart, "restored")

	// Registering rank 1 again with another endpoint moves rank 1 alone.
	if err := r.Register(Registration{ID: 1, Model: "m", Ranks: []uint32{1}, Endpoint: "tcp://h:9999"}); err != nil {
		t.Fatal(err)
	}
	if got := rankEndpoints(r, 1); got[0].Endpoint != "tcp://h:5557" || got[1] != (RankEndpoint{1, "tcp://h:9999", ""}) {
		t.Errorf("after rank 1 moved: %+v", got)
	}

	// Later ranks of an ipc endpoint have no port to offset: refused, naming the field.
	if err := r.Register(Registration{ID: 4, Model: "m", Ranks: []uint32{0, 1}, Endpoint: "ipc:///tmp/kv"}); err == nil {
		t.Error("two ranks on one ipc endpoint accepted")
	}
}

// TestRankEndpointsOldSnapshot: a snapshot written before ranks kept their own endpoints holds
// the worker's first rank's; restored, each rank gets it with its port offset, as the engine
// binds them.
func TestRankEndpointsOldSnapshot(t *testing.T) {
	w := wire.SnapshotWorker{ID: 5, Model: "m", BlockSize: 16, Endpoint: "tcp://h:5557", Replay: "tcp://h:6557",
		Ranks: []wire.SnapshotRank{{Rank: 0}, {Rank: 1}}}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	chunk := wire.AppendSnapshotWorker(nil, &w)
	r := New(Config{Logger: quiet()})
	defer r.Close()
	if _, err := r.Restore(1, func(_ int, dst []byte) ([]byte, error) { return append(dst, chunk...), nil }); err != nil {
		t.Fatal(err)
	}
	want := []RankEndpoint{{0, "tcp://h:5557", "tcp://h:6557"}, {1, "tcp://h:5558", "tcp://h:6558"}}
	if got := rankEndpoints(r, 5); !reflect.DeepEqual(got, want) {
		t.Errorf("restored %+v, want %+v", got, want)
	}
}
