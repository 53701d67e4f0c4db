package fuzz

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/refmodel"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/server"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// rawPaths are where a request of arbitrary bytes goes, by the input's choice.
var rawPaths = []string{
	"/v1/route", "/v1/match", "/v1/requests/r1/prefill_done", "/v1/requests/r1/complete",
	"/v1/events", "/v1/workers", "/v1/workers/1", "/register", "/unregister", "/workers",
	"/query", "/query_by_hash", "/dump", "/health", "/healthz", "/readyz", "/metrics",
	"/v1/snapshot",
}

var rawMethods = []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}

// httpRun is one input's sequence of requests to a whole Server over an in-memory connection,
// with what the answers say the router must hold: per model a reference fleet fed the event
// batches the server accepted, the workers registered, and the requests booked.
type httpRun struct {
	t      *testing.T
	in     *input
	g      *streamGen
	c      *fasthttp.Client
	models map[string]*refmodel.Fleet
	worker map[uint64]string // registered worker → model
	booked map[string]uint64 // request id → worker
	gone   map[uint64]bool   // workers unregistered since a request was booked on them
	nextID int
	// tainted: a request of arbitrary bytes changed the router (a 2xx to anything but a read),
	// so the model no longer knows what it holds; only the answers' shape is checked from then.
	tainted bool
	req     fasthttp.Request
	resp    fasthttp.Response
}

// do sends one request and checks the answer's shape: never 5xx, and every refusal a JSON
// error naming the field at fault. It returns the status.
func (h *httpRun) do(method, path, ctype string, body []byte) int {
	h.t.Helper()
	h.req.Reset()
	h.resp.Reset()
	h.req.Header.SetMethod(method)
	h.req.SetRequestURI("http://kvrouterd" + path)
	if ctype != "" {
		h.req.Header.SetContentType(ctype)
	}
	h.req.SetBody(body)
	if err := h.c.DoTimeout(&h.req, &h.resp, 10*time.Second); err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	code := h.resp.StatusCode()
	out := h.resp.Body()
	if code >= 500 {
		h.t.Fatalf("%s %s %q: status %d: %s", method, path, body, code, out)
	}
	if code >= 400 && method != "HEAD" { // an answer to HEAD has no body
		var e struct {
			Error string `json:"error"`
			Field string `json:"field"`
		}
		if err := json.Unmarshal(out, &e); err != nil || e.Error == "" || e.Field == "" {
			h.t.Fatalf("%s %s %q: status %d without a JSON error naming a field: %q", method, path, body, code, out)
		}
	}
	return code
}

func (h *httpRun) ctype() (string, bool) {
	if h.in.n(2) == 0 {
		return wire.ContentType, true
	}
	return "application/json", false
}

func (h *httpRun) register() {
	id := uint64(1 + h.in.n(4))
	model, bs := "m", streamBS
	if h.in.n(4) == 0 {
		model = "m2"
	}
	if h.in.n(6) == 0 {
		bs = 2 * streamBS // a second block size for the model: refused once it has one
	}
	ranks := "[0,1]"
	if h.in.n(4) == 0 {
		ranks = "[0]"
	}
	body := fmt.Sprintf(`{"worker_id":%d,"model":%q,"block_size":%d,"dp_ranks":%s,"capacity_blocks":100}`, id, model, bs, ranks)
	if h.do("POST", "/v1/workers", "application/json", []byte(body)) < 300 {
		if h.models[model] == nil {
			h.models[model] = refmodel.NewFleet(bs, 0)
		}
		h.worker[id] = model
	}
}

type eventJSON struct {
	Type      string   `json:"type"`
	EventID   uint64   `json:"event_id,omitempty"`
	Rank      uint32   `json:"dp_rank"`
	Hashes    []uint64 `json:"block_hashes,omitempty"`
	Parent    *uint64  `json:"parent_hash,omitempty"`
	Tokens    []uint32 `json:"token_ids,omitempty"`
	BlockSize int      `json:"block_size,omitempty"`
	Medium    string   `json:"medium,omitempty"`
}

