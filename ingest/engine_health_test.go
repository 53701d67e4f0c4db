package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

func TestRankHealthState(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	f := func(connected bool, connAt, batchAt int64, now time.Duration, want router.SourceState) {
		t.Helper()
		var h rankHealth
		h.connectedAt.Store(connAt)
		h.lastBatch.Store(batchAt)
		got, last := h.state(connected, t0.Add(now), time.Minute)
		if got != want {
			t.Errorf("connected %v at %d, batch at %d, now +%v: %s, want %s", connected, connAt, batchAt, now, got, want)
		}
		if (batchAt == 0) != last.IsZero() || batchAt != 0 && last.UnixNano() != batchAt {
			t.Errorf("last batch %v, want %d", last, batchAt)
		}
	}
	f(false, 0, 0, 0, router.StateConnecting)                           // never connected
	f(false, at(0), at(time.Second), time.Hour, router.StateConnecting) // lost, dialling again
	f(true, at(0), 0, 30*time.Second, router.StateActive)               // just connected, nothing yet
	f(true, at(0), 0, 2*time.Minute, router.StateStale)                 // connected, never a batch
	f(true, at(0), at(90*time.Second), 2*time.Minute, router.StateActive)
	f(true, at(0), at(time.Second), 2*time.Minute, router.StateStale)
	f(true, at(3*time.Minute), at(time.Second), 200*time.Second, router.StateActive) // reconnected since
}

