package server

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
)

// TestPolicyClasses: through the HTTP API on a real socket, the x-dynamo-meta-policy-class
// header picks a request's class; queued classes are served by deficit round robin (premium's
// quantum twice regular's: two premium requests per regular one), within a class in arrival
// order; a class over its request limit and a request past its class's slo_ms are refused with
// Dynamo's structured 529 body; an unknown class is refused with 400; the per-class gauges say so.
func TestPolicyClasses(t *testing.T) {
	classes, err := router.ParsePolicyConfig([]byte(`
default_policy_class: regular
policy_classes:
  - {name: premium, slo_ms: 600000, quantum: 8, prefill_busy_threshold: 8, request_queue_limit_per_worker: 3}
  - {name: regular, slo_ms: 600000, quantum: 4, prefill_busy_threshold: 8}
  - {name: batch, slo_ms: 30, quantum: 4, prefill_busy_threshold: 8}
`))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, func(c *router.Config) {
		c.Queue = &router.QueueConfig{Threshold: math.Inf(1), Classes: classes}
	})
	if err := h.r.Register(router.Registration{ID: 1, Model: "m", BlockSize: 4, MaxTokens: 16}); err != nil {
		t.Fatal(err)
	}
	post := func(id, class string, tok int) (int, string) {
		toks := fmt.Sprintf("%d,%d,%d,%d", tok, tok+1, tok+2, tok+3)
		if id == "a" {
			toks += fmt.Sprintf(",%d,%d,%d,%d,%d,%d,%d,%d", tok+4, tok+5, tok+6, tok+7, tok+8, tok+9, tok+10, tok+11)
		}
		body := fmt.Sprintf(`{"request_id":%q,"model":"m","token_ids":[%s]}`, id, toks)
		req, _ := http.NewRequest("POST", "http://"+h.tcp+"/v1/route", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if class != "" {
			req.Header.Set(router.PolicyClassHeader, class)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	pending := func(class string) int64 {
		for _, q := range h.r.QueueStats(nil) {
			for _, c := range q.Classes {
				if c.Name == class {
					return c.Pending
				}
			}
		}
		return -1
	}
	waitPending := func(class string, n int64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); pending(class) != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("class %s: %d pending, want %d", class, pending(class), n)
			}
		}
	}

	// Nothing prefills: "a" (no header: regular) routes at once, and its 12 tokens make the
	// worker busy for every class (past 8 prefill tokens); each request after it has 4.
	if code, body := post("a", "", 100); code != 200 {
		t.Fatalf("a: %d %s", code, body)
	}
	if code, body := post("x", "gold", 200); code != 400 || !strings.Contains(body, "unknown router policy class") {
		t.Fatalf("unknown class: %d %s", code, body)
	}

	// A batch request waits past its 30 ms objective: 529, Dynamo's body.
	code, body := post("late", "batch", 300)
	var late struct {
		Type    string
		Code    int
		Message string
		Details struct {
			PolicyClass string `json:"policy_class"`
			Stage       string
			SLOMs       int64 `json:"slo_ms"`
			OverdueMs   int64 `json:"overdue_ms"`
		}
	}
	if err := json.Unmarshal([]byte(body), &late); code != 529 || err != nil || late.Type != "Overloaded" || late.Code != 529 ||
		late.Details.PolicyClass != "batch" || late.Details.Stage != "dispatch" || late.Details.SLOMs != 30 || late.Details.OverdueMs <= 0 {
		t.Fatalf("past the deadline: %d %s (%v)", code, body, err)
	}

	// Queue three premium and three regular requests, in this order of arrival.
	type answer struct {
		id   string
		code int
		body string
	}
	answers := make(chan answer, 8)
	send := func(id, class string, tok int) {
		go func() {
			code, body := post(id, class, tok)
			answers <- answer{id, code, body}
		}()
	}
	n := map[string]int64{}
	for i, r := range []struct{ id, class string }{{"r1", "regular"}, {"p1", "premium"}, {"r2", ""}, {"p2", "premium"}, {"r3", "regular"}, {"p3", "premium"}} {
		send(r.id, r.class, 1000+10*i)
		c := r.class
		if c == "" {
			c = "regular"
		}
		n[c]++
		waitPending(c, n[c])
	}
	// premium holds 3 requests, 3 × 1 worker: the next is refused, Dynamo's body.
	code, body = post("p4", "premium", 2000)
	var full struct {
		Type    string
		Code    int
		Details struct {
			PolicyClass    string `json:"policy_class"`
			LimitKind      string `json:"limit_kind"`
			Current, Limit int
		}
	}
	if err := json.Unmarshal([]byte(body), &full); code != 529 || err != nil || full.Type != "Overloaded" ||
		full.Details.PolicyClass != "premium" || full.Details.LimitKind != "requests" || full.Details.Current != 3 || full.Details.Limit != 3 {
		t.Fatalf("over the limit: %d %s (%v)", code, body, err)
	}
	_, metrics := h.get("/metrics")
	for _, want := range []string{
		`dynamo_frontend_router_queue_pending_requests{model="m",policy_class="premium",worker_type="decode"} 3`,
		`dynamo_frontend_router_queue_pending_requests{model="m",policy_class="regular",worker_type="decode"} 3`,
		`dynamo_frontend_router_queue_deadline_expired_total{policy_class="batch",stage="dispatch"} 1`,
		`kvrouterd_router_queue_policy_class_requests_total{model="m",outcome="limited",policy_class="premium"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// a's prefill done frees room for three requests (4, 8, then 12 tokens: busy): DRR sends
	// two premium for one regular. Each later prefill done frees room for one more.
	admitted := func(k int) string {
		t.Helper()
		ids := make([]string, 0, k)
		for range k {
			a := <-answers
			if a.code != 200 {
				t.Fatalf("%s: %d %s", a.id, a.code, a.body)
			}
			ids = append(ids, a.id)
		}
		sort.Strings(ids)
		return strings.Join(ids, " ")
	}
	done := func(id string) {
		t.Helper()
		if code, body := h.post("/v1/requests/"+id+"/prefill_done", "", nil); code != 204 {
			t.Fatalf("prefill done %s: %d %s", id, code, body)
		}
	}
	done("a")
	if got := admitted(3); got != "p1 p2 r1" {
		t.Fatalf("first admitted %s, want p1 p2 r1 (premium's quantum 8 and regular's 4, 4 tokens a request)", got)
	}
	for _, s := range []struct{ done, want string }{{"p1", "p3"}, {"p2", "r2"}, {"r1", "r3"}} {
		done(s.done)
		if got := admitted(1); got != s.want {
			t.Fatalf("after %s's prefill: %s admitted, want %s", s.done, got, s.want)
		}
	}
}