func (h *httpRun) events() {
	b := h.g.batch()
	b.Worker = uint64(1 + h.in.n(4))
	for i := range b.Events { // the generator's engine hashes name the worker it drew
		for j := range b.Events[i].Hashes {
			b.Events[i].Hashes[j] = b.Events[i].Hashes[j]&(1<<48-1) | b.Worker<<48
		}
		if b.Events[i].HasParent {
			b.Events[i].Parent = b.Events[i].Parent&(1<<48-1) | b.Worker<<48
		}
	}
	if h.in.n(4) == 0 {
		b.Model = ""
	}
	ctype, binary := h.ctype()
	var body []byte
	if binary {
		body = wire.AppendEventBatch(nil, b)
	} else {
		evs := make([]eventJSON, len(b.Events))
		for i, e := range b.Events {
			evs[i] = eventJSON{Type: strings.ToLower(e.Kind.String()), EventID: e.ID, Rank: e.Rank, Hashes: e.Hashes,
				Tokens: e.Tokens, BlockSize: e.BlockSize}
			if e.HasParent {
				evs[i].Parent = &e.Parent
			}
			if e.Tier == kvevent.Host {
				evs[i].Medium = "CPU"
			}
		}
		var err error
		if body, err = json.Marshal(map[string]any{"worker_id": b.Worker, "model": b.Model, "events": evs}); err != nil {
			h.t.Fatal(err)
		}
	}
	if h.do("POST", "/v1/events", ctype, body) >= 300 {
		return
	}
	f := h.models[h.worker[b.Worker]]
	if f == nil {
		h.t.Fatalf("events of worker %d (model %q) accepted, but it is not registered", b.Worker, h.worker[b.Worker])
	}
	var want []string
	for i := range b.Events {
		want = append(want, f.Apply(b.Worker, &b.Events[i]).Status.String())
	}
	if !binary {
		var got struct {
			Outcomes []struct {
				Status string `json:"status"`
			} `json:"outcomes"`
		}
		if err := json.Unmarshal(h.resp.Body(), &got); err != nil {
			h.t.Fatalf("events answer %q: %v", h.resp.Body(), err)
		}
		for i, o := range got.Outcomes {
			if i >= len(want) || o.Status != want[i] {
				h.t.Fatalf("events %s: outcomes %q, model %v", body, h.resp.Body(), want)
			}
		}
	}
}

// route routes (book) or matches a prompt of the tree the events store. A match's depths must
// be the model's.
func (h *httpRun) route(book bool) {
	p := h.g.path()
	toks := pathTokens(p)
	model := []string{"m", "m", "m2", "x"}[h.in.n(4)]
	id := ""
	if book {
		id = "r" + strconv.Itoa(h.nextID)
		if h.in.n(8) == 0 {
			id = "r" + strconv.Itoa(h.in.n(h.nextID+1)) // a duplicate, or unknown
		} else {
			h.nextID++
		}
	}
	path := "/v1/match"
	if book {
		path = "/v1/route"
	}
	ctype, binary := h.ctype()
	var body []byte
	if binary {
		body = wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: id, Model: model, Tokens: toks})
	} else {
		var err error
		if body, err = json.Marshal(map[string]any{"request_id": id, "model": model, "token_ids": toks}); err != nil {
			h.t.Fatal(err)
		}
	}
	if h.do("POST", path, ctype, body) >= 300 {
		return
	}
	var resp wire.RouteResponse
	if binary {
		if err := wire.DecodeRouteResponse(h.resp.Body(), &resp); err != nil {
			h.t.Fatalf("%s answer %x: %v", path, h.resp.Body(), err)
		}
	} else {
		var j struct {
			Chosen     bool   `json:"chosen"`
			Worker     uint64 `json:"worker_id"`
			Candidates []struct {
				Worker uint64 `json:"worker_id"`
				Rank   uint32 `json:"dp_rank"`
				Cached uint32 `json:"cached_blocks"`
			} `json:"candidates"`
		}
		if err := json.Unmarshal(h.resp.Body(), &j); err != nil {
			h.t.Fatalf("%s answer %q: %v", path, h.resp.Body(), err)
		}
		resp.Chosen, resp.Worker = j.Chosen, j.Worker
		for _, c := range j.Candidates {
			resp.Candidates = append(resp.Candidates, wire.Candidate{Worker: c.Worker, Rank: c.Rank, CachedBlocks: c.Cached})
		}
	}
	if book {
		if !resp.Chosen {
			h.t.Fatalf("route %s answered 200 without a choice: %q", body, h.resp.Body())
		}
		h.booked[id] = resp.Worker
		return
	}
	if f := h.models[model]; f != nil && !h.tainted {
		h.checkDepths(&resp, f, toks, model, p)
	}
}

func (h *httpRun) lifecycle(what string) {
	id := "r" + strconv.Itoa(h.in.n(h.nextID+2))
	code := h.do("POST", "/v1/requests/"+id+"/"+what, "", nil)
	if what == "complete" && code < 300 {
		delete(h.booked, id)
	}
}

