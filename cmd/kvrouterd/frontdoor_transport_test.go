package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// TestDaemonFrontDoorTransportErrors: a request the front door's transport refuses before any
// handler sees it gets OpenAI's error shape in JSON, as the door's own refusals: a body over
// --max-body-bytes 413 with code "request_too_large" naming the limit and the flag (whether the
// client sends the body or only announces it), a malformed request 400; each counted and logged.
func TestDaemonFrontDoorTransportErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	front := freeport.TB(t)
	d := startDaemon(t, buildDaemon(t), "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0",
		"--frontend-addr", front, "--max-body-bytes", "4096")
	defer d.cmd.Process.Kill()

	type openAIError struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	check := func(resp *http.Response, status int, code string) openAIError {
		t.Helper()
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e openAIError
		if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(b, &e) != nil {
			t.Fatalf("%s %q %q; want %d with a JSON error", resp.Status, resp.Header.Get("Content-Type"), b, status)
		}
		if e.Error.Code != code || e.Error.Type != "invalid_request_error" || e.Error.Param != nil || !bytes.Contains(b, []byte(`"param":null`)) {
			t.Fatalf("error %s; want code %q, type invalid_request_error, param null", b, code)
		}
		return e
	}
	// raw sends req on a connection of its own and reads the answer.
	raw := func(req string) *http.Response {
		t.Helper()
		c, err := net.Dial("tcp", front)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		return resp
	}

	// Announced: refused from the header, before a byte of the body.
	e := check(raw("POST /v1/chat/completions HTTP/1.1\r\nHost: kvr\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"),
		http.StatusRequestEntityTooLarge, "request_too_large")
	if !strings.Contains(e.Error.Message, "4096 bytes") || !strings.Contains(e.Error.Message, "--max-body-bytes") {
		t.Fatalf("message %q: want the limit and the flag named", e.Error.Message)
	}
	// Sent whole, as a client does.
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 8000) + `"}]}`
	resp, err := http.Post("http://"+front+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	check(resp, http.StatusRequestEntityTooLarge, "request_too_large")
	check(raw("NOT HTTP AT ALL\r\n\r\n"), http.StatusBadRequest, "malformed_request")

	m := scrape(d.addr)
	if got := metricValue(t, m, `kvrouterd_frontdoor_requests_total{code="413",path="/v1/chat/completions"}`); got != 2 {
		t.Fatalf("%v 413s counted, want 2", got)
	}
	if got := metricValue(t, m, `kvrouterd_frontdoor_requests_total{code="400",path="other"}`); got != 1 {
		t.Fatalf("%v malformed requests counted, want 1", got)
	}
	// The door still serves.
	if resp, err := http.Get("http://" + front + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health after the refusals: %v %v", resp, err)
	}
	if logs := d.log(); !strings.Contains(logs, "front door: request refused") || !strings.Contains(logs, "code=request_too_large") {
		t.Fatalf("the refusals are not logged:\n%.4000s", logs)
	}
}
