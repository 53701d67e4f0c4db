package mocker

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvrouterd/kvrouterd/frontdoor"
	"github.com/kvrouterd/kvrouterd/router"
)

// disaggFleet is kvrouterd's router and front door over real sockets, with one worker per role
// given (prefill, decode or both), each at its endpoint.
type disaggFleet struct {
	r    *router.Router
	reg  *prometheus.Registry
	url  string // the front door's
	door *frontdoor.Door
}

func newDisaggFleet(t *testing.T, workers map[uint64]router.Role, endpoints map[uint64]string) *disaggFleet {
	t.Helper()
	f := &disaggFleet{reg: prometheus.NewRegistry()}
	f.r = router.New(router.Config{Shards: 1, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(f.r.Close)
	for id, role := range workers {
		if err := f.r.Register(router.Registration{ID: id, Model: "kvr-mock", BlockSize: 16, MaxTokens: 8192,
			HTTPEndpoint: endpoints[id], Role: role}); err != nil {
			t.Fatal(err)
		}
	}
	f.door = frontdoor.New(f.r, frontdoor.Config{Registry: f.reg})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go (&fasthttp.Server{Handler: f.door.Handle}).Serve(ln)
	t.Cleanup(func() { ln.Close() })
	f.url = "http://" + ln.Addr().String()
	return f
}

func (f *disaggFleet) disagg(outcome string) float64 {
	mfs, _ := f.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "kvrouterd_frontdoor_disaggregated_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// released waits until the router holds no booking — both stages' released — and every
// worker's load is back to zero.
func (f *disaggFleet) released(t *testing.T) {
	t.Helper()
	waitUntil(t, "every booking released", func() bool {
		if f.r.Stats().ActiveRequests != 0 {
			return false
		}
		for _, w := range f.r.Workers() {
			if w.ActiveBlocks != 0 || w.ActivePrefill != 0 || w.ActiveRequests != 0 {
				return false
			}
		}
		return true
	})
}

const disaggChat = `{"model":"kvr-mock","max_completion_tokens":4,"stream":true,"stream_options":{"include_usage":true},` +
	`"messages":[{"role":"system","content":"You are a cache that answers in a few words, every time, whatever the question."},` +
	`{"role":"user","content":"Where do the blocks of a long prompt go when a prefill worker is done with them?"}]}`

// streamChat posts disaggChat to the front door and returns the answer's headers, its text and
// its usage.
func streamChat(t *testing.T, url string) (http.Header, string, usage) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(disaggChat))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var text strings.Builder
	var u usage
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		a := decodeAnswer(t, []byte(line))
		if len(a.Choices) > 0 && a.Choices[0].Delta != nil && a.Choices[0].Delta.Content != nil {
			text.WriteString(*a.Choices[0].Delta.Content)
		}
		if a.Usage != nil {
			u = *a.Usage
		}
	}
	return resp.Header, text.String(), u
}

