package frontdoor

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestRoutingHeaders: Dynamo's routing headers pin the worker over nvext's, by their current
// and older names, through the front door; a value that does not parse is ignored.
func TestRoutingHeaders(t *testing.T) {
	e1, e2 := startEngine(t, 1), startEngine(t, 1)
	f := newFixture(t, Config{}, e1, e2)
	go func() {
		for {
			select {
			case <-e1.received:
			case <-e1.ranks:
			case <-e2.received:
			case <-e2.ranks:
			}
		}
	}()
	worker := func(body string, headers ...string) string {
		t.Helper()
		req, err := http.NewRequest("POST", f.addr+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s %v: %d", body, headers, resp.StatusCode)
		}
		return resp.Header.Get("X-Kvrouterd-Worker")
	}
	chat := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	pinned1 := `{"model":"m","messages":[{"role":"user","content":"x"}],"nvext":{"backend_instance_id":1}}`
	for _, c := range []struct {
		body    string
		headers []string
		want    string
	}{
		{chat, []string{"X-Dynamo-Worker-Instance-Id", "2"}, "2"},
		{chat, []string{"X-Worker-Instance-Id", "2"}, "2"},
		{pinned1, []string{"X-Dynamo-Worker-Instance-Id", "2"}, "2"},   // the header wins
		{pinned1, []string{"X-Dynamo-Worker-Instance-Id", "two"}, "1"}, // ignored
	} {
		if w := worker(c.body, c.headers...); w != c.want {
			t.Errorf("%s %v: routed to %s, want %s", c.body, c.headers, w, c.want)
		}
	}
	f.waitIdle(t, "after the pinned requests")
}

// TestPriorityHeaders: x-dynamo-request-priority and x-dynamo-request-strict-priority set the
// request's priority and strict priority over nvext's agent_hints; values that do not parse
// leave nvext's.
func TestPriorityHeaders(t *testing.T) {
	hints := func(set ...string) nvext {
		var h nvext
		p, s := int32(1), uint32(1)
		h.AgentHints = &agentHints{Priority: &p, StrictPriority: &s}
		var hd fasthttp.RequestHeader
		for i := 0; i+1 < len(set); i += 2 {
			hd.Set(set[i], set[i+1])
		}
		h.applyHeaders(&hd)
		return h
	}
	h := hints("X-Dynamo-Request-Priority", "7", "X-Dynamo-Request-Strict-Priority", "3", "X-Dynamo-Dp-Rank", "1")
	if *h.AgentHints.Priority != 7 || *h.AgentHints.StrictPriority != 3 || h.DPRank == nil || *h.DPRank != 1 {
		t.Errorf("headers: priority %d, strict %d, rank %v", *h.AgentHints.Priority, *h.AgentHints.StrictPriority, h.DPRank)
	}
	h = hints("X-Dynamo-Request-Priority", "high", "X-Dynamo-Request-Strict-Priority", "-1")
	if *h.AgentHints.Priority != 1 || *h.AgentHints.StrictPriority != 1 {
		t.Errorf("malformed headers changed nvext's: priority %d, strict %d", *h.AgentHints.Priority, *h.AgentHints.StrictPriority)
	}
	var none nvext
	var hd fasthttp.RequestHeader
	hd.Set("X-Dynamo-Request-Strict-Priority", "2")
	none.applyHeaders(&hd)
	if none.AgentHints == nil || none.AgentHints.StrictPriority == nil || *none.AgentHints.StrictPriority != 2 || none.AgentHints.Priority != nil {
		t.Errorf("strict priority header without nvext: %+v", none.AgentHints)
	}
}