func (h *httpRun) unregister() {
	id := uint64(1 + h.in.n(4))
	if h.do("DELETE", "/v1/workers/"+strconv.FormatUint(id, 10), "", nil) >= 300 {
		return
	}
	if f := h.models[h.worker[id]]; f != nil {
		f.RemoveWorker(id)
	}
	delete(h.worker, id)
	h.gone[id] = true
}

func (h *httpRun) raw() {
	method := rawMethods[h.in.n(len(rawMethods))]
	path := rawPaths[h.in.n(len(rawPaths))]
	if h.in.n(8) == 0 {
		var b strings.Builder
		b.WriteByte('/')
		for range h.in.n(12) {
			if c := h.in.byte(); c > ' ' && c < 0x7f && c != '?' && c != '#' && c != '%' {
				b.WriteByte(c)
			}
		}
		path = b.String()
	}
	ctype := []string{wire.ContentType, "application/json", "", "text/plain"}[h.in.n(4)]
	n := h.in.n(64)
	if n > len(h.in.b) {
		n = len(h.in.b)
	}
	body := append([]byte(nil), h.in.b[:n]...)
	h.in.b = h.in.b[n:]
	if code := h.do(method, path, ctype, body); code < 300 && method != "GET" && method != "HEAD" {
		h.tainted = true
	}
}

// dynamo sends one of Dynamo's endpoints a JSON object built from its fields' names with
// values of every JSON type (null, numbers out of range, strings, arrays, objects), which a
// byte-level body would hardly ever spell.
func (h *httpRun) dynamo() {
	paths := []string{"/register", "/unregister", "/query", "/query_by_hash", "/register_peer", "/deregister_peer"}
	names := []string{"instance_id", "endpoint", "model_name", "block_size", "routing_group", "tenant_id", "dp_rank",
		"replay_endpoint", "additional_salt", "token_ids", "block_hashes", "lora_name", "cache_salt", "url"}
	values := []string{"null", "0", "1", "-1", "4", "18446744073709551615", "1e400", "1.5", `""`, `"m"`, `"tcp://127.0.0.1:1"`,
		"[]", "[1,2,3,4]", "[-1]", "[null]", "{}", "true"}
	var b strings.Builder
	b.WriteByte('{')
	for i := range h.in.n(8) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(names[h.in.n(len(names))]) + ":" + values[h.in.n(len(values))])
	}
	b.WriteByte('}')
	if code := h.do("POST", paths[h.in.n(len(paths))], "application/json", []byte(b.String())); code < 300 {
		h.tainted = true
	}
}

// finish completes every request booked, and checks the router's state: /v1/workers answers,
// no load is left, and every worker's blocks and match depths are the model's.
func (h *httpRun) finish(r *router.Router) {
	for id, w := range h.booked {
		if code := h.do("POST", "/v1/requests/"+id+"/complete", "", nil); code != fasthttp.StatusNoContent &&
			!(code == fasthttp.StatusNotFound && h.gone[w]) && !h.tainted {
			h.t.Fatalf("request %s booked on worker %d: complete answered %d: %s", id, w, code, h.resp.Body())
		}
	}
	if code := h.do("GET", "/v1/workers", "", nil); code != fasthttp.StatusOK {
		h.t.Fatalf("GET /v1/workers: %d", code)
	}
	if h.tainted {
		return
	}
	var list struct {
		Workers []router.WorkerInfo `json:"workers"`
	}
	if err := json.Unmarshal(h.resp.Body(), &list); err != nil {
		h.t.Fatalf("GET /v1/workers: %v: %s", err, h.resp.Body())
	}
	for _, w := range list.Workers {
		if w.ActiveRequests != 0 || w.ActiveBlocks != 0 || w.ActivePrefill != 0 {
			h.t.Fatalf("every request completed, and worker %d/%d still carries %+v", w.ID, w.Rank, w)
		}
		f := h.models[w.Model]
		if f == nil || h.worker[w.ID] != w.Model {
			h.t.Fatalf("worker %+v listed, registered as %q", w, h.worker[w.ID])
		}
		if n := f.Index.Blocks(radix.WorkerKey{ID: w.ID, Rank: w.Rank}); int(w.CachedBlocks) != n {
			h.t.Fatalf("worker %d/%d caches %d blocks, model %d", w.ID, w.Rank, w.CachedBlocks, n)
		}
	}
	var resp wire.RouteResponse
	for model, f := range h.models {
		for _, p := range treePrompts() {
			toks := pathTokens(p)
			if err := r.Match(&wire.RouteRequest{Model: model, Tokens: toks}, &resp); err != nil {
				if slices.Contains(slices.Collect(maps.Values(h.worker)), model) {
					h.t.Fatalf("match on %s, which has workers: %v", model, err)
				}
				break // every worker of the model left
			}
			h.checkDepths(&resp, f, toks, model, p)
		}
	}
}