// TestEnginesRankState follows one rank through a publisher's life over real sockets: connecting
// before the engine is up, active once batches flow, stale when they stop, connecting when the
// engine goes away, active again with a later last batch when it comes back on the same port,
// and not found once the subscription is removed. The metrics say the same.
func TestEnginesRankState(t *testing.T) {
	addr := freeport.TB(t) // the engine is not up yet
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := NewEngines(ctx, nopSink{}, EngineConfig{Logger: zmqTestLog(), StaleAfter: 300 * time.Millisecond, RedialMax: 100 * time.Millisecond})
	defer e.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e.Collector())
	if err := e.Add(EngineSource{Worker: 7, Model: "m", Endpoint: "tcp://" + addr, Ranks: 1, FirstRank: 2}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := e.RankState(7, 0); ok {
		t.Fatal("rank 0 of worker 7 has a state; no subscription reads it")
	}
	if st, last, ok := e.RankState(7, 2); !ok || st != router.StateConnecting || !last.IsZero() {
		t.Fatalf("before the engine is up: %q %v %v, want connecting, no batch", st, last, ok)
	}
	// metric returns the value of the rank's series name, with the label pairs extra; false
	// when absent.
	metric := func(name string, extra ...string) (float64, bool) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
		next:
			for _, m := range mf.GetMetric() {
				want := map[string]string{"model": "m", "worker": "7", "dp_rank": "2"}
				for i := 0; i+1 < len(extra); i += 2 {
					want[extra[i]] = extra[i+1]
				}
				for _, lp := range m.GetLabel() {
					if v, ok := want[lp.GetName()]; ok && v != lp.GetValue() {
						continue next
					}
				}
				if g := m.GetGauge(); g != nil {
					return g.GetValue(), true
				}
				return m.GetCounter().GetValue(), true
			}
		}
		return 0, false
	}
	if v, _ := metric("kvrouterd_zmq_state", "state", string(router.StateConnecting)); v != 1 {
		t.Fatalf("kvrouterd_zmq_state{state=connecting} = %v, want 1", v)
	}
	if _, ok := metric("kvrouterd_zmq_last_batch_age_seconds"); ok {
		t.Fatal("a batch age before any batch")
	}

	payload := wire.AppendEngineBatch(nil, engineBatch(2), wire.EngineForm{})
	var seq uint64
	// up starts the engine on addr and publishes at each poll until the rank is active with a
	// last batch after after (a SUB socket misses what is published before it connects); once
	// every batch sent has arrived, it returns the time of the last. Each poll sends a new batch,
	// or with again the engine's batch 0 under its own number: a restarted engine's first batch,
	// which the subscriber may miss while it reconnects. Numbering on instead could make the
	// restart look like the old engine's next batch.
	up := func(after time.Time, again bool) (zmq4.Socket, time.Time) {
		t.Helper()
		pub := zmq4.NewPub(context.Background())
		if err := pub.Listen("tcp://" + addr); err != nil {
			t.Fatal(err)
		}
		var last time.Time
		eventually(t, "the rank active", func() bool {
			if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), be8(seq), payload)); err != nil {
				t.Fatal(err)
			}
			if !again {
				seq++
			}
			var st router.SourceState
			st, last, _ = e.RankState(7, 2)
			return st == router.StateActive && last.After(after)
		})
		if again {
			seq++
		}
		eventually(t, "every batch sent", func() bool {
			for _, st := range e.Stats() {
				return st.Ranks[0].LastSeq == seq-1
			}
			return false
		})
		_, last, _ = e.RankState(7, 2)
		return pub, last
	}
	pub, first := up(time.Time{}, false)
	if v, _ := metric("kvrouterd_zmq_last_batch_timestamp_seconds"); v != float64(first.UnixNano())/1e9 {
		t.Errorf("kvrouterd_zmq_last_batch_timestamp_seconds = %v, want %v", v, float64(first.UnixNano())/1e9)
	}
	if v, ok := metric("kvrouterd_zmq_last_batch_age_seconds"); !ok || v < 0 {
		t.Errorf("kvrouterd_zmq_last_batch_age_seconds = %v %v, want a lag ≥ 0", v, ok)
	}

	// Silent while connected: stale, the last batch unchanged.
	eventually(t, "the rank stale", func() bool {
		st, _, _ := e.RankState(7, 2)
		return st == router.StateStale
	})
	if _, last, _ := e.RankState(7, 2); !last.Equal(first) {
		t.Fatalf("last batch %v moved from %v without a batch", last, first)
	}
	if v, _ := metric("kvrouterd_zmq_state", "state", string(router.StateStale)); v != 1 {
		t.Fatalf("kvrouterd_zmq_state{state=stale} = %v, want 1", v)
	}

	// The engine goes away: connecting (dialling again), the last batch kept.
	pub.Close()
	eventually(t, "the rank connecting", func() bool {
		st, _, _ := e.RankState(7, 2)
		return st == router.StateConnecting
	})
	if _, last, _ := e.RankState(7, 2); !last.Equal(first) {
		t.Fatalf("last batch %v moved from %v without a batch", last, first)
	}
	if v, _ := metric("kvrouterd_zmq_disconnects_total"); v < 1 {
		t.Fatalf("kvrouterd_zmq_disconnects_total = %v after the engine left", v)
	}

	// It comes back, numbering from 0 again: active, a later last batch, and the rank cleared
	// once, for the restart (the sequence went back).
	seq = 0
	pub, second := up(first, true)
	defer pub.Close()
	if v, _ := metric("kvrouterd_zmq_state", "state", string(router.StateActive)); v != 1 {
		t.Fatalf("kvrouterd_zmq_state{state=active} = %v, want 1", v)
	}
	restarts, _ := metric("kvrouterd_zmq_restarts_total")
	lost, _ := metric("kvrouterd_zmq_gaps_total", "outcome", "cleared")
	if clears, _ := metric("kvrouterd_zmq_clears_total"); clears != 1 || restarts != 1 || lost != 0 {
		t.Errorf("kvrouterd_zmq_clears_total = %v, restarts %v, gaps cleared %v: want one clear, for the restart", clears, restarts, lost)
	}
	if st := e.Stats()["worker=7,model=m,endpoint=tcp://"+addr+",rank=2"].Ranks[0]; st.State != router.StateActive || !st.LastBatch.Equal(second) {
		t.Fatalf("Stats: state %q, last batch %v; want active, %v", st.State, st.LastBatch, second)
	}

	e.Remove(7)
	if st, _, ok := e.RankState(7, 2); ok {
		t.Fatalf("a removed subscription's rank is still %q", st)
	}
	if _, ok := metric("kvrouterd_zmq_state"); ok {
		t.Fatal("a removed subscription's rank still has series")
	}
}
