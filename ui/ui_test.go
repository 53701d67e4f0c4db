package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/daemon"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/ui"
)

// startDaemon starts a whole daemon in the process, on free loopback ports with its data in a
// new directory, changed by set; it stops when the test ends. It returns the API's base URL.
func startDaemon(t *testing.T, set func(*daemon.Config)) string {
	t.Helper()
	c := daemon.Defaults()
	c.HTTPAddr, c.NATSListen, c.DataDir = freeport.TB(t), freeport.TB(t), t.TempDir()
	c.Shards, c.LogLevel, c.ShutdownTimeout = 2, "error", 5*time.Second
	if set != nil {
		set(&c)
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.Start(ctx, c, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Wait(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("daemon: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the daemon did not stop within 30 s")
		}
	})
	return "http://" + d.Addr().String()
}

// call sends a request and returns the answer's status, headers and body; a transport error
// fails the test.
func call(t *testing.T, method, url, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// post sends a JSON body and fails the test unless the answer has status want.
func post(t *testing.T, url, body string, want int) {
	t.Helper()
	if code, _, got := call(t, "POST", url, body); code != want {
		t.Fatalf("POST %s: %d %s, want %d", url, code, got, want)
	}
}

// eventually calls f until it returns nil or d has passed, then fails the test with f's last
// error.
func eventually(t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func status(t *testing.T, base string) (*ui.Status, string) {
	t.Helper()
	code, h, body := call(t, "GET", base+"/ui/status.json", "")
	if code != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		t.Fatalf("GET /ui/status.json: %d %s %s", code, h.Get("Content-Type"), body)
	}
	var st ui.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("GET /ui/status.json: %v\n%s", err, body)
	}
	return &st, body
}

// tokens returns n token ids from first on, as a JSON array's elements.
func tokens(first, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, first+i)
	}
	return b.String()
}

// hostileModel is a model name a worker could send to attack the page: the page must show it
// as text.
const hostileModel = `m<img src=x onerror="document.title='owned'">&amp;`

// bigWorker is a worker id beyond the 53 bits of JavaScript's numbers.
const bigWorker = "9223372036854775813"

