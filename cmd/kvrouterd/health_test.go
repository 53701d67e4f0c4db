package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// rankView is one rank as the daemon lists it: Dynamo's /workers (its instance's status, the
// rank's listener status, kvrouterd's state and last event) and /v1/workers (state and last
// event).
type rankView struct {
	listed                   bool
	status, listener, source string
	state, v1State           string
	lastEvent, v1LastEvent   time.Time
	endpoint                 string
}

func viewRank(t *testing.T, addr string, id uint64, rank uint32) rankView {
	t.Helper()
	var ws []struct {
		ID        uint64 `json:"instance_id"`
		Source    string `json:"source"`
		Status    string `json:"status"`
		Listeners map[string]struct {
			Endpoint  string    `json:"endpoint"`
			Status    string    `json:"status"`
			State     string    `json:"state"`
			LastEvent time.Time `json:"last_event"`
		} `json:"listeners"`
	}
	if err := json.Unmarshal([]byte(daemonGet(t, addr, "/workers")), &ws); err != nil {
		t.Fatalf("/workers: %v", err)
	}
	var v rankView
	for _, w := range ws {
		if l, ok := w.Listeners[fmt.Sprint(rank)]; ok && w.ID == id {
			v = rankView{listed: true, status: w.Status, source: w.Source, listener: l.Status, state: l.State, lastEvent: l.LastEvent, endpoint: l.Endpoint}
		}
	}
	var v1 struct {
		Workers []struct {
			ID    uint64    `json:"worker_id"`
			Rank  uint32    `json:"dp_rank"`
			State string    `json:"state"`
			Last  time.Time `json:"last_event_at"`
		} `json:"workers"`
	}
	if err := json.Unmarshal([]byte(daemonGet(t, addr, "/v1/workers")), &v1); err != nil {
		t.Fatalf("/v1/workers: %v", err)
	}
	for _, w := range v1.Workers {
		if w.ID == id && w.Rank == rank {
			v.v1State, v.v1LastEvent = w.State, w.Last
		}
	}
	return v
}

