package server

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// TestDynamoCompat sends Dynamo's indexer endpoints the bodies today's Dynamo clients send
// (lib/kv-router services/indexer server.rs; tests/router helper.py): fields kvrouterd does not
// know are ignored and counted, routing groups isolate indexes while the legacy tenant_id is
// ignored, cache_salt salts /query's hashes and is refused by /query_by_hash, answers carry
// Dynamo's fields, and refusals have Dynamo's statuses and messages and leave nothing behind.
func TestDynamoCompat(t *testing.T) {
	h := newHarness(t)
	want := func(what string, code int, body string, wantCode int, wantBody string) {
		t.Helper()
		if code != wantCode || !strings.Contains(body, wantBody) {
			t.Fatalf("%s: %d %s, want %d with %s", what, code, body, wantCode, wantBody)
		}
	}
	post := func(path, body string) (int, string) { return h.post(path, "application/json", []byte(body)) }

	// Registrations with every field Dynamo's clients send, and one it does not know.
	code, body := post("/register", `{"instance_id":1,"endpoint":"tcp://w1:5557","model_name":"m","block_size":4,"dp_rank":0,
		"routing_group":"a","tenant_id":"ignored","replay_endpoint":null,"additional_salt":null,"additionalsalt":"s","future_field":{"x":1}}`)
	want("register in group a", code, body, 201, `{"status":"ok"}`)
	code, body = post("/register", `{"instance_id":2,"endpoint":"tcp://w2:5557","model_name":"m","block_size":4,"routing_group":"b"}`)
	want("register in group b", code, body, 201, `"ok"`)
	code, body = post("/register", `{"instance_id":1,"endpoint":"tcp://w1:5558","model_name":"m","block_size":4,"dp_rank":1,"routing_group":"a"}`)
	want("register rank 1 in group a", code, body, 201, `"ok"`)
	_, page := h.get("/metrics")
	if !strings.Contains(page, `kvrouterd_dynamo_unknown_fields_total{path="/register"} 1`+"\n") {
		t.Fatal("the unknown field of /register is not counted once")
	}

	// Refusals: Dynamo's statuses and messages, and no worker left behind.
	for _, c := range []struct {
		body, msg string
		code      int
	}{
		{`{"instance_id":3,"endpoint":"tcp://w3","model_name":"m","block_size":4}`, "invalid ZMQ endpoint `tcp://w3`: missing TCP port", 400},
		{`{"instance_id":3,"endpoint":"w3:5557","model_name":"m","block_size":4}`, "invalid ZMQ endpoint `w3:5557`: missing scheme", 400},
		{`{"instance_id":3,"endpoint":"udp://w3:1","model_name":"m","block_size":4}`, "invalid ZMQ endpoint `udp://w3:1`: unsupported scheme `udp`", 400},
		{`{"instance_id":3,"endpoint":"tcp://w3:99999","model_name":"m","block_size":4}`, "invalid TCP port: number too large to fit in target type", 400},
		{`{"instance_id":3,"endpoint":"tcp://w3:1","replay_endpoint":"tcp://:2","model_name":"m","block_size":4}`, "invalid replay endpoint `tcp://:2`: invalid ZMQ endpoint `tcp://:2`: missing TCP host", 400},
		{`{"instance_id":3,"endpoint":"tcp://w3:1","model_name":"m"}`, "missing field `block_size`", 422},
		{`{"instance_id":"3","endpoint":"tcp://w3:1","model_name":"m","block_size":4}`, `"field":"instance_id"`, 422},
		{`{"instance_id":1,"endpoint":"tcp://w1:5558","model_name":"m","block_size":4,"routing_group":"b","dp_rank":1}`, "instance 1 is already registered for model=m routing_group=a", 409},
		{`{"instance_id":1,"endpoint":"tcp://w1:5557","model_name":"m","block_size":4,"routing_group":"a"}`, "instance 1 dp_rank 0 already registered", 409},
		{`{"instance_id":3,"endpoint":"tcp://w3:1","model_name":"m","block_size":16,"routing_group":"a"}`, "block_size mismatch for model=m routing_group=a: existing=4, requested=16", 409},
	} {
		code, body := post("/register", c.body)
		want("/register "+c.body, code, body, c.code, c.msg)
	}
	if ws := h.r.Workers(); len(ws) != 3 {
		t.Fatalf("refused registrations left workers: %+v", ws)
	}

	// Each group's index holds its own worker's blocks.
	store := func(worker uint64, toks []uint32) {
		t.Helper()
		ev := kvevent.Event{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{worker*10 + 1, worker*10 + 2}, Tokens: toks, BlockSize: 4}
		if res, err := h.c.Events(&wire.EventBatch{Worker: worker, Events: []kvevent.Event{ev}}); err != nil || res.OK != 1 {
			t.Fatalf("events of worker %d: %+v %v", worker, res, err)
		}
	}
	prompt := `[1,2,3,4,5,6,7,8]`
	store(1, []uint32{1, 2, 3, 4, 5, 6, 7, 8})
	store(2, []uint32{1, 2, 3, 4, 5, 6, 7, 8})
	code, body = post("/query", `{"model_name":"m","routing_group":"a","token_ids":`+prompt+`,"lora_name":null,"cache_salt":null}`)
	want("query group a", code, body, 200, `"instances":{"1":{"longest_matched":8,"gpu":8,"dp":{"0":8},"cpu":8,"disk":8}},"scores":{"1":{"0":8}}`)
	code, body = post("/query", `{"model_name":"m","routing_group":"b","token_ids":`+prompt+`,"cache_salt":""}`)
	want("query group b, an empty salt", code, body, 200, `"scores":{"2":{"0":8}}`)
	code, body = post("/query", `{"model_name":"m","tenant_id":"a","token_ids":`+prompt+`}`)
	want("the legacy tenant_id names no group", code, body, 404, `no indexer for model=m routing_group=default`)
	code, body = post("/query", `{"model_name":"m","routing_group":"a","token_ids":`+prompt+`,"cache_salt":"tenant-a"}`)
	want("a salted query of unsalted blocks", code, body, 200, `"scores":{}`)

	// /query_by_hash: Dynamo's local block hashes (signed 64-bit); no cache_salt.
	code, body = post("/query_by_hash", `{"model_name":"m","routing_group":"a","block_hashes":[-3803038269031200164,-1669731304162740404],"cache_salt":null}`)
	want("query_by_hash", code, body, 200, `"scores":{"1":{"0":8}}`)
	code, body = post("/query_by_hash", `{"model_name":"m","routing_group":"a","block_hashes":[1],"cache_salt":""}`)
	want("query_by_hash with a salt", code, body, 400, "cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt")

	// /workers: routing_group in each entry, and the filters.
	workers := func(query string) []map[string]any {
		t.Helper()
		code, body := h.get("/workers" + query)
		if code != 200 {
			t.Fatalf("/workers%s: %d %s", query, code, body)
		}
		var out []map[string]any
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if ws := workers("?routing_group=b"); len(ws) != 1 || ws[0]["instance_id"] != 2.0 || ws[0]["routing_group"] != "b" || ws[0]["model_name"] != "m" {
		t.Fatalf("/workers?routing_group=b: %v", ws)
	}
	if ws := workers("?model_name=m&tenant_id=zzz"); len(ws) != 2 {
		t.Fatalf("/workers?model_name=m&tenant_id=zzz: %v, want both", ws)
	}
	if ws := workers("?model_name=other"); len(ws) != 0 {
		t.Fatalf("/workers?model_name=other: %v, want []", ws)
	}

	// /unregister: Dynamo's 404s; a routing_group removes from that group only.
	for _, c := range []struct{ body, msg string }{
		{`{"instance_id":9,"model_name":"m"}`, "instance 9 not found"},
		{`{"instance_id":1,"model_name":"other"}`, "instance 1 is registered for model=m routing_group=a"},
		{`{"instance_id":1,"model_name":"m","routing_group":"b"}`, "instance 1 is registered for model=m routing_group=a"},
		{`{"instance_id":1,"model_name":"m","routing_group":"a","dp_rank":5}`, "instance 1 dp_rank 5 not found"},
	} {
		code, body := post("/unregister", c.body)
		want("/unregister "+c.body, code, body, 404, c.msg)
	}
	// A rank of a group: that rank alone.
	code, body = post("/unregister", `{"instance_id":1,"model_name":"m","routing_group":"a","dp_rank":0}`)
	want("/unregister of rank 0", code, body, 200, `{"status":"ok"}`)
	if ws := workers("?routing_group=a"); len(ws) != 1 || len(ws[0]["endpoints"].(map[string]any)) != 1 || ws[0]["endpoints"].(map[string]any)["1"] != "tcp://w1:5558" {
		t.Fatalf("/workers after unregistering rank 0 of instance 1: %v", ws)
	}
	// No group: the instance, whatever rank is named.
	code, body = post("/unregister", `{"instance_id":1,"model_name":"m","tenant_id":"x","dp_rank":0}`)
	want("/unregister", code, body, 200, `{"status":"ok"}`)
	if ws := workers(""); len(ws) != 1 || ws[0]["instance_id"] != 2.0 {
		t.Fatalf("/workers after unregistering 1: %v", ws)
	}
}

// TestDynamoMetrics: what Dynamo's dashboards read is exported under Dynamo's names, worked by
// hand for one routed request: 12 tokens in 3 blocks of 4, 2 of them cached on worker 1, which
// is chosen (cost 4/4 + 3 against worker 2's 12/4 + 3).
func TestDynamoMetrics(t *testing.T) {
	h := newHarness(t)
	for _, id := range []uint64{1, 2} {
		if code, body := h.post("/v1/workers", "application/json", []byte(`{"worker_id":`+strconv.FormatUint(id, 10)+`,"model":"m"}`)); code != 201 {
			t.Fatalf("register %d: %d %s", id, code, body)
		}
	}
	h.store(1, 1, 10, 0, tokens(0, 8))
	if resp := h.route("a", tokens(0, 12), 0); resp.Worker != 1 {
		t.Fatalf("routed to %d, want 1", resp.Worker)
	}
	h.route("b", tokens(500, 3), 0) // shorter than a block: no hit rate, its tokens counted
	// A store chained onto a block the worker does not hold, a removal of one it does not
	// hold: Dynamo's statuses for them.
	if _, err := h.c.Events(&wire.EventBatch{Worker: 2, Model: "m", Events: []kvevent.Event{
		{Kind: kvevent.Stored, ID: 1, Hashes: []uint64{50}, Parent: 49, HasParent: true, Tokens: tokens(0, 4)},
		{Kind: kvevent.Removed, ID: 2, Hashes: []uint64{51}},
	}}); err != nil {
		t.Fatal(err)
	}
	_, page := h.get("/metrics")
	for _, want := range []string{
		"dynamo_component_router_requests_total 2",
		"dynamo_component_router_kv_hit_rate_count 1",
		"dynamo_component_router_kv_hit_rate_sum 0.6666666666666666",
		`dynamo_component_router_kv_hit_rate_bucket{le="0.65"} 0`,
		`dynamo_component_router_kv_hit_rate_bucket{le="0.7000000000000001"} 1`,
		"dynamo_component_router_input_sequence_tokens_count 2",
		"dynamo_component_router_input_sequence_tokens_sum 15",
		"dynamo_router_overhead_total_ms_count 2",
		`dynamo_frontend_worker_active_decode_blocks{dp_rank="0",worker_id="1",worker_type="decode"} 3`,
		`dynamo_frontend_worker_active_prefill_tokens{dp_rank="0",worker_id="1",worker_type="decode"} 4`,
		`dynamo_component_router_worker_registered{dp_rank="0",router_worker_id="2",worker_type="decode"} 1`,
		`dynamo_kvrouter_kv_cache_events_applied{event_type="stored",status="ok"} 1`,
		`dynamo_kvrouter_kv_cache_events_applied{event_type="stored",status="parent_block_not_found"} 1`,
		`dynamo_kvrouter_kv_cache_events_applied{event_type="removed",status="block_not_found"} 1`,
		`dynamo_component_kv_cache_events_applied{event_type="stored",status="parent_block_not_found"} 1`,
		`dynamo_component_kv_cache_events_applied{event_type="cleared",status="ok"} 0`,
		`kvrouterd_events_by_type_total{status="unknown_parent",type="stored"} 1`,
		`kvrouterd_events_by_type_total{status="unknown_blocks",type="removed"} 1`,
	} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("/metrics has no line %s", want)
		}
	}
	// One routed request in 16, drawn at random, is timed phase by phase, each of them in every
	// phase; the total counts every one. Route until one is timed.
	routes := 2
	var phases []int
	for phases = phaseCounts(t, h); phases[0] == 0; phases = phaseCounts(t, h) {
		if routes == 2+64*16 {
			t.Fatalf("no route timed in %d", routes)
		}
		h.route("c"+strconv.Itoa(routes), tokens(1000+10*routes, 8), 0)
		routes++
	}
	if slices.Min(phases) != slices.Max(phases) {
		t.Errorf("phase series counted %v after %d routes: want one count in all four", phases, routes)
	}
	_, page = h.get("/metrics")
	if want := fmt.Sprintf("dynamo_router_overhead_total_ms_count %d\n", routes); !strings.Contains(page, want) {
		t.Errorf("/metrics has no line %s", want)
	}
	if want := fmt.Sprintf("dynamo_router_overhead_block_hashing_ms_bucket{le=\"+Inf\"} %d\n", phases[0]); !strings.Contains(page, want) {
		t.Errorf("/metrics has no line %s", want)
	}
	// Bucket bounds: Dynamo's, 15 doubling from 1 µs for the hashing phases, 17 tripling from
	// 10 µs for the others and the total; kvrouterd's latency, 13 from 5 µs to 1 s.
	for prefix, want := range map[string]struct {
		first  string
		finite int
	}{
		"dynamo_router_overhead_seq_hashing_ms_bucket{le=":                       {"0.001", 15},
		"dynamo_router_overhead_block_hashing_ms_bucket{le=":                     {"0.001", 15},
		"dynamo_router_overhead_indexer_find_matches_ms_bucket{le=":              {"0.01", 17},
		"dynamo_router_overhead_scheduling_ms_bucket{le=":                        {"0.01", 17},
		"dynamo_router_overhead_total_ms_bucket{le=":                             {"0.01", 17},
		`kvrouterd_http_request_duration_seconds_bucket{endpoint="route",le=`:    {"5e-06", 13},
		`kvrouterd_http_request_duration_seconds_bucket{endpoint="complete",le=`: {"5e-06", 13},
		"dynamo_component_router_input_sequence_tokens_bucket{le=":               {"50", 12},
		"dynamo_component_router_kv_hit_rate_bucket{le=":                         {"0", 21},
	} {
		if !strings.Contains(page, prefix+`"`+want.first+`"}`) {
			t.Errorf("%s: no bucket %s", prefix, want.first)
		}
		if n := strings.Count(page, prefix); n != want.finite+1 {
			t.Errorf("%s: %d buckets, want %d and +Inf", prefix, n, want.finite)
		}
	}
}

