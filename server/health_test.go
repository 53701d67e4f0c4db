package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvrouterd/kvrouterd/router"
)

// sources says the state of the ranks it holds, as the daemon's engine subscriptions do.
type sources map[[2]uint64]router.SourceState

var lastBatch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func (s sources) RankState(worker uint64, rank uint32) (router.SourceState, time.Time, bool) {
	st, ok := s[[2]uint64{worker, uint64(rank)}]
	return st, lastBatch, ok
}

// TestDynamoWorkersStatus: Dynamo's /workers keeps its own status values per instance (the
// worst rank's: failed, then pending, then active, paused only when every rank is) and per rank in "listeners", beside each
// rank's kvrouterd state and last event time; /v1/workers lists the state and time per rank.
func TestDynamoWorkersStatus(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{Logger: quiet, Sources: sources{
		{1, 0}: router.StateActive, {1, 1}: router.StateConnecting,
		{2, 0}: router.StateStale,
		{3, 0}: router.StateActive, // rank 1: no subscription reads it
		{5, 0}: router.StateActive, {5, 1}: StatePaused,
		{6, 0}: StatePaused,
	}})
	defer r.Close()
	for _, g := range []router.Registration{
		{ID: 1, Model: "m", Ranks: []uint32{0, 1}, Endpoint: "tcp://h:5557"},
		{ID: 2, Model: "m", Ranks: []uint32{0}, Endpoint: "tcp://h:6557"},
		{ID: 3, Model: "m", Ranks: []uint32{0, 1}, Endpoint: "tcp://h:7557"},
		{ID: 4, Model: "m", Ranks: []uint32{0}},
		{ID: 5, Model: "m", Ranks: []uint32{0, 1}, Endpoint: "tcp://h:8557"},
		{ID: 6, Model: "m", Ranks: []uint32{0}, Endpoint: "tcp://h:9557"},
	} {
		if err := r.Register(g); err != nil {
			t.Fatal(err)
		}
	}
	s := New(r, Config{Logger: quiet})
	get := func(path string, v any) {
		t.Helper()
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI(path)
		ctx.Request.Header.SetMethod("GET")
		s.Handle(&ctx)
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("%s: %d %s", path, ctx.Response.StatusCode(), ctx.Response.Body())
		}
		if err := json.Unmarshal(ctx.Response.Body(), v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	type listener struct {
		Endpoint  string    `json:"endpoint"`
		Status    string    `json:"status"`
		State     string    `json:"state"`
		LastEvent time.Time `json:"last_event"`
	}
	var ws []struct {
		ID        uint64              `json:"instance_id"`
		Source    string              `json:"source"`
		Status    string              `json:"status"`
		Listeners map[string]listener `json:"listeners"`
	}
	get("/workers", &ws)
	type want struct {
		status, source string
		ranks          map[string]string // rank → status/state
	}
	wants := map[uint64]want{
		1: {"pending", "zmq", map[string]string{"0": "active/active", "1": "pending/connecting"}},
		2: {"active", "zmq", map[string]string{"0": "active/stale"}},
		3: {"failed", "zmq", map[string]string{"0": "active/active", "1": "failed/gone"}},
		4: {"active", "http", map[string]string{"0": "active/stream"}},
		5: {"active", "zmq", map[string]string{"0": "active/active", "1": "paused/paused"}},
		6: {"paused", "zmq", map[string]string{"0": "paused/paused"}},
	}
	if len(ws) != len(wants) {
		t.Fatalf("/workers lists %d instances, want %d", len(ws), len(wants))
	}
	for _, w := range ws {
		x := wants[w.ID]
		if w.Status != x.status || w.Source != x.source || len(w.Listeners) != len(x.ranks) {
			t.Errorf("instance %d: status %q, source %q, %d listeners; want %q, %q, %d", w.ID, w.Status, w.Source, len(w.Listeners), x.status, x.source, len(x.ranks))
		}
		for rank, sst := range x.ranks {
			l := w.Listeners[rank]
			if got := l.Status + "/" + l.State; got != sst {
				t.Errorf("instance %d rank %s: status/state %s, want %s", w.ID, rank, got, sst)
			}
			// Only the ranks a subscription reads have a last batch: no events were applied.
			read := w.ID != 4 && !(w.ID == 3 && rank == "1")
			if l.LastEvent.Equal(lastBatch) != read || read != !l.LastEvent.IsZero() || (l.Endpoint != "") != (w.Source == "zmq") {
				t.Errorf("instance %d rank %s: %+v", w.ID, rank, l)
			}
		}
	}

	var v1 struct {
		Workers []struct {
			ID    uint64     `json:"worker_id"`
			Rank  uint32     `json:"dp_rank"`
			State string     `json:"state"`
			Last  *time.Time `json:"last_event_at"`
		} `json:"workers"`
	}
	get("/v1/workers", &v1)
	for _, w := range v1.Workers {
		read := w.ID != 4 && !(w.ID == 3 && w.Rank == 1)
		if w.State == "" || read != (w.Last != nil) || read && !w.Last.Equal(lastBatch) {
			t.Errorf("/v1/workers: %d/%d state %q, last event %v", w.ID, w.Rank, w.State, w.Last)
		}
	}
}
