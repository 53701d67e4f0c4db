package frontdoor

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/valyala/fasthttp"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMeasured: an answer's time to first token, inter-token latency and lengths are measured
// per model and per (worker, rank), under kvrouterd's names and Dynamo frontend's; a rank's
// series go when it does.
func TestMeasured(t *testing.T) {
	e := startEngine(t, 3)
	f := newFixture(t, Config{}, e)
	resp := f.post(t, "/v1/chat/completions", chatBody)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.waitIdle(t, "after the answer")
	m, ok := f.d.Measured(1, 0)
	if !ok || m.Answers != 1 || m.LastTTFT <= 0 || m.LastITL <= 0 || m.LastISL == 0 {
		t.Fatalf("measured %+v %v", m, ok)
	}
	for _, name := range []string{"kvrouterd_frontdoor_time_to_first_token_seconds", "dynamo_frontend_time_to_first_token_seconds",
		"dynamo_frontend_inter_token_latency_seconds", "dynamo_frontend_output_sequence_tokens", "dynamo_frontend_input_sequence_tokens"} {
		if n := testutil.CollectAndCount(f.reg, name); n != 1 {
			t.Errorf("%s: %d series", name, n)
		}
	}
	if got := testutil.ToFloat64(f.d.m.dynOutputTokens.WithLabelValues("m")); got != 3 {
		t.Errorf("output tokens %v, want the usage's 3", got)
	}
	want := `dynamo_frontend_worker_last_input_sequence_tokens{dp_rank="0",worker_id="1",worker_type="decode"} 7`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader("# HELP dynamo_frontend_worker_last_input_sequence_tokens The last answered request's input tokens of each worker's rank (Dynamo frontend's gauge).\n# TYPE dynamo_frontend_worker_last_input_sequence_tokens gauge\n"+want+"\n"),
		"dynamo_frontend_worker_last_input_sequence_tokens"); err != nil {
		t.Error(err)
	}
	if err := f.r.Unregister(1); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(f.reg, "dynamo_frontend_worker_last_time_to_first_token_seconds"); n != 0 {
		t.Errorf("%d series of an unregistered worker", n)
	}
}

// TestTokenizeRefused: a worker that refuses the /tokenize call's connection is ejected at once,
// as one that refuses the request's.
func TestTokenizeRefused(t *testing.T) {
	down, up := startEngine(t, 1), startEngine(t, 1)
	down.ln.Close()
	f := newFixture(t, Config{}, down, up)
	// Pinned to the working one: only /tokenize meets the down one. The workers tokenize in
	// turn, so one of the two requests asks the down one first.
	pinned := strings.TrimSuffix(chatBody, "}") + `,"nvext":{"backend_instance_id":2}}`
	for range 2 {
		resp := f.post(t, "/v1/chat/completions", pinned)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	for _, w := range f.r.Workers() {
		if w.ID == 1 && w.Health != "ejected" {
			t.Errorf("the worker refusing /tokenize: %q, want ejected", w.Health)
		}
	}
}

// TestStreamAsked: whatever the client says of streaming, the engine is asked to stream with
// the usage chunk, each key once, and the client's other stream options kept.
func TestStreamAsked(t *testing.T) {
	e := startEngine(t, 1)
	f := newFixture(t, Config{}, e)
	for body, want := range map[string]string{
		`{"model":"m","prompt":[1,2,3,4,5]}`:                                                                `{"model":"m","prompt":[1,2,3,4,5],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[1,2,3,4,5],"stream":true} `:                                                 `{"model":"m","prompt":[1,2,3,4,5],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[1,2,3,4,5],"stream":false}`:                                                 `{"model":"m","prompt":[1,2,3,4,5],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[1,2,3,4,5],"stream":true,"stream_options":{"continuous_usage_stats":true}}`: `{"model":"m","prompt":[1,2,3,4,5],"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}`,
	} {
		resp := f.post(t, "/v1/completions", body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-e.ranks
		if got := string(<-e.received); got != want {
			t.Errorf("%s: the engine got %s, want %s", body, got, want)
		}
	}
}

// TestSlowEngineOutlivesReadTimeout: a request whose engine takes longer than the server's read
// timeout to answer is served, not taken for a client gone (the timeout's deadline stays on the
// client's connection while the handler runs).
func TestSlowEngineOutlivesReadTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			io.WriteString(w, `{"tokens":[1,2,3,4,5,6,7,8]}`)
			return
		}
		time.Sleep(700 * time.Millisecond)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: "+chunkJSON(true, 0, 1)+"\n\ndata: [DONE]\n\n")
	}))
	r := router.New(router.Config{BlockSize: bs, Shards: 1, Logger: slog.New(slog.DiscardHandler)})
	defer r.Close()
	if err := r.Register(router.Registration{ID: 1, Model: "m", BlockSize: bs, HTTPEndpoint: "http://" + ln.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	d := New(r, Config{})
	defer d.Close()
	fln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fln.Close()
	go (&fasthttp.Server{Handler: d.Handle, ReadTimeout: 200 * time.Millisecond}).Serve(fln)
	resp, err := http.Post("http://"+fln.Addr().String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"t0"`) {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
}
