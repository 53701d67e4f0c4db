package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// proc is a process of a binary built for the test, its stderr kept.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func run(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...)}
	p.cmd.Stderr = p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("%s:\n%s", filepath.Base(bin), p.log())
		}
	})
	return p
}

// build compiles the package at dir (relative to this one) into the test's directory.
func build(t *testing.T, out, dir string) string {
	t.Helper()
	bin := filepath.Join(out, filepath.Base(dir))
	if dir == "." {
		bin = filepath.Join(out, "kvr-mocker")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if b, err := exec.Command(gobin, "build", "-o", bin, dir).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, b)
	}
	return bin
}

// call sends body (none when empty) and decodes a JSON answer into v (when not nil).
func call(t *testing.T, method, url, body string, v any) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s %s: %v\n%s", method, url, err, b)
		}
	}
	return resp.StatusCode
}

// until polls cond every 20 ms, doing poke before each look when set, and fails after 30 s.
func until(t *testing.T, what string, poke func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never %s", what)
		}
		if poke != nil {
			poke()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type workerView struct {
	ID     uint64 `json:"worker_id"`
	State  string `json:"state"`
	HTTP   string `json:"http_endpoint"`
	Role   string `json:"role"`
	Health string `json:"health"`
}

// metric reads one of a mocker's /metrics values.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+"{"); ok {
			var v float64
			if _, err := fmt.Sscan(rest[strings.IndexByte(rest, '}')+1:], &v); err == nil {
				return v
			}
		}
	}
	t.Fatalf("no %s in %s's /metrics:\n%s", name, addr, b)
	return 0
}

