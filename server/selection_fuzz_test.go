package server

import (
	"encoding/json"
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

// selFuzzRoutes are the requests FuzzSelection sends, by the input's first byte; "{}" is
// replaced by the input's id.
var selFuzzRoutes = []struct{ method, path string }{
	{"POST", "/select"}, {"POST", "/select_and_reserve"}, {"POST", "/reservations"},
	{"POST", "/reservations/{}/prefill_complete"}, {"POST", "/reservations/{}/output_block"},
	{"DELETE", "/reservations/{}"}, {"POST", "/workers"}, {"GET", "/workers"}, {"PATCH", "/workers/{}"},
	{"DELETE", "/workers/{}"}, {"GET", "/ready"}, {"GET", "/loads"}, {"POST", "/potential_loads"},
	{"POST", "/overlap_scores"}, {"GET", "/dump"}, {"POST", "/replica_sync/register_peer"},
	{"GET", "/replica_sync/peers"}, {"GET", "/{}"}, {"PUT", "/select"},
}

// FuzzSelection sends arbitrary bodies to every route of the selection service, whose catalog
// holds a schedulable worker with blocks and a reservation in flight. Whatever comes in, the
// service answers no 500, every refusal (but /ready's 503) is exactly Dynamo's {"error": msg}, and a refused
// request leaves the router's workers and the catalog as they were. Accepted requests may
// change them, which the next input starts from.
func FuzzSelection(f *testing.F) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{BlockSize: 4, Shards: 2, Logger: quiet})
	f.Cleanup(r.Close)
	s := New(r, Config{MaxBodyBytes: 64 << 10, Logger: quiet})
	call := func(method, path, body string) (int, []byte) {
		var req fasthttp.Request
		req.Header.SetMethod(method)
		req.SetRequestURI(path)
		req.Header.SetContentType("application/json")
		req.SetBodyString(body)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil)
		s.HandleSelection(&ctx)
		return ctx.Response.StatusCode(), ctx.Response.Body()
	}
	if code, out := call("POST", "/workers", `{"worker_id":1,"model_name":"m","endpoint":"http://w1","block_size":4,"kv_events_endpoint":"tcp://w1:5557"}`); code != 201 {
		f.Fatalf("%d %s", code, out)
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	if _, err := r.ApplyEvents(&wire.EventBatch{Worker: 1, Model: "m", Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{10, 11}, Tokens: toks}}}, nil); err != nil {
		f.Fatal(err)
	}
	if code, out := call("POST", "/select_and_reserve", `{"selection_id":"busy","model_name":"m","token_ids":[1,2,3,4,5,6,7,8]}`); code != 200 {
		f.Fatalf("%d %s", code, out)
	}

	for _, seed := range []struct {
		route byte
		id    string
		body  string
	}{
		{0, "", `{"model_name":"m","selection_id":"s1","token_ids":[1,2,3,4,5,6,7,8,9],"lora_name":null,"cache_salt":"t","advisory":true,"allowed_worker_ids":[1]}`},
		{0, "", `{"model_name":"m","block_hashes":[-3803038269031200164],"sequence_hashes":[1],"isl_tokens":5,"pinned_worker":{"worker_id":1,"dp_rank":0}}`},
		{0, "", `{"model_name":"m","mm_routing_info":{"routing_token_ids":[1,2,3,4],"block_mm_infos":[{"mm_objects":[{"mm_hash":7,"offsets":[[0,2]]}]}]}}`},
		{1, "", `{"model_name":"m","selection_id":"s2","token_ids":[1,2,3,4,5],"router_config_override":{"track_prefill_tokens":false,"router_temperature":0.5}}`},
		{2, "", `{"model_name":"m","selection_id":"s1"}`},
		{2, "", `{"model_name":"m","selection_id":"s3","worker_id":1,"dp_rank":0,"sequence_hashes":[21,22],"isl_tokens":512,"effective_prefill_tokens":384}`},
		{3, "busy", ``},
		{4, "busy", `{"decay_fraction":0.5}`},
		{5, "busy", ``},
		{6, "", `{"worker_id":2,"model_name":"m","routing_group":"g","endpoint":"http://w2","block_size":4,"data_parallel_size":2,"kv_events_endpoints":{"0":"tcp://w2:1","1":"tcp://w2:2"},"taints":["x"]}`},
		{6, "", `{"worker_id":3,"model_name":"m"}`},
		{7, "", ``},
		{8, "1", `{"total_kv_blocks":10,"kv_events_endpoint":"tcp://w1:5558"}`},
		{9, "3", ``},
		{12, "", `{"model_name":"m","token_ids":[1,2,3,4]}`},
		{13, "", `{"model_name":"m","block_hashes":[1,2],"sequence_hashes":[1,2],"isl_tokens":8}`},
		{15, "", `{"endpoint":"tcp://peer:1"}`},
	} {
		f.Add(seed.route, seed.id, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, route byte, id string, body []byte) {
		rt := selFuzzRoutes[int(route)%len(selFuzzRoutes)]
		path := strings.ReplaceAll(rt.path, "{}", id)
		if strings.ContainsAny(path, "?# \x00") || len(path) > 2000 {
			return // not a path: the request line would not parse
		}
		workers, catalog := r.Workers(), s.sel.records("", "")
		code, out := call(rt.method, path, string(body))
		if code >= 500 && code != 503 {
			t.Fatalf("%s %s: %d %s", rt.method, path, code, out)
		}
		if code < 400 || rt.path == "/ready" { // /ready's 503 is its own answer, not a refusal
			return
		}
		var e map[string]any
		if err := json.Unmarshal(out, &e); err != nil || len(e) != 1 || e["error"] == nil {
			t.Fatalf("%s %s: %d, not Dynamo's error shape: %q", rt.method, path, code, out)
		}
		if w, c := r.Workers(), s.sel.records("", ""); !reflect.DeepEqual(w, workers) || !reflect.DeepEqual(c, catalog) {
			t.Fatalf("%s %s refused with %d but changed the router or the catalog", rt.method, path, code)
		}
	})
}
