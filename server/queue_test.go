package server

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestRouteQueue: through the HTTP API, a route waits while the worker is busy and is answered
// when it frees; a full queue answers 429 and a wait past max_wait_ms 503, naming the reason;
// neither leaves a booking; the queue's metrics count them.
func TestRouteQueue(t *testing.T) {
	h := newHarnessWith(t, func(c *router.Config) {
		c.Queue = &router.QueueConfig{Threshold: 0.5, MaxRequests: 1}
	})
	if err := h.r.Register(router.Registration{ID: 1, Model: "m", BlockSize: 4, MaxTokens: 16}); err != nil {
		t.Fatal(err)
	}
	// 12 uncached tokens booked: busy (12 > 0.5 × 16).
	if code, body := h.post("/v1/route", "application/json", []byte(`{"request_id":"a","model":"m","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12]}`)); code != 200 {
		t.Fatalf("a: %d %s", code, body)
	}
	type answer struct {
		code int
		body string
	}
	waited := make(chan answer, 1)
	go func() {
		code, body := h.post("/v1/route", "application/json", []byte(`{"request_id":"b","model":"m","token_ids":[21,22,23,24,25,26,27,28,29,30],"priority_jump":2,"max_wait_ms":4000}`))
		waited <- answer{code, body}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for st := h.r.QueueStats(nil); len(st) == 0 || st[0].Pending[1] != 1; st = h.r.QueueStats(nil) {
		if time.Now().After(deadline) {
			t.Fatal("b never queued")
		}
		time.Sleep(time.Millisecond)
	}
	code, body := h.post("/v1/route", "application/json", []byte(`{"request_id":"c","model":"m","token_ids":[1,2,3,4]}`))
	if code != 429 || !strings.Contains(body, `"field":"model"`) || !strings.Contains(body, "router queue") {
		t.Fatalf("full queue: %d %s", code, body)
	}
	if code, body := h.post("/v1/requests/a/prefill_done", "", nil); code != 204 {
		t.Fatalf("prefill done: %d %s", code, body)
	}
	if a := <-waited; a.code != 200 || !strings.Contains(a.body, `"worker_id":1`) {
		t.Fatalf("b after the wait: %d %s", a.code, a.body)
	}
	// b's 10 tokens make the worker busy again: d, binary, waits its 30 ms and is refused.
	req := wire.AppendRouteRequest(nil, &wire.RouteRequest{RequestID: "d", Model: "m", Tokens: tokens(40, 8), MaxWaitMs: 30})
	code, body = h.post("/v1/route", wire.ContentType, req)
	if code != 503 || !strings.Contains(body, "max_wait_ms") {
		t.Fatalf("deadline: %d %s", code, body)
	}
	if n := h.r.Stats().ActiveRequests; n != 2 {
		t.Fatalf("%d bookings, want a's and b's", n)
	}
	_, metrics := h.get("/metrics")
	for _, want := range []string{
		`kvrouterd_router_queue_requests_total{model="m",outcome="full"} 1`,
		`kvrouterd_router_queue_requests_total{model="m",outcome="timed_out"} 1`,
		`kvrouterd_router_queue_requests_total{model="m",outcome="admitted"} 1`,
		`kvrouterd_router_queue_wait_seconds_count{model="m",priority="high"} 1`,
		`dynamo_frontend_router_queue_pending_requests{model="m",policy_class="default",worker_type="decode"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestRouteQueueClientGone: a client that disconnects while its route waits in the queue leaves
// it (the server looks at the socket), and nothing is booked for it.
func TestRouteQueueClientGone(t *testing.T) {
	h := newHarnessWith(t, func(c *router.Config) {
		c.Queue = &router.QueueConfig{Threshold: 0.5}
	})
	if err := h.r.Register(router.Registration{ID: 1, Model: "m", BlockSize: 4, MaxTokens: 16}); err != nil {
		t.Fatal(err)
	}
	if code, body := h.post("/v1/route", "application/json", []byte(`{"request_id":"a","model":"m","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12]}`)); code != 200 {
		t.Fatalf("a: %d %s", code, body)
	}
	c, err := net.Dial("tcp", h.tcp)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"request_id":"b","model":"m","token_ids":[21,22,23,24]}`
	fmt.Fprintf(c, "POST /v1/route HTTP/1.1\r\nHost: kvrouterd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	stats := func() router.QueueStats {
		if st := h.r.QueueStats(nil); len(st) > 0 {
			return st[0]
		}
		return router.QueueStats{}
	}
	deadline := time.Now().Add(5 * time.Second)
	for stats().Pending[0] != 1 {
		if time.Now().After(deadline) {
			t.Fatal("b never queued")
		}
		time.Sleep(time.Millisecond)
	}
	c.Close()
	for stats().Gone != 1 || stats().Pending[0] != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the queue kept a request whose client left: %+v", stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := h.r.Stats().ActiveRequests; n != 1 {
		t.Fatalf("%d bookings, want a's alone", n)
	}
}
