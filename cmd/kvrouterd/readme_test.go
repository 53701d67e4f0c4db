package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDaemonReadmeQuickStart runs the README's Quick start against the daemon, request by
// request as written, and checks that the route answer is the one the README shows: a newcomer
// who pastes it sees what the README says.
func TestDaemonReadmeQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the daemon")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "## Quick start")
	if start < 0 {
		t.Fatal("no Quick start in the README")
	}
	text = text[start:]
	end := strings.Index(text, "\n## ")
	if end < 0 {
		t.Fatal("the Quick start runs to the README's end")
	}
	text = text[:end]
	cmds := regexp.MustCompile(`(?s)curl -s (-XPOST )?localhost:8090(\S+)(?: -d '([^']*)')?`).FindAllStringSubmatch(text, -1)
	answer := regexp.MustCompile("(?s)```json\n(.*?)```").FindStringSubmatch(text)
	if len(cmds) < 4 || answer == nil {
		t.Fatalf("the Quick start's commands (%d) or its answer (%v) not found", len(cmds), answer != nil)
	}
	var want bytes.Buffer
	if err := json.Compact(&want, []byte(answer[1])); err != nil {
		t.Fatalf("the README's answer is not JSON: %v", err)
	}

	d := startDaemon(t, buildDaemon(t), "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0")
	defer d.cmd.Process.Kill()
	routed := false
	for _, c := range cmds {
		method, path, body := "GET", c[2], c[3]
		if c[1] != "" || body != "" {
			method = "POST"
		}
		req, err := http.NewRequest(method, "http://"+d.addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, got)
		}
		if path == "/v1/route" {
			routed = true
			var g bytes.Buffer
			if err := json.Compact(&g, got); err != nil {
				t.Fatal(err)
			}
			if g.String() != want.String() {
				t.Errorf("the route answers\n%s\nthe README shows\n%s", g.String(), want.String())
			}
		}
	}
	if !routed {
		t.Fatal("the Quick start routes nothing")
	}
}
