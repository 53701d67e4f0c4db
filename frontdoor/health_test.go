package frontdoor

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"
)

// healthEngine is a fake engine's /health on a real socket: it answers status (200 unless
// set), and counts the probes.
type healthEngine struct {
	srv    *http.Server
	status atomic.Int32
	probes atomic.Int32
}

// serveHealth starts a healthEngine on addr ("127.0.0.1:0" for any port).
func serveHealth(t *testing.T, addr string) (*healthEngine, string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	e := &healthEngine{}
	e.status.Store(http.StatusOK)
	e.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		e.probes.Add(1)
		w.WriteHeader(int(e.status.Load()))
	})}
	go e.srv.Serve(ln)
	t.Cleanup(func() { e.srv.Close() })
	return e, ln.Addr().String()
}

// refusingAddr returns an address on which nothing listens: connections to it are refused.
func refusingAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func healthOf(t *testing.T, r *router.Router, id uint64) router.WorkerInfo {
	t.Helper()
	for _, w := range r.Workers() {
		if w.ID == id {
			return w
		}
	}
	t.Fatalf("worker %d not listed", id)
	return router.WorkerInfo{}
}

// eventually waits up to 10 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestProberBringsWorkerBack: a worker refusing connections is ejected; its probes fail, and
// each failure ejects it for longer; once its engine is up and /health answers 200 it is back
// in routing, suspect until it answers a request. A 503 from /health counts as down.
func TestProberBringsWorkerBack(t *testing.T) {
	r := router.New(router.Config{Shards: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Eject: router.EjectConfig{BaseTime: 50 * time.Millisecond}})
	t.Cleanup(r.Close)
	addr := refusingAddr(t)
	_, up := serveHealth(t, "127.0.0.1:0")
	for id, ep := range map[uint64]string{1: "http://" + addr, 2: "http://" + up + "/"} {
		if err := r.Register(router.Registration{ID: id, Model: "m", BlockSize: bs, HTTPEndpoint: ep}); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	d := New(r, Config{Registry: reg})
	t.Cleanup(d.Close)

	r.UpstreamFailed(1, 0, "connect") // as the front door reports a refused connection
	if h := healthOf(t, r, 1); h.Health != router.HealthEjected {
		t.Fatalf("after a refused connection: %+v", h)
	}
	if got := metricValue(t, reg, "kvrouterd_workers_ejected", ""); got != 1 {
		t.Fatalf("kvrouterd_workers_ejected %v", got)
	}
	if got := metricValue(t, reg, "kvrouterd_worker_ejected", "m"); got != 1 {
		t.Fatalf("kvrouterd_worker_ejected{model=\"m\"} %v", got)
	}
	eventually(t, "two failed probes", func() bool { return healthOf(t, r, 1).Ejections >= 3 })
	if h := healthOf(t, r, 1); h.Health != router.HealthEjected || h.LastFailure != "probe" {
		t.Fatalf("after failed probes: %+v", h)
	}

	// The engine comes up on the same address, not healthy yet: still out.
	e, _ := serveHealth(t, addr)
	e.status.Store(http.StatusServiceUnavailable)
	eventually(t, "a probe answered 503", func() bool { return e.probes.Load() >= 1 })
	time.Sleep(50 * time.Millisecond) // the verdict follows the answer
	if h := healthOf(t, r, 1); h.Health != router.HealthEjected {
		t.Fatalf("after /health answered 503: %+v", h)
	}
	e.status.Store(http.StatusOK)
	eventually(t, "back in routing", func() bool { return healthOf(t, r, 1).Health == router.HealthSuspect })
	if len(r.OutRanks(nil)) != 0 {
		t.Fatal("a rank still out")
	}
	r.UpstreamOK(1, 0)
	if h := healthOf(t, r, 1); h.Health != router.HealthOK {
		t.Fatalf("after an answer: %+v", h)
	}

	ok := metricValue(t, reg, "kvrouterd_health_probes_total", "ok")
	failed := metricValue(t, reg, "kvrouterd_health_probes_total", "failed")
	if ok != 1 || failed < 3 {
		t.Fatalf("probes: %v ok, %v failed", ok, failed)
	}
	if got := metricValue(t, reg, "kvrouterd_worker_ejections_total", "probe"); got != failed {
		t.Fatalf("ejections by probe %v, failed probes %v", got, failed)
	}
	body, err := testutil.CollectAndLint(&healthMetrics{r: r})
	if err != nil || len(body) != 0 {
		t.Fatalf("metrics lint: %v %v", body, err)
	}
	d.Close()
	d.Close() // twice is fine
}

// TestProberStopsOnClose: Close ends the loop and a probe in flight, and detaches the prober:
// the rank waiting for the probe's verdict comes back at its time.
func TestProberStopsOnClose(t *testing.T) {
	r := router.New(router.Config{Shards: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Eject: router.EjectConfig{BaseTime: 20 * time.Millisecond}})
	t.Cleanup(r.Close)
	// A worker whose /health never answers: the probe hangs until Close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := r.Register(router.Registration{ID: 1, Model: "m", BlockSize: bs, HTTPEndpoint: "http://" + ln.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(router.Registration{ID: 2, Model: "m", BlockSize: bs}); err != nil {
		t.Fatal(err)
	}
	d := New(r, Config{})
	r.UpstreamFailed(1, 0, "connect")
	conn := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			conn <- c
		}
	}()
	select {
	case c := <-conn:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("no probe came")
	}
	start := time.Now()
	d.Close()
	if took := time.Since(start); took > probeTimeout/2 {
		t.Fatalf("Close took %v with a probe in flight", took)
	}
	if h := healthOf(t, r, 1); h.Ejections != 1 || h.LastFailure != "connect" {
		t.Fatalf("a probe cut short by Close gave a verdict: %+v", h)
	}
	eventually(t, "the ejection to end with its time", func() bool { return len(r.OutRanks(nil)) == 0 })
}

