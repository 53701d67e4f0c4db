package router

import (
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/approx"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// fakeSources says the state of the ranks it holds, as the daemon's engine subscriptions do.
type fakeSources map[rankID]fakeState

// rankID names a worker's rank.
type rankID struct {
	id   uint64
	rank uint32
}

type fakeState struct {
	st   SourceState
	last time.Time
}

func (f fakeSources) RankState(worker uint64, rank uint32) (SourceState, time.Time, bool) {
	s, ok := f[rankID{worker, rank}]
	return s.st, s.last, ok
}

// TestWorkersState: a rank a subscription reads reports the subscription's state and last batch;
// a rank registered with an endpoint that nothing reads is gone; a worker whose events come
// through Ingest or ApplyEvents is a stream worker with the time of its last batch; approximate
// mode reports no state.
func TestWorkersState(t *testing.T) {
	seen := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	src := fakeSources{{1, 0}: {StateStale, seen}, {1, 1}: {StateConnecting, time.Time{}}}
	r := New(Config{Logger: quiet(), Sources: src})
	defer r.Close()
	for _, g := range []Registration{
		{ID: 1, Model: "m", BlockSize: 4, Ranks: []uint32{0, 1, 2}, Endpoint: "tcp://h:5557"},
		{ID: 2, Model: "m", Ranks: []uint32{0}},
	} {
		if err := r.Register(g); err != nil {
			t.Fatal(err)
		}
	}
	type row struct {
		st     SourceState
		last   time.Time
		recent bool // last is a time the Router took itself, during the test
	}
	check := func(r *Router, want map[rankID]row, since time.Time) {
		t.Helper()
		ws := r.Workers()
		if len(ws) != len(want) {
			t.Fatalf("%d ranks listed, want %d", len(ws), len(want))
		}
		for _, w := range ws {
			k := rankID{w.ID, w.Rank}
			x, ok := want[k]
			switch {
			case !ok:
				t.Errorf("%v listed", k)
			case w.State != x.st:
				t.Errorf("%v: state %q, want %q", k, w.State, x.st)
			case x.recent && (w.LastEventAt.Before(since) || w.LastEventAt.After(time.Now())):
				t.Errorf("%v: last event at %v, want between %v and now", k, w.LastEventAt, since)
			case !x.recent && !w.LastEventAt.Equal(x.last):
				t.Errorf("%v: last event at %v, want %v", k, w.LastEventAt, x.last)
			}
		}
	}
	check(r, map[rankID]row{
		{1, 0}: {st: StateStale, last: seen},
		{1, 1}: {st: StateConnecting},
		{1, 2}: {st: StateGone},
		{2, 0}: {st: StateStream},
	}, time.Time{})

	before := time.Now()
	ev := kvevent.Event{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{7}, Tokens: []uint32{1, 2, 3, 4}}
	if _, err := r.ApplyEvents(&wire.EventBatch{Worker: 2, Events: []kvevent.Event{ev}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Ingest(3, "m", []kvevent.Event{ev}); err != nil { // worker 3 discovered by its events
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	check(r, map[rankID]row{
		{1, 0}: {st: StateStale, last: seen},
		{1, 1}: {st: StateConnecting},
		{1, 2}: {st: StateGone},
		{2, 0}: {st: StateStream, recent: true},
		{3, 0}: {st: StateStream, recent: true},
	}, before)

	a := New(Config{Logger: quiet(), Sources: src, Approximate: &approx.Config{}})
	defer a.Close()
	if err := a.Register(Registration{ID: 1, Model: "m", Ranks: []uint32{0}, Endpoint: "tcp://h:5557"}); err != nil {
		t.Fatal(err)
	}
	if w := a.Workers()[0]; w.State != "" || !w.LastEventAt.IsZero() {
		t.Fatalf("approximate mode: state %q, last event %v; want neither", w.State, w.LastEventAt)
	}
}