// TestDaemonSubscriptionHealth registers an engine's rank through Dynamo's /register before the
// engine is up, and follows it through the daemon's /workers, /v1/workers and /metrics: pending
// and connecting; active with a last event once batches flow; stale when they stop; pending and
// connecting again when the engine goes away; active with a later last event when it comes back
// on the same port; gone from all three once unregistered. A worker whose events come over HTTP
// is a stream worker with the time of its last event.
func TestDaemonSubscriptionHealth(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildDaemon(t)
	d := startDaemon(t, bin, "--nats-listen", freeport.TB(t), "--data-dir", t.TempDir(), "--zmq-stale-after", "500ms")
	defer func() { d.cmd.Process.Kill() }()
	zaddr := freeport.TB(t) // the engine is not up yet
	post := func(path, body string) {
		t.Helper()
		hr, err := http.Post("http://"+d.addr+path, "application/json", strings.NewReader(body))
		if err != nil || hr.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %v %v", path, hr, err)
		}
		hr.Body.Close()
	}
	post("/register", fmt.Sprintf(`{"instance_id":9,"endpoint":"tcp://%s","model_name":"m","block_size":4,"dp_rank":0}`, zaddr))
	const series = `{dp_rank="0",model="m",worker="9"}`
	stateSeries := func(st string) string {
		return `kvrouterd_zmq_state{dp_rank="0",model="m",state="` + st + `",worker="9"}`
	}
	// await polls the rank's views until ok holds (poke, if set, runs before each look).
	await := func(what string, poke func(), ok func(v rankView, page string) bool) rankView {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if poke != nil {
				poke()
			}
			v, page := viewRank(t, d.addr, 9, 0), scrape(d.addr)
			if ok(v, page) {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("never %s: %+v\n%s", what, v, d.log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	v := await("connecting", nil, func(v rankView, page string) bool {
		return v.listed && v.v1State == "connecting" && sample(t, page, stateSeries("connecting")) == 1
	})
	if v.status != "pending" || v.listener != "pending" || v.state != "connecting" || v.source != "zmq" || v.endpoint != "tcp://"+zaddr ||
		!v.lastEvent.IsZero() || !v.v1LastEvent.IsZero() {
		t.Fatalf("registered before the engine is up: %+v; want pending, connecting, no last event", v)
	}

	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	b := wire.EngineBatch{Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{31, 32}, Tokens: toks}}}
	payload := wire.AppendEngineBatch(nil, &b, wire.EngineForm{MapBatch: true, MapEvents: true})
	var seq uint64
	// up starts the engine and publishes a new batch at each look until the rank is active
	// with a last event after after (a SUB socket misses what is published before it
	// connects); once every batch sent has arrived it returns the rank's views.
	// up starts the engine and sends batches until the daemon reads them; with again, the
	// engine's batch 0 is resent under its own sequence (a restarted engine's first batch,
	// which the subscriber may miss while it reconnects), else each attempt is a new batch.
	up := func(after time.Time, again bool) (zmq4.Socket, rankView) {
		t.Helper()
		pub := zmq4.NewPub(context.Background())
		if err := pub.Listen("tcp://" + zaddr); err != nil {
			t.Fatal(err)
		}
		send := func() {
			if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
				t.Fatal(err)
			}
			if !again {
				seq++
			}
		}
		await("active", send, func(v rankView, _ string) bool {
			return v.state == "active" && v.lastEvent.After(after) && v.v1State == "active" && v.v1LastEvent.After(after)
		})
		if again {
			seq++
		}
		return pub, await("every batch in", nil, func(v rankView, page string) bool {
			return sample(t, page, "kvrouterd_zmq_last_sequence"+series) == float64(seq-1)
		})
	}
	pub, v := up(time.Time{}, false)
	first := v.lastEvent
	if v.status != "active" || v.listener != "active" || !v.v1LastEvent.Equal(first) || time.Since(first) > time.Minute {
		t.Fatalf("batches flowing: %+v", v)
	}
	page := scrape(d.addr)
	for name, want := range map[string]float64{
		"kvrouterd_zmq_connected" + series:                    1,
		"kvrouterd_zmq_last_batch_timestamp_seconds" + series: float64(first.UnixNano()) / 1e9,
		"kvrouterd_zmq_clears_total" + series:                 0,
		"kvrouterd_zmq_replayed_batches_total" + series:       0,
		"kvrouterd_zmq_replay_requests_total" + series:        0,
		stateSeries("connecting"):                             0,
	} {
		if got := metricValue(t, page, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// Active, or already stale: the window is short.
	if n := metricValue(t, page, stateSeries("active")) + metricValue(t, page, stateSeries("stale")); n != 1 {
		t.Errorf("kvrouterd_zmq_state: active + stale = %v, want 1", n)
	}
	if n := metricValue(t, page, "kvrouterd_zmq_events_total"+series); n < 1 || n != metricValue(t, page, "kvrouterd_zmq_batches_total"+series) {
		t.Errorf("kvrouterd_zmq_events_total = %v, want one per batch", n)
	}
	if age := metricValue(t, page, "kvrouterd_zmq_last_batch_age_seconds"+series); age < 0 || age > 60 {
		t.Errorf("kvrouterd_zmq_last_batch_age_seconds = %v", age)
	}

	// The engine stays connected and says nothing: stale, the last event unchanged.
	v = await("stale", nil, func(v rankView, page string) bool {
		return v.state == "stale" && v.v1State == "stale" && sample(t, page, stateSeries("stale")) == 1
	})
	if v.status != "active" || v.listener != "active" || !v.lastEvent.Equal(first) || !v.v1LastEvent.Equal(first) {
		t.Fatalf("silent engine: %+v; want Dynamo's status active, last event %v", v, first)
	}

	// The engine goes away: pending and connecting, the last event kept.
	pub.Close()
	v = await("connecting after the engine left", nil, func(v rankView, page string) bool {
		return v.state == "connecting" && v.v1State == "connecting" && sample(t, page, stateSeries("connecting")) == 1 &&
			sample(t, page, "kvrouterd_zmq_connected"+series) == 0 && sample(t, page, "kvrouterd_zmq_disconnects_total"+series) >= 1
	})
	if v.status != "pending" || v.listener != "pending" || !v.lastEvent.Equal(first) || !v.v1LastEvent.Equal(first) {
		t.Fatalf("engine gone: %+v; want pending, last event %v", v, first)
	}

	// It comes back on the same port, numbering its batches from 0: active, a later last event,
	// the rank cleared once, for the restart. (Had the subscriber missed the new engine's first
	// batches up to exactly the old one's next sequence, nothing could tell the restart apart.)
	seq = 0
	pub, v = up(first, true)
	defer pub.Close()
	if v.status != "active" || !v.lastEvent.After(first) || !v.v1LastEvent.Equal(v.lastEvent) {
		t.Fatalf("engine back: %+v", v)
	}
	page = scrape(d.addr)
	if c, r, g := sample(t, page, "kvrouterd_zmq_clears_total"+series), sample(t, page, "kvrouterd_zmq_restarts_total"+series),
		sample(t, page, `kvrouterd_zmq_gaps_total{dp_rank="0",model="m",outcome="cleared",worker="9"}`); c != 1 || r != 1 || g != 0 {
		t.Errorf("clears %v, restarts %v, gaps cleared %v: want one clear, for the restart", c, r, g)
	}

	// A worker whose events come over HTTP: a stream worker, with the time of its last event.
	post("/v1/workers", `{"worker_id":10,"model":"m"}`)
	before := time.Now()
	post("/v1/events", `{"worker_id":10,"events":[{"type":"stored","event_id":1,"block_hashes":[5],"token_ids":[1,2,3,4]}]}`)
	if s := viewRank(t, d.addr, 10, 0); s.status != "active" || s.listener != "active" || s.state != "stream" || s.source != "http" ||
		s.v1State != "stream" || s.lastEvent.Before(before.Add(-time.Second)) || !s.v1LastEvent.Equal(s.lastEvent) {
		t.Fatalf("HTTP worker: %+v", s)
	}

	// Unregistered: gone from the listings and the metrics.
	post("/unregister", `{"instance_id":9,"model_name":"m"}`)
	if v := viewRank(t, d.addr, 9, 0); v.listed || v.v1State != "" {
		t.Fatalf("unregistered rank still listed: %+v", v)
	}
	if _, ok := sampleText(scrape(d.addr), "kvrouterd_zmq_connected"+series); ok {
		t.Fatal("unregistered rank still has series in /metrics")
	}
}
