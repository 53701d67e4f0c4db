package server

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// fuzzPaths are the endpoints FuzzHandle sends to, by the input's first byte; "{}" is replaced
// by the input's id.
var fuzzPaths = []struct{ method, path string }{
	{"POST", "/v1/route"}, {"POST", "/v1/match"}, {"POST", "/v1/requests/{}/prefill_done"}, {"POST", "/v1/requests/{}/output"},
	{"POST", "/v1/requests/{}/complete"}, {"POST", "/v1/events"}, {"POST", "/v1/workers"},
	{"GET", "/v1/workers"}, {"DELETE", "/v1/workers/{}"}, {"POST", "/register"},
	{"POST", "/unregister"}, {"GET", "/workers"}, {"POST", "/query"}, {"POST", "/query_by_hash"},
	{"GET", "/dump"}, {"GET", "/health"}, {"GET", "/healthz"}, {"GET", "/readyz"},
	{"GET", "/v1/snapshot"}, {"PUT", "/v1/route"}, {"POST", "/{}"},
}

// FuzzHandle sends arbitrary bodies, binary or JSON, to every endpoint of a Server whose router
// has a registered worker with blocks and a request in flight. Whatever comes in, the server
// answers below 500 (but /readyz, which is never 503 here either), every refusal carries a
// JSON error, and a refused request leaves the router's workers and models as they were.
// Accepted requests may change them (a registration, events), which the next input starts from.
func FuzzHandle(f *testing.F) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{BlockSize: 4, Shards: 2, Logger: quiet})
	f.Cleanup(r.Close)
	s := New(r, Config{MaxBodyBytes: 64 << 10, Logger: quiet})
	if err := r.Register(router.Registration{ID: 1, Model: "m", BlockSize: 4}); err != nil {
		f.Fatal(err)
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	if _, err := r.ApplyEvents(&wire.EventBatch{Worker: 1, Model: "m", Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{10, 11}, Tokens: toks}}}, nil); err != nil {
		f.Fatal(err)
	}
	if err := r.Route(&wire.RouteRequest{RequestID: "busy", Model: "m", Tokens: toks}, &wire.RouteResponse{}); err != nil {
		f.Fatal(err)
	}

	route := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "x", Model: "m", Tokens: toks, MaxCandidates: 1})
	events := wire.AppendEventBatch(nil, &wire.EventBatch{Worker: 1, Model: "m", Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 2, Hashes: []uint64{12}, Parent: 11, HasParent: true, Tokens: []uint32{9, 10, 11, 12}},
		{Kind: kvevent.Removed, ID: 3, Hashes: []uint64{10}}}})
	for _, seed := range []struct {
		ep     byte
		binary bool
		id     string
		body   []byte
	}{
		{0, true, "", route},
		{1, true, "", route},
		{0, false, "", []byte(`{"request_id":"j","model":"m","token_ids":[1,2,3,4,5,6,7,8],"overlap_score_weight":2}`)},
		{2, false, "busy", nil},
		{3, false, "busy", nil},
		{4, true, "", events},
		{4, false, "", []byte(`{"worker_id":1,"events":[{"type":"stored","event_id":4,"block_hashes":[13],"parent_hash":12,"token_ids":[13,14,15,16]}]}`)},
		{5, false, "", []byte(`{"worker_id":2,"model":"m","block_size":4,"capacity_blocks":100}`)},
		{5, false, "", []byte(`{"worker_id":3,"model":"m","role":"prefill"}`)},
		{0, false, "", []byte(`{"request_id":"d","model":"m","token_ids":[1,2,3,4,5,6,7,8],"disagg":true}`)},
		{0, true, "", wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "e", Model: "m", Tokens: toks, Disagg: true})},
		{7, false, "2", nil},
		{8, false, "", []byte(`{"instance_id":7,"endpoint":"tcp://w7:5557","model_name":"m","block_size":4,"dp_rank":0}`)},
		{9, false, "", []byte(`{"instance_id":7,"model_name":"m"}`)},
		{11, false, "", []byte(`{"model_name":"m","token_ids":[1,2,3,4,5,6,7,8]}`)},
		{12, false, "", []byte(`{"model_name":"m","block_hashes":[1,-2]}`)},
		{13, false, "", nil},
		{19, false, "metrics", nil},
	} {
		f.Add(seed.ep, seed.binary, seed.id, seed.body)
	}

	var remote net.Addr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	f.Fuzz(func(t *testing.T, ep byte, binary bool, id string, body []byte) {
		p := fuzzPaths[int(ep)%len(fuzzPaths)]
		path := strings.ReplaceAll(p.path, "{}", id)
		var req fasthttp.Request
		req.Header.SetMethod(p.method)
		req.SetRequestURI(path)
		if binary {
			req.Header.SetContentType(wire.ContentType)
		} else {
			req.Header.SetContentType("application/json")
		}
		req.SetBody(body)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, remote, nil)
		workers, models := r.Workers(), r.Models()

		s.Handle(&ctx)

		code, out := ctx.Response.StatusCode(), ctx.Response.Body()
		if code >= 500 {
			t.Fatalf("%s %s: status %d: %s", p.method, ctx.Path(), code, out)
		}
		if code < 400 {
			return
		}
		if !bytes.Contains(out, []byte(`"error"`)) {
			t.Fatalf("%s %s: status %d without a JSON error: %q", p.method, ctx.Path(), code, out)
		}
		if w, m := r.Workers(), r.Models(); !reflect.DeepEqual(w, workers) || !reflect.DeepEqual(m, models) {
			t.Fatalf("%s %s refused with %d but changed the router:\nworkers %+v\n     -> %+v\nmodels  %+v\n     -> %+v",
				p.method, ctx.Path(), code, workers, w, models, m)
		}
	})
}