// startKvrouterd runs the kvrouterd binary with its front door and waits until it is ready; it
// returns the process, the API's address and the front door's.
func startKvrouterd(t *testing.T, kvr, dir string, extra ...string) (d *proc, api, front string) {
	t.Helper()
	api, front = freeport.TB(t), freeport.TB(t)
	d = run(t, kvr, append([]string{"--http-addr", api, "--shards", "2", "--nats-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "data"), "--frontend-addr", front}, extra...)...)
	until(t, "kvrouterd ready", nil, func() bool {
		resp, err := http.Get("http://" + api + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return d, api, front
}

// workersOf is kvrouterd's /v1/workers, by worker id.
func workersOf(t *testing.T, api string) map[uint64]workerView {
	t.Helper()
	var v struct {
		Workers []workerView `json:"workers"`
	}
	call(t, "GET", "http://"+api+"/v1/workers", "", &v)
	out := map[uint64]workerView{}
	for _, w := range v.Workers {
		out[w.ID] = w
	}
	return out
}

// TestWithKvrouterd runs kvrouterd and two kvr-mockers as processes: the mockers register
// themselves (with their OpenAI address), kvrouterd's own ZMQ subscriber reads their KV events
// so that Dynamo's /query finds a prompt's blocks on the mocker that served it, kvrouterd's
// front door routes the same chat to that mocker, which reports the prefix as cached, and a
// SIGTERM makes a mocker leave kvrouterd and exit 0. Then a prefill mocker and a decode mocker
// of another model register their roles, and the front door serves a chat in two stages.
func TestWithKvrouterd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvrouterd and kvr-mocker")
	}
	dir := t.TempDir()
	kvr, mock := build(t, dir, "../kvrouterd"), build(t, dir, ".")
	d, kaddr, front := startKvrouterd(t, kvr, dir)

	mockers := map[uint64]*proc{}
	addrs := map[uint64]string{}
	for _, id := range []uint64{1, 2} {
		addrs[id] = freeport.TB(t)
		mockers[id] = run(t, mock, "--http-addr", addrs[id], "--worker-id", fmt.Sprint(id), "--model", "m",
			"--kv-events-addr", "tcp://127.0.0.1:0", "--replay-addr", "tcp://127.0.0.1:0",
			"--register", "http://"+kaddr, "--speedup", "100", "--blocks", "2048")
	}
	workers := func() map[uint64]workerView { return workersOf(t, kaddr) }
	until(t, "both mockers registered and connected", nil, func() bool {
		ws := workers()
		return ws[1].State == "active" && ws[2].State == "active"
	})
	if ws := workers(); ws[1].HTTP != "http://"+addrs[1] || ws[2].HTTP != "http://"+addrs[2] {
		t.Fatalf("registered http endpoints %+v", ws)
	}

	// A chat served by mocker 1: /tokenize gives the ids its cache holds.
	msgs := `[{"role":"system","content":"` + strings.Repeat("Answer in the fewest words you can. ", 12) +
		`"},{"role":"user","content":"Where is my prefix cached?"}]`
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	if code := call(t, "POST", "http://"+addrs[1]+"/tokenize", `{"model":"m","messages":`+msgs+`}`, &tok); code != 200 || len(tok.Tokens) < 64 {
		t.Fatalf("/tokenize: %d %v", code, tok.Tokens)
	}
	if code := call(t, "POST", "http://"+addrs[1]+"/v1/chat/completions", `{"model":"m","messages":`+msgs+`,"max_tokens":3}`, nil); code != 200 {
		t.Fatalf("chat: %d", code)
	}
	ids, _ := json.Marshal(tok.Tokens)
	full := len(tok.Tokens) / 16 * 16
	want := fmt.Sprintf(`{"1":{"0":%d}}`, full)
	var scores json.RawMessage
	poke := 0
	until(t, "kvrouterd's /query finding the prompt's blocks on worker 1",
		func() {
			// A batch the PUB socket sent before kvrouterd's subscription arrived is lost; the
			// next one makes kvrouterd fetch it from the replay socket.
			poke++
			call(t, "POST", "http://"+addrs[1]+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":[%d,%d],"max_tokens":1}`, 900000+poke, poke), nil)
		},
		func() bool {
			var q struct {
				Scores json.RawMessage `json:"scores"`
			}
			call(t, "POST", "http://"+kaddr+"/query", `{"model_name":"m","token_ids":`+string(ids)+`}`, &q)
			scores = q.Scores
			return string(q.Scores) == want
		})
	t.Logf("found after %d pokes", poke)
	if string(scores) != want {
		t.Fatalf("/query scores %s, want %s", scores, want)
	}

	// kvrouterd's front door sends the same chat where it is cached: mocker 1 answers, with
	// the prompt's full blocks (but the last token's) as cached tokens.
	var ans struct {
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if code := call(t, "POST", "http://"+front+"/v1/chat/completions", `{"model":"m","messages":`+msgs+`,"max_tokens":2}`, &ans); code != 200 {
		t.Fatalf("front door: %d\n%s", code, d.log())
	}
	if cached := min(full, (len(tok.Tokens)-1)/16*16); ans.Usage.Prompt != len(tok.Tokens) || ans.Usage.Details.Cached != cached {
		t.Fatalf("front door answer %+v, want %d prompt tokens, %d cached", ans.Usage, len(tok.Tokens), cached)
	}

	// SIGTERM: mocker 2 leaves kvrouterd and exits 0.
	m2 := mockers[2]
	m2.cmd.Process.Signal(syscall.SIGTERM)
	if err := m2.cmd.Wait(); err != nil {
		t.Fatalf("mocker 2 after SIGTERM: %v\n%s", err, m2.log())
	}
	if ws := workers(); len(ws) != 1 || ws[1].ID != 1 {
		t.Fatalf("workers after mocker 2 left: %+v", ws)
	}
	if !strings.Contains(m2.log(), "left kvrouterd") {
		t.Errorf("mocker 2's log:\n%s", m2.log())
	}

	// Disaggregated: mocker 3 prefills, mocker 4 decodes, model pd.
	for id, role := range map[uint64]string{3: "prefill", 4: "decode"} {
		addrs[id] = freeport.TB(t)
		mockers[id] = run(t, mock, "--http-addr", addrs[id], "--worker-id", fmt.Sprint(id), "--model", "pd",
			"--kv-events-addr", "tcp://127.0.0.1:0", "--register", "http://"+kaddr, "--speedup", "100", "--role", role)
	}
	until(t, "the prefill and decode mockers registered and connected", nil, func() bool {
		ws := workers()
		return ws[3].State == "active" && ws[4].State == "active"
	})
	if ws := workers(); ws[3].Role != "prefill" || ws[4].Role != "decode" {
		t.Fatalf("registered roles %q and %q", ws[3].Role, ws[4].Role)
	}
	if code := call(t, "POST", "http://"+front+"/v1/chat/completions", `{"model":"pd","messages":`+msgs+`,"max_tokens":2}`, &ans); code != 200 {
		t.Fatalf("front door, disaggregated: %d\n%s", code, d.log())
	}
	// The decode mocker read the prompt's KV from the prefill mocker: every prompt token but
	// the last counts as cached, none was computed there but the last.
	if ans.Usage.Prompt != len(tok.Tokens) || ans.Usage.Details.Cached != len(tok.Tokens)-1 {
		t.Fatalf("front door answer %+v, want %d prompt tokens, %d cached", ans.Usage, len(tok.Tokens), len(tok.Tokens)-1)
	}
	if got := metric(t, addrs[4], "kvr_mocker_kv_transfers_received_total"); got != 1 {
		t.Errorf("the decode mocker received %v transfers, want 1", got)
	}
	if got := metric(t, addrs[4], "kvr_mocker_computed_prompt_tokens_total"); got != 1 {
		t.Errorf("the decode mocker computed %v prompt tokens, want 1", got)
	}
	until(t, "the prefill mocker's blocks read and released", nil, func() bool {
		return metric(t, addrs[3], "kvr_mocker_kv_transfers_sent_total") == 1
	})
}

// TestDieAfterExits: kvr-mocker --die-after 1 serves one completion, then dies on the next one
// (its connection reset) and exits with status 3; nothing listens on its port any more.
func TestDieAfterExits(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvr-mocker")
	}
	mock := build(t, t.TempDir(), ".")
	addr := freeport.TB(t)
	p := run(t, mock, "--http-addr", addr, "--kv-events-addr", "", "--speedup", "100", "--die-after", "1")
	until(t, "the mocker serving", nil, func() bool {
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if code := call(t, "POST", "http://"+addr+"/v1/completions", `{"prompt":"x","max_tokens":2}`, nil); code != 200 {
		t.Fatalf("first completion: %d", code)
	}
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":2}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("second completion answered %d", resp.StatusCode)
	}
	err = p.cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(p.log(), "died as --die-after asked") {
		t.Fatalf("exit: %v\n%s", err, p.log())
	}
	if _, err := http.Get("http://" + addr + "/health"); err == nil {
		t.Error("the port still answers")
	}
}

// TestFailingMockersThroughFrontDoor: kvrouterd's front door over three mockers, one failing
// every request (--fail-rate 1) and one dying after its first (--die-after 1): every client
// request is answered, by the one that works, and the other two leave routing.
func TestFailingMockersThroughFrontDoor(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvrouterd and kvr-mocker")
	}
	dir := t.TempDir()
	kvr, mock := build(t, dir, "../kvrouterd"), build(t, dir, ".")
	_, kaddr, front := startKvrouterd(t, kvr, dir, "--frontend-retries", "2")
	for id, extra := range map[uint64][]string{1: nil, 2: {"--fail-rate", "1"}, 3: {"--die-after", "1"}} {
		args := append([]string{"--http-addr", freeport.TB(t), "--worker-id", fmt.Sprint(id), "--model", "m",
			"--kv-events-addr", "tcp://127.0.0.1:0", "--register", "http://" + kaddr, "--speedup", "100"}, extra...)
		run(t, mock, args...)
	}
	workers := func() map[uint64]workerView { return workersOf(t, kaddr) }
	until(t, "three mockers registered", nil, func() bool { return len(workers()) == 3 })
	for i := range 12 {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}],"max_tokens":3}`, i)
		if code := call(t, "POST", "http://"+front+"/v1/chat/completions", body, nil); code != 200 {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	// The dying one dies at its second request: the ties may have sent it fewer. Requests
	// pinned to it make sure (they may fail; the client's answers above were all served).
	for range 2 {
		call(t, "POST", "http://"+front+"/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":"pinned"}],"max_tokens":3,"nvext":{"backend_instance_id":3}}`, nil)
	}
	ws := workers()
	if ws[1].Health != "ok" || ws[2].Health == "ok" || ws[3].Health == "ok" {
		t.Errorf("health: working %q, failing %q, dead %q", ws[1].Health, ws[2].Health, ws[3].Health)
	}
}
