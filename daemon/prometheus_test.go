package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/extbin"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/internal/syncbuf"
)

// TestPrometheusScrape runs a real Prometheus (Debian's prometheus package; the test skips
// without it) scraping a whole daemon every second over loopback: after requests routed, workers
// registered and events applied, the series Prometheus stored hold the values the daemon counted —
// so the exposition parses, the names and labels are what the docs and dashboards query, and
// nothing is lost between the registry and a real scraper.
func TestPrometheusScrape(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and Prometheus")
	}
	prom := extbin.Find(t, "prometheus", "the metrics are not scraped by a real Prometheus")
	c := testConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	d, err := Start(ctx, c, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- d.Wait(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	api := "http://" + d.Addr().String()

	promAddr := freeport.TB(t)
	promURL := startPrometheus(t, prom, promAddr, d.Addr().String())

	// Prometheus scrapes the daemon before anything happened in it.
	waitQuery(t, promURL, `up{job="kvrouterd"}`, 1)
	waitQuery(t, promURL, `kvrouterd_requests_total{kind="routed"}`, 0)

	// Two workers, three ranks; 12 events storing a chain of 12 blocks on worker 1's rank 0;
	// 5 routes of a prompt holding the first 8 blocks.
	postOK(t, api+"/v1/workers", `{"worker_id":1,"model":"m","dp_ranks":[0,1]}`)
	postOK(t, api+"/v1/workers", `{"worker_id":2,"model":"m","dp_ranks":[0]}`)
	var evs []string
	for i := range 12 {
		parent := ""
		if i > 0 {
			parent = fmt.Sprintf(`"parent_hash":%d,`, 999+i)
		}
		evs = append(evs, fmt.Sprintf(`{"type":"stored","event_id":%d,"block_hashes":[%d],%s"token_ids":[%s]}`,
			i+1, 1000+i, parent, tokenList(16*i, 16)))
	}
	postOK(t, api+"/v1/events", `{"worker_id":1,"events":[`+strings.Join(evs, ",")+`]}`)
	for i := range 5 {
		postOK(t, api+"/v1/route", fmt.Sprintf(`{"request_id":"r%d","model":"m","token_ids":[%s]}`, i, tokenList(0, 128)))
	}

	// Once Prometheus holds a scrape that saw the last route, the rest happened before it.
	waitQuery(t, promURL, `kvrouterd_requests_total{kind="routed"}`, 5)
	for _, q := range []struct {
		expr string
		want float64
	}{
		{`up{job="kvrouterd"}`, 1},
		{`dynamo_component_router_requests_total`, 5},
		{`kvrouterd_http_request_duration_seconds_count{endpoint="route"}`, 5},
		{`count(kvrouterd_worker_load{kind="cached_blocks"})`, 3},
		{`kvrouterd_worker_load{worker="1",dp_rank="0",kind="cached_blocks"}`, 12},
		{`sum(kvrouterd_worker_load{kind="active_requests"})`, 5},
		{`kvrouterd_active_requests`, 5},
		{`kvrouterd_events_total{status="ok"}`, 12},
		{`kvrouterd_events_by_type_total{type="stored",status="ok"}`, 12},
		{`kvrouterd_index_blocks{model="m"}`, 12},
		{`count(dynamo_component_router_worker_registered)`, 3},
		// Every route found all 8 of its blocks cached on the worker chosen.
		{`dynamo_component_router_kv_hit_rate_sum / dynamo_component_router_kv_hit_rate_count`, 1},
		{`kvrouterd_stream_changes_total`, 3},
		{fmt.Sprintf(`go_info{version=%q}`, runtime.Version()), 1},
	} {
		if got := query(t, promURL, q.expr); len(got) != 1 || got[0] != q.want {
			t.Errorf("%s = %v, want [%v]", q.expr, got, q.want)
		}
	}
}

// startPrometheus runs prometheus scraping target every second, with its data in a new
// directory and its API on addr; it stops when the test ends. It returns the API's base URL
// once Prometheus is ready.
func startPrometheus(t *testing.T, exe, addr, target string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	yml := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: kvrouterd
    static_configs:
      - targets: [%q]
`, target)
	if err := os.WriteFile(cfg, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("prometheus did not stop within 10 s of SIGTERM; killed")
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30 s (%v):\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// query asks Prometheus for the instant vector of expr and returns its values.
func query(t *testing.T, base, expr string) []float64 {
	t.Helper()
	vals, err := tryQuery(base, expr)
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

func tryQuery(base, expr string) ([]float64, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("query %s: %v", expr, err)
	}
	if r.Status != "success" || r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: %s %s (result type %q)", expr, r.Status, r.Error, r.Data.ResultType)
	}
	var vals []float64
	for _, s := range r.Data.Result {
		text, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v", expr, s.Value)
		}
		vals = append(vals, v)
	}
	return vals, nil
}

// waitQuery polls Prometheus until expr is one series of value want, for at most 60 s.
func waitQuery(t *testing.T, base, expr string, want float64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		vals, err := tryQuery(base, expr)
		if err == nil && len(vals) == 1 && vals[0] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s, %s = %v (%v), want [%v]", expr, vals, err, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func postOK(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST %s: %s %s", url, resp.Status, b)
	}
}

// tokenList returns n token ids from first on, as a JSON array's elements.
func tokenList(first, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(first + i))
	}
	return b.String()
}