// TestStatusDocument: the page's files are served read-only with a policy that allows only its
// own script, and the document reports what the daemon did — workers and their ranks, the
// index, events, routes and their hit rate, the queues, the snapshot — with worker ids as
// strings and workers' strings as they sent them.
func TestStatusDocument(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon with an embedded NATS server")
	}
	// Dynamo's v1 cost sends all three routes below to the rank holding their blocks; the
	// default cost may send a 40-token prompt to the idle rank, as its queue costs more than
	// computing the prompt. What this test reads is the document, not the choice.
	base := startDaemon(t, func(c *daemon.Config) { c.SnapshotInterval, c.RouterCost = 100*time.Millisecond, "v1" })

	code, h, _ := call(t, "GET", base+"/ui", "")
	if code != http.StatusMovedPermanently || h.Get("Location") != "ui/" {
		t.Errorf("GET /ui: %d Location %q, want 301 to ui/", code, h.Get("Location"))
	}
	for path, typ := range map[string]string{"/ui/": "text/html", "/ui/app.js": "text/javascript", "/ui/style.css": "text/css"} {
		code, h, body := call(t, "GET", base+path, "")
		if code != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), typ) || len(body) < 100 {
			t.Errorf("GET %s: %d %q, %d bytes", path, code, h.Get("Content-Type"), len(body))
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
	}
	if _, _, page := call(t, "GET", base+"/ui/", ""); !strings.Contains(page, `src="app.js"`) || strings.Contains(page, "<script>") {
		t.Errorf("the page does not load app.js, or has an inline script:\n%s", page)
	}
	if _, _, js := call(t, "GET", base+"/ui/app.js", ""); strings.Contains(js, "innerHTML") || strings.Contains(js, "insertAdjacentHTML") {
		t.Error("app.js parses strings as HTML")
	}
	if code, h, _ := call(t, "POST", base+"/ui/status.json", "{}"); code != http.StatusMethodNotAllowed || h.Get("Allow") != "GET" {
		t.Errorf("POST /ui/status.json: %d Allow %q, want 405 GET", code, h.Get("Allow"))
	}
	for _, path := range []string{"/ui/nothing", "/ui/status.json/x", "/uix"} {
		if code, _, _ := call(t, "GET", base+path, ""); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, code)
		}
	}

	st, _ := status(t, base)
	if st.WorkersTotal != 0 || len(st.Workers) != 0 || len(st.Models) != 0 || !st.Snapshot.Enabled || st.Queues.RouterEnabled {
		t.Fatalf("a new daemon's document: %+v", st)
	}

	model, _ := json.Marshal(hostileModel)
	post(t, base+"/v1/workers", `{"worker_id":`+bigWorker+`,"model":`+string(model)+`,"dp_ranks":[0,1],"http_endpoint":"http://10.0.0.7:8000"}`, http.StatusCreated)
	post(t, base+"/v1/events", `{"worker_id":`+bigWorker+`,"events":[{"type":"stored","event_id":1,"dp_rank":0,"block_hashes":[5,6],"token_ids":[`+tokens(1, 32)+`]}]}`, http.StatusOK)
	for i := range 3 {
		post(t, base+"/v1/route", fmt.Sprintf(`{"request_id":"r%d","model":%s,"token_ids":[%s]}`, i, model, tokens(1, 40)), http.StatusOK)
	}

	var body string
	eventually(t, 10*time.Second, func() error {
		st, body = status(t, base)
		if st.Routes.Routed != 3 || st.Events.Applied != 1 || st.Snapshot.AgeSeconds == nil || st.WorkersTotal != 2 {
			return fmt.Errorf("the document does not show the workers, events, routes and a snapshot yet:\n%s", body)
		}
		return nil
	})
	if strings.Contains(body, "<img") {
		t.Errorf("the document carries a worker's markup unescaped:\n%s", body)
	}
	if st.WorkerIDs != 1 || len(st.Workers) != 2 {
		t.Errorf("worker_ids %d, %d ranks listed; want 1 worker of 2 ranks", st.WorkerIDs, len(st.Workers))
	}
	for i, w := range st.Workers {
		if w.WorkerID != bigWorker || w.Rank != uint32(i) || w.Model != hostileModel || w.Role != "both" || w.HTTPEndpoint != "http://10.0.0.7:8000" {
			t.Errorf("rank %d: %+v", i, w)
		}
	}
	w0 := st.Workers[0]
	if w0.CachedBlocks != 2 || w0.LastEventID != 1 || w0.ActiveRequests != 3 || w0.State != "stream" || w0.LastEventAge == nil {
		t.Errorf("rank 0 after its events and three routes: %+v", w0)
	}
	if st.Index.Blocks != 2 || st.Index.Residencies != 2 || len(st.Models) != 1 || st.Models[0].Model != hostileModel || st.Models[0].Workers != 2 {
		t.Errorf("index %+v, models %+v; want 2 blocks held once, one model of 2 ranks", st.Index, st.Models)
	}
	// Each route's prompt holds both cached blocks (40 tokens: two full blocks of 16).
	if st.Routes.Active != 3 || st.Routes.HitRateRequests != 3 || st.Routes.HitRateSum != 3 {
		t.Errorf("routes %+v; want 3 routed and active, each with every block cached", st.Routes)
	}
	if st.Events.Processed != 1 || st.Events.Gaps != 0 {
		t.Errorf("events %+v", st.Events)
	}
	if st.Memory.HeapBytes == 0 || st.Memory.RuntimeBytes < st.Memory.HeapBytes {
		t.Errorf("memory %+v", st.Memory)
	}
	if age := *st.Snapshot.AgeSeconds; age < 0 || st.Snapshot.Last.IsZero() || st.Snapshot.Last.After(st.Time) {
		t.Errorf("snapshot %+v at %v", st.Snapshot, st.Time)
	}
	if st.UptimeSeconds <= 0 {
		t.Errorf("uptime %v", st.UptimeSeconds)
	}
}

// TestStatusDocumentOptions: without snapshots the document says so, and with the router queue
// it counts the requests waiting (none here).
func TestStatusDocumentOptions(t *testing.T) {
	base := startDaemon(t, func(c *daemon.Config) {
		c.NoSnapshots, c.NoKVEvents = true, true
		c.RouterQueueThreshold = daemon.OptFloat{V: 1, On: true}
	})
	st, body := status(t, base)
	if st.Snapshot.Enabled || st.Snapshot.AgeSeconds != nil || !st.Queues.RouterEnabled || st.Queues.Router != 0 {
		t.Errorf("without snapshots, with the router queue:\n%s", body)
	}
}