// FuzzHTTP drives a whole Server, over a connection, with a sequence of requests the input
// chooses: registrations (some conflicting), event batches in binary and JSON (some for unknown
// workers, ranks or models), routes and matches, prefill-done and complete calls for known and
// unknown requests, unregistrations, and requests of arbitrary method, path, content type and
// body. Every answer is below 500 and every refusal a JSON error naming a field; every accepted
// event's outcome, and every match's depths, are those of a reference fleet (internal/refmodel)
// fed the accepted batches. At the end every booked request completes, /v1/workers answers,
// no load is left, and each worker's blocks and match depths are the model's — unless an
// arbitrary request was accepted as a change, after which only the answers' shape is checked.
func FuzzHTTP(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 0, 0, 0, 2, 1, 3, 1, 1, 2, 3, 4, 2, 0, 1, 0, 5, 1, 0, 3, 2, 1, 4})
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x01\x01\x02\x03\x04\x05\x02\x00\x01\x02\x03\x04\x06\x07\x08\x09"))
	f.Add([]byte("\x08\x01\x00\x00{\"worker_id\":1,\"model\":\"m\",\"block_size\":4}\x08\x02\x01\x01\x10{\"model\":\"m\"}"))
	f.Add([]byte("\x08\x00\x07\x02\x00\x00\x08\x01\x12\x01\x30\x08\x04\x11\x00\x00"))
	// Workers 1 to 4 registered for "m" with ranks 0 and 1 (op 0, id, model, block size,
	// ranks), then random choices: most events are accepted and routes find blocks.
	registered := []byte{0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 2, 1, 1, 1, 0, 3, 1, 1, 1}
	for seed := range 6 {
		b := make([]byte, 400)
		x := uint32(seed*104729 + 3)
		for i := range b {
			x = x*1664525 + 1013904223
			b[i] = byte(x >> 24)
		}
		if seed >= 2 {
			b = append(registered[:len(registered):len(registered)], b...)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &input{b: data}
		r := router.New(router.Config{BlockSize: streamBS, Shards: 2, Logger: quiet()})
		defer r.Close()
		s := server.New(r, server.Config{MaxBodyBytes: 64 << 10, Logger: quiet()})
		ln := fasthttputil.NewInmemoryListener()
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()
		var c *fasthttp.Client
		defer func() {
			// Closing the client's connection and the listener ends Serve at once; Shutdown
			// would poll for the connection to go, 100 ms an input.
			c.CloseIdleConnections()
			_ = ln.Close()
			<-served
		}()
		c = &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
		h := &httpRun{t: t, in: in, g: &streamGen{in: in, next: map[radix.WorkerKey]uint64{}},
			c:      c,
			models: map[string]*refmodel.Fleet{}, worker: map[uint64]string{}, booked: map[string]uint64{},
			gone: map[uint64]bool{}}
		for step := 0; step < 40 && !in.done(); step++ {
			switch in.n(10) {
			case 0:
				h.register()
			case 1, 2:
				h.events()
			case 3:
				h.route(true)
			case 4:
				h.route(false)
			case 5:
				h.lifecycle([]string{"complete", "prefill_done"}[in.n(2)])
			case 6:
				h.do("GET", "/v1/workers", "", nil)
			case 7:
				h.unregister()
			case 8:
				h.raw()
			case 9:
				h.dynamo()
			}
		}
		h.finish(r)
	})
}

// checkDepths holds a match answer's cached depths to the reference fleet f of model; p names
// the prompt in the failure.
func (h *httpRun) checkDepths(resp *wire.RouteResponse, f *refmodel.Fleet, toks []uint32, model string, p any) {
	h.t.Helper()
	got := map[radix.WorkerKey]int{}
	for _, c := range resp.Candidates {
		if c.CachedBlocks > 0 {
			got[radix.WorkerKey{ID: c.Worker, Rank: c.Rank}] = int(c.CachedBlocks)
		}
	}
	if want := f.Index.Match(refmodel.SeqHashes(toks, f.BlockSize, "")); !maps.Equal(got, want) {
		h.t.Fatalf("match %v on %s: depths %v, model %v", p, model, got, want)
	}
}