// TestDisaggregatedThroughFrontDoor: a chat completion through the front door runs on a prefill
// mocker (one token, blocks kept) then on a decode mocker, which reads the blocks — paying the
// modelled transfer before its first token — and computes only the last prompt token. The
// answer is the one an aggregated engine gives, and both stages' bookings are released.
func TestDisaggregatedThroughFrontDoor(t *testing.T) {
	p := start(t, func(c *Config) { c.Role = "prefill"; c.WorkerID = 1 })
	d := start(t, func(c *Config) { c.Role = "decode"; c.WorkerID = 2 })
	f := newDisaggFleet(t, map[uint64]router.Role{1: router.RolePrefill, 2: router.RoleDecode},
		map[uint64]string{1: p.HTTPEndpoint(), 2: d.HTTPEndpoint()})

	var msgs struct {
		Messages json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal([]byte(disaggChat), &msgs)
	prompt := tokenize(t, d, `{"messages":`+string(msgs.Messages)+`}`)
	blocks := (len(prompt) + 15) / 16

	h, text, u := streamChat(t, f.url)
	if h.Get("X-Kvrouterd-Worker") != "2" || h.Get("X-Kvrouterd-Prefill-Worker") != "1" {
		t.Fatalf("served by %q after a prefill on %q; want decode worker 2 after prefill worker 1",
			h.Get("X-Kvrouterd-Worker"), h.Get("X-Kvrouterd-Prefill-Worker"))
	}
	if text != expectText(prompt, 4) || u.Prompt != len(prompt) || u.Completion != 4 || u.Details.Cached != len(prompt)-1 {
		t.Errorf("answer %q, usage %+v; want %q and the transferred tokens cached", text, u, expectText(prompt, 4))
	}

	// The prefill worker computed the prompt, generated one token (the front door set
	// max_completion_tokens, which the engine prefers to max_tokens, to 1, and the request is
	// not streamed: the engine refuses stream_options then), and kept the blocks until the
	// decode worker had read them.
	waitUntil(t, "the prefill worker's blocks released", func() bool { st := p.Stats(); return st.Sent == 1 && st.Held == 0 })
	if st := p.Stats(); st.ComputedTokens != uint64(len(prompt)) || st.Generated != 1 || st.Expired != 0 {
		t.Errorf("prefill worker %+v", st)
	}
	// The decode worker received the transfer parameters, read every block (nothing was cached
	// there), paid the modelled transfer before its first token, and computed one prompt token.
	st := d.Stats()
	bytes, cost := d.cfg.transferCost(blocks)
	if st.Received != 1 || st.BlocksIn != uint64(blocks) || st.BytesIn != bytes || st.TransferTime != cost || st.Failed != 0 {
		t.Errorf("decode worker's transfers %+v, want %d blocks, %d bytes, %v", st.Transfers, blocks, bytes, cost)
	}
	if st.ComputedTokens != 1 || st.RemoteTokens != uint64(len(prompt)-1) || st.Generated != 4 {
		t.Errorf("decode worker computed %d prompt tokens (%d remote) and generated %d", st.ComputedTokens, st.RemoteTokens, st.Generated)
	}
	f.released(t)
	if f.disagg("split") != 1 || f.disagg("fallback") != 0 {
		t.Errorf("split %v, fallback %v", f.disagg("split"), f.disagg("fallback"))
	}
}

// TestDisaggregatedFallback: a prefill worker that cannot be reached leaves the decode worker
// to serve the request whole: the client gets its answer, the prompt is computed there, and
// nothing stays booked.
func TestDisaggregatedFallback(t *testing.T) {
	d := start(t, func(c *Config) { c.Role = "decode"; c.WorkerID = 2 })
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	dead.Close() // refuses connections from now on
	f := newDisaggFleet(t, map[uint64]router.Role{1: router.RolePrefill, 2: router.RoleDecode},
		map[uint64]string{1: deadURL, 2: d.HTTPEndpoint()})

	h, text, u := streamChat(t, f.url)
	if h.Get("X-Kvrouterd-Worker") != "2" || h.Get("X-Kvrouterd-Prefill-Worker") != "" {
		t.Errorf("headers %v", h)
	}
	if u.Completion != 4 || u.Details.Cached != 0 || text == "" {
		t.Errorf("answer %q, usage %+v", text, u)
	}
	if st := d.Stats(); st.Received != 0 || st.ComputedTokens != uint64(u.Prompt) {
		t.Errorf("decode worker %+v: want the whole prompt computed there", st)
	}
	f.released(t)
	if f.disagg("fallback") != 1 || f.disagg("split") != 0 {
		t.Errorf("split %v, fallback %v", f.disagg("split"), f.disagg("fallback"))
	}
}

// TestDisaggregatedClientGone: a client that leaves during the prefill stage cancels it: the
// decode worker never sees the request, both bookings are released at once, and the prefill
// worker frees the blocks when its step ends rather than keep them for a reader.
func TestDisaggregatedClientGone(t *testing.T) {
	// A prefill step of 2 s (simulated = wall time here): the client leaves well before.
	p := start(t, func(c *Config) { c.Role = "prefill"; c.WorkerID = 1; c.Speedup = 1; c.Timing.P0 = 2000 })
	d := start(t, func(c *Config) { c.Role = "decode"; c.WorkerID = 2 })
	f := newDisaggFleet(t, map[uint64]router.Role{1: router.RolePrefill, 2: router.RoleDecode},
		map[uint64]string{1: p.HTTPEndpoint(), 2: d.HTTPEndpoint()})

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/chat/completions", strings.NewReader(disaggChat))
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitUntil(t, "the prefill request at the prefill worker", func() bool { return p.api.inflight.Load() == 1 })
	cancel()
	<-done
	f.released(t)
	waitUntil(t, "the prefill request finished and its blocks freed", func() bool {
		st := p.Stats()
		return st.Completed == 1 && st.Held == 0
	})
	if st := p.Stats(); st.Sent != 0 || st.Expired != 0 {
		t.Errorf("prefill worker %+v: the blocks should have been freed at once", st)
	}
	if st := d.Stats(); st.Submitted != 0 || st.Received != 0 {
		t.Errorf("decode worker %+v: it should never have seen the request", st)
	}
	if f.disagg("client_gone") != 1 {
		t.Errorf("client_gone %v", f.disagg("client_gone"))
	}
}
