package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// TestDaemonFrontDoor: with --frontend-addr the daemon serves OpenAI's API, forwarding each
// request to a registered worker's http_endpoint; a streamed answer comes back whole, and the
// booking is gone once it ends.
func TestDaemonFrontDoor(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	engine := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/tokenize":
			ctx.SetBodyString(`{"count":8,"max_model_len":4096,"tokens":[1,2,3,4,5,6,7,8]}`)
		case "/v1/chat/completions":
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for i := range 3 {
					fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
					w.Flush()
				}
				w.WriteString("data: [DONE]\n\n")
			})
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go engine.Serve(ln)

	front := freeport.TB(t)
	d := startDaemon(t, buildDaemon(t), "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--frontend-addr", front)
	defer d.cmd.Process.Kill()
	daemonCall(t, d.addr, "POST", "/v1/workers",
		fmt.Sprintf(`{"worker_id":5,"model":"m","block_size":4,"http_endpoint":"http://%s"}`, ln.Addr()), 201)

	resp, err := http.Post("http://"+front+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Count(string(b), "data: {") != 3 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	var ws struct {
		Workers []struct {
			ActiveRequests int64  `json:"active_requests"`
			HTTP           string `json:"http_endpoint"`
		} `json:"workers"`
	}
	// The booking goes as the answer ends: wait for it.
	for deadline := time.Now().Add(10 * time.Second); ; {
		_ = json.Unmarshal([]byte(daemonCall(t, d.addr, "GET", "/v1/workers", "", 200)), &ws)
		if len(ws.Workers) == 1 && ws.Workers[0].HTTP == "http://"+ln.Addr().String() && ws.Workers[0].ActiveRequests == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the answer: %+v", ws.Workers)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m := daemonCall(t, d.addr, "GET", "/metrics", "", 200); !strings.Contains(m, `kvrouterd_frontdoor_streams_total{end="done"} 1`) {
		t.Errorf("the stream's end is not counted")
	}
}
