package deploy

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouterd/kvrouterd/daemon"
)

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Title      string `json:"title"`
	Type       string `json:"type"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

var (
	// What in a PromQL expression is not a metric name: strings, label matchers, ranges and
	// the label lists of aggregations and vector matching.
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promLabels   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promToken    = regexp.MustCompile(`\d[\d.]*(?:[eE][+-]?\d+)?[a-z]*|[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`) // numbers and durations first
	promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"}
)

// metricNames lists the metric names an expression reads: the identifiers that are neither
// functions, keywords, labels nor numbers.
func metricNames(expr string) []string {
	expr = promStrings.ReplaceAllString(expr, `""`)
	expr = promMatchers.ReplaceAllString(expr, " ")
	expr = promLabels.ReplaceAllString(expr, " ")
	var names []string
	for _, m := range promToken.FindAllStringSubmatch(expr, -1) {
		tok := m[0]
		if m[1] != "" || tok[0] >= '0' && tok[0] <= '9' || slices.Contains(promKeywords, strings.ToLower(tok)) {
			continue // a function call, a number or duration, a keyword
		}
		names = append(names, tok)
	}
	return names
}

// TestMetricNames: the expression parser of TestDashboard finds the metrics and only them.
func TestMetricNames(t *testing.T) {
	f := func(expr string, want ...string) {
		t.Helper()
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
	f(`sum by (kind) (rate(kvrouterd_requests_total{instance=~"$instance"}[$__rate_interval]))`, "kvrouterd_requests_total")
	f(`histogram_quantile(0.99, sum by (le, endpoint) (rate(a_bucket{endpoint="route",x=~"a|b"}[5m])))`, "a_bucket")
	f(`scalar(max(a)) - b{instance=~"$instance"}`, "a", "b")
	f(`a / 1e6 + b offset 5m`, "a", "b")
	f(`a * on (instance) group_left(model) b`, "a", "b")
	f(`sum(rate(x_sum[1m])) / sum(rate(x_count[1m]))`, "x_sum", "x_count")
	f(`label_values(kvrouterd_requests_total, instance)`, "kvrouterd_requests_total", "instance")
}

// TestDashboard reads grafana/kvrouterd.json and checks that every metric its panels and
// variables query is one a daemon exports: a daemon started in process (the router queue on,
// so that its series exist) is given a worker, an event, a route and a bad request, and every
// name in the dashboard must be on its /metrics page, with a help that does not call it
// deprecated. The topics the dashboard is for must each have a panel.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("grafana/kvrouterd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("grafana/kvrouterd.json: %v", err)
	}
	if d.UID == "" {
		t.Error("the dashboard has no uid: each import would make a new one")
	}
	hasDatasource := false
	for _, v := range d.Templating.List {
		hasDatasource = hasDatasource || v.Type == "datasource" && v.Name == "datasource"
	}
	if !hasDatasource {
		t.Error("the dashboard has no datasource variable: it would be bound to one Prometheus by name")
	}

	// Every expression, by panel.
	type query struct{ where, expr string }
	var queries []query
	ids := map[int]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && (p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0) {
				t.Errorf("panel %q: want targets on the ${datasource} variable", p.Title)
			}
			for _, tg := range p.Targets {
				queries = append(queries, query{"panel " + p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if def, ok := strings.CutPrefix(v.Definition, "label_values("); ok {
			metric, _, _ := strings.Cut(def, ",")
			queries = append(queries, query{"variable " + v.Name, strings.TrimSpace(metric)})
		}
	}
	if len(queries) < 20 {
		t.Fatalf("%d queries: the dashboard lost its panels", len(queries))
	}

	addr := startDaemon(t, func(c *daemon.Config) { c.RouterQueueThreshold = daemon.OptFloat{V: 4, On: true} })
	post(t, addr, "/v1/workers", `{"worker_id":10,"model":"m","block_size":4,"max_batched_tokens":8192}`)
	post(t, addr, "/v1/events", `{"worker_id":10,"events":[{"type":"stored","event_id":1,"block_hashes":[5],"token_ids":[1,2,3,4]}]}`)
	post(t, addr, "/v1/route", `{"request_id":"r1","model":"m","token_ids":[1,2,3,4,5,6,7,8]}`)
	if code, body := postStatus(t, addr, "/v1/route", `{"model":"m"}`); code != http.StatusBadRequest {
		t.Fatalf("a route without request_id: %d %s, want 400", code, body)
	}
	code, page := get(t, addr, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	// Each sample's name, and whether its family's help calls it deprecated (a series kept for
	// a release while dashboards move to its replacement).
	exported, deprecated := map[string]bool{}, map[string]string{}
	var help string
	for line := range strings.SplitSeq(page, "\n") {
		if h, ok := strings.CutPrefix(line, "# HELP "); ok {
			_, help, _ = strings.Cut(h, " ")
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		exported[name] = true
		if strings.HasPrefix(strings.ToLower(help), "deprecated") {
			deprecated[name] = help
		}
	}

	used := map[string]bool{}
	for _, q := range queries {
		names := metricNames(q.expr)
		if len(names) == 0 {
			t.Errorf("%s: %q reads no metric", q.where, q.expr)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] {
				t.Errorf("%s: %q reads %s, which the daemon does not export", q.where, q.expr, n)
			}
			if help, ok := deprecated[n]; ok {
				t.Errorf("%s: %q reads %s, which is deprecated: %s", q.where, q.expr, n, help)
			}
		}
	}
	for topic, metric := range map[string]string{
		"routes":                 "kvrouterd_requests_total",
		"route latency":          "kvrouterd_http_request_duration_seconds_bucket",
		"hit rate":               "dynamo_component_router_kv_hit_rate_sum",
		"events by type, status": "kvrouterd_events_by_type_total",
		"cached blocks":          "kvrouterd_worker_cached_blocks",
		"active blocks":          "kvrouterd_worker_active_blocks",
		"active prefill tokens":  "kvrouterd_worker_active_prefill_tokens",
		"active requests":        "kvrouterd_worker_active_requests",
		"router queue depth":     "kvrouterd_router_queue_pending_requests",
		"shard queue depth":      "kvrouterd_shard_queue_depth",
		"snapshot duration":      "kvrouterd_snapshot_last_seconds",
		"events since snapshot":  "kvrouterd_snapshot_last_stream_seq",
		"snapshot age":           "kvrouterd_snapshot_last_timestamp_seconds",
		"stream lag":             "kvrouterd_stream_last_sequence",
		"refusals":               "kvrouterd_http_rejected_total",
		"overload refusals":      "kvrouterd_overload_rejections_total",
	} {
		if !used[metric] {
			t.Errorf("no panel reads %s (%s)", metric, topic)
		}
	}
}