// metricValue is the value of the first series of name in reg with a label of value label (if
// set); 0 when there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetValue() == label }) {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// TestDoorEjectsDownWorker is the case through the front door: worker 1 refuses
// connections and holds nothing, so it wins the "fewest blocks" tie of every fresh request.
// The first request tries it, migrates, and ejects it; the other seven go straight to the
// others. The prober then finds it down, and once its engine is up again, brings it back.
func TestDoorEjectsDownWorker(t *testing.T) {
	engines := []*engine{startEngine(t, 1), startEngine(t, 1), startEngine(t, 1), startEngine(t, 1)}
	downAddr := strings.TrimPrefix(engines[0].addr, "http://")
	engines[0].ln.Close()
	r := router.New(router.Config{BlockSize: bs, Shards: 1, Logger: slog.New(slog.DiscardHandler),
		Eject: router.EjectConfig{BaseTime: 50 * time.Millisecond}})
	t.Cleanup(r.Close)
	for i, e := range engines {
		if err := r.Register(router.Registration{ID: uint64(i + 1), Model: "m", BlockSize: bs, HTTPEndpoint: e.addr}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			continue
		}
		// Workers 2 to 4 hold blocks of a prompt of their own; worker 1 none.
		toks := make([]uint32, bs*i)
		hashes := make([]uint64, i)
		for k := range toks {
			toks[k] = uint32(1000*(i+1) + k)
		}
		for k := range hashes {
			hashes[k] = uint64(100*(i+1) + k)
		}
		if _, err := r.ApplyEvents(&wire.EventBatch{Worker: uint64(i + 1), Model: "m", Events: []kvevent.Event{
			{Kind: kvevent.Stored, ID: 1, Hashes: hashes, Tokens: toks}}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	d := New(r, Config{Registry: reg, Retries: 2})
	t.Cleanup(d.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go (&fasthttp.Server{Handler: d.Handle}).Serve(ln)
	t.Cleanup(func() { ln.Close() })

	for i := range 8 {
		body := fmt.Sprintf(`{"model":"m","max_tokens":1,"prompt":[%d,%d,%d,%d,%d]}`, 90000+i*10, 1, 2, 3, 4)
		resp, err := http.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouterd-Worker") == "1" {
			t.Fatalf("request %d: %d from worker %s: %s", i, resp.StatusCode, resp.Header.Get("X-Kvrouterd-Worker"), b)
		}
	}
	connect := slices.Index(router.FailureReasons[:], "connect")
	if st := r.HealthStats(); st.Failures[connect] != 1 || st.Ejections[connect] != 1 {
		t.Fatalf("the down worker was tried %d times, ejected %d times; want once, once", st.Failures[connect], st.Ejections[connect])
	}
	eventually(t, "a failed probe", func() bool { return metricValue(t, reg, "kvrouterd_health_probes_total", "failed") >= 1 })
	if h := healthOf(t, r, 1); h.Health != router.HealthEjected {
		t.Fatalf("worker 1, probed down: %+v", h)
	}
	serveHealth(t, downAddr)
	eventually(t, "worker 1 back in routing", func() bool { return healthOf(t, r, 1).Health == router.HealthSuspect })
}