// phaseCounts returns the sample counts of Dynamo's four phase series on h's /metrics page.
func phaseCounts(t *testing.T, h *harness) []int {
	t.Helper()
	_, page := h.get("/metrics")
	var n []int
	for _, name := range []string{"block_hashing", "seq_hashing", "indexer_find_matches", "scheduling"} {
		prefix := "dynamo_router_overhead_" + name + "_ms_count "
		at := strings.Index(page, prefix)
		if at < 0 {
			t.Fatalf("/metrics has no %s", prefix)
		}
		line, _, _ := strings.Cut(page[at+len(prefix):], "\n")
		v, err := strconv.Atoi(line)
		if err != nil {
			t.Fatalf("%s%s: %v", prefix, line, err)
		}
		n = append(n, v)
	}
	return n
}

// TestDynamoMetricsRouterID: with a router id, Dynamo's overhead histograms carry it as their
// router_id label, as Dynamo's carry the router instance's id; every route the router makes is
// sampled, not only the API's.
func TestDynamoMetricsRouterID(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{BlockSize: 4, Shards: 1, Logger: quiet})
	t.Cleanup(r.Close)
	reg := prometheus.NewRegistry()
	New(r, Config{Logger: quiet, Registry: reg, RouterID: "replica-a"})
	if err := r.Register(router.Registration{ID: 1, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	// One route in PhaseSample of each spare scratch is timed; which scratch a route gets is the
	// pool's choice (and -race drops spares), so route until one is.
	seen := map[string]uint64{}
	for i := 0; seen["dynamo_router_overhead_scheduling_ms"] == 0; i++ {
		if i == 64*r.PhaseSample() {
			t.Fatalf("no route timed in %d", i)
		}
		if err := r.Route(&wire.RouteRequest{RequestID: strconv.Itoa(i), Model: "m", Tokens: tokens(0, 8)}, &wire.RouteResponse{}); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "dynamo_router_overhead_") {
				continue
			}
			for _, m := range mf.GetMetric() {
				if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "router_id" || l[0].GetValue() != "replica-a" {
					t.Fatalf("%s labels %v, want router_id=replica-a", mf.GetName(), l)
				}
				seen[mf.GetName()] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	want := map[string]uint64{
		"dynamo_router_overhead_total_ms":                0, // the API's requests only
		"dynamo_router_overhead_block_hashing_ms":        1,
		"dynamo_router_overhead_seq_hashing_ms":          1,
		"dynamo_router_overhead_indexer_find_matches_ms": 1,
		"dynamo_router_overhead_scheduling_ms":           1,
	}
	if !maps.Equal(seen, want) {
		t.Fatalf("overhead series counted %v, want %v", seen, want)
	}
}

// TestDynamoUnknownFieldsBounded: a client sending a new field name on every request is
// counted for each, but what the server remembers of the names (to log each once) stays
// bounded.
func TestDynamoUnknownFieldsBounded(t *testing.T) {
	h := newHarness(t)
	for i := range 2 * maxUnknownLogged {
		name := strconv.Itoa(i) + strings.Repeat("f", 100)
		code, body := h.post("/query", "application/json", []byte(`{"model_name":"m","token_ids":[1],"`+name+`":1}`))
		if code != 404 {
			t.Fatalf("query %d: %d %s", i, code, body)
		}
	}
	kept := 0
	h.s.unknownSeen.Range(func(k, _ any) bool {
		if len(k.(string)) > len("/query ")+64 {
			t.Fatalf("a remembered name of %d bytes", len(k.(string)))
		}
		kept++
		return true
	})
	_, page := h.get("/metrics")
	if kept != maxUnknownLogged || !strings.Contains(page, `kvrouterd_dynamo_unknown_fields_total{path="/query"} 512`+"\n") {
		t.Fatalf("%d names kept, want %d; /metrics counts all 512: %v", kept, maxUnknownLogged, strings.Contains(page, "512"))
	}
}

// TestDynamoIndexerMetrics: /metrics has the standalone indexer's series under Dynamo's names,
// types and labels (kv-router standalone indexer metrics.rs), fed by the requests the
// indexer's routes answered and by the registered workers; kvrouterd's own routes are not
// counted.
func TestDynamoIndexerMetrics(t *testing.T) {
	h := newHarness(t)
	post := func(path, body string) int {
		code, _ := h.post(path, "application/json", []byte(body))
		return code
	}
	if c := post("/register", `{"instance_id":1,"endpoint":"tcp://w1:5557","model_name":"m","block_size":4,"routing_group":"a"}`); c != 201 {
		t.Fatalf("register: %d", c)
	}
	if c := post("/register", `{"instance_id":1,"endpoint":"tcp://w1:5558","model_name":"m","block_size":4,"dp_rank":1,"routing_group":"a"}`); c != 201 {
		t.Fatalf("register rank 1: %d", c)
	}
	if c := post("/register", `{"instance_id":2,"endpoint":"tcp://w2:5557","model_name":"m","block_size":4,"routing_group":"b"}`); c != 201 {
		t.Fatalf("register in group b: %d", c)
	}
	if c := post("/query", `{"model_name":"m"}`); c != 422 {
		t.Fatalf("query without token_ids: %d", c)
	}
	if c := post("/query", `{"model_name":"m","routing_group":"a","token_ids":[1,2,3,4]}`); c != 200 {
		t.Fatalf("query: %d", c)
	}
	for _, p := range []string{"/workers", "/health", "/healthz", "/v1/workers"} {
		if c, _ := h.get(p); c != 200 {
			t.Fatalf("GET %s: %d", p, c)
		}
	}
	h.get("/metrics")
	_, page := h.get("/metrics")
	_, workers := h.get("/workers")
	for _, want := range []string{
		"# TYPE dynamo_kvindexer_requests_total counter",
		`dynamo_kvindexer_requests_total{endpoint="/register",method="POST"} 3`,
		`dynamo_kvindexer_requests_total{endpoint="/query",method="POST"} 2`,
		`dynamo_kvindexer_requests_total{endpoint="/workers",method="GET"} 1`,
		`dynamo_kvindexer_requests_total{endpoint="/health",method="GET"} 1`,
		`dynamo_kvindexer_requests_total{endpoint="/metrics",method="GET"} 1`,
		"# TYPE dynamo_kvindexer_errors_total counter",
		`dynamo_kvindexer_errors_total{endpoint="/query",status_class="4xx"} 1`,
		"# TYPE dynamo_kvindexer_request_duration_seconds histogram",
		`dynamo_kvindexer_request_duration_seconds_count{endpoint="/query"} 2`,
		`dynamo_kvindexer_request_duration_seconds_bucket{endpoint="/query",le="0.0001"}`,
		`dynamo_kvindexer_request_duration_seconds_bucket{endpoint="/query",le="52.4288"}`,
		"# TYPE dynamo_kvindexer_models gauge",
		"dynamo_kvindexer_models 2\n",
		"# TYPE dynamo_kvindexer_workers gauge",
		"dynamo_kvindexer_workers 2\n",
		"# TYPE dynamo_kvindexer_listeners gauge",
		`dynamo_kvindexer_listeners{status="paused"} 0`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The listeners by status are the ranks /workers lists, with the same statuses (here failed:
	// nothing subscribes to the endpoints registered).
	listeners := 0.0
	for _, st := range []string{"pending", "active", "paused", "failed"} {
		n := metricSample(t, page, `dynamo_kvindexer_listeners{status="`+st+`"}`)
		if got := float64(strings.Count(workers, `"status":"`+st+`","state"`)); n != got {
			t.Errorf("listeners %s: %v, /workers lists %v", st, n, got)
		}
		listeners += n
	}
	if listeners != 3 {
		t.Errorf("%v listeners, want 3 (one per registered rank)\n%s", listeners, workers)
	}
	for _, own := range []string{`endpoint="/healthz"`, `endpoint="/v1/workers"`} {
		if strings.Contains(page, own) {
			t.Errorf("kvrouterd's own route counted: %s", own)
		}
	}
}

// metricSample is the value of the sample named exactly series (with its labels) in page.
func metricSample(t *testing.T, page, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", series)
	return 0
}
