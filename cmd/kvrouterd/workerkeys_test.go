package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// TestDaemonWorkerAPIKeys: workers register their own API keys (POST /v1/workers and Dynamo's
// /register, through the event stream) and --worker-api-keys-file gives keys by worker id and by
// http_endpoint, winning over the registered ones. The listing says api_key_set and never shows
// a key, nor do /dump, /metrics or the log; a key that does not fit a header is refused without
// being quoted. The front door sends a worker its key. A restart keeps the registered keys (the
// snapshot holds them) and forwards with them, not the file's once the flag is gone.
func TestDaemonWorkerAPIKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	keys := filepath.Join(dir, "worker-keys")
	if err := os.WriteFile(keys, []byte("# the workers' own keys\n3 sk-file-three-0123\nhttp://127.0.0.1:9/ sk-file-endpoint-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An engine that records the Authorization header of what the front door forwards it.
	var mu sync.Mutex
	var auths []string
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	engine := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/v1/completions" {
			ctx.SetStatusCode(404)
			return
		}
		mu.Lock()
		auths = append(auths, string(ctx.Request.Header.Peek("Authorization")))
		mu.Unlock()
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			w.WriteString(`data: {"id":"c1","object":"text_completion","model":"e","choices":[{"index":0,"text":"x","finish_reason":"stop"}]}` + "\n\n")
			w.WriteString("data: [DONE]\n\n")
		})
	}}
	go engine.Serve(ln)
	front := freeport.TB(t)
	// complete sends a completion through the front door and returns the Authorization header
	// the engine got.
	complete := func(d *proc) string {
		t.Helper()
		resp, err := http.Post("http://"+front+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"e","prompt":[1,2,3,4,5,6,7,8],"max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("front door: %s %s\n%s", resp.Status, b, d.log())
		}
		mu.Lock()
		defer mu.Unlock()
		if len(auths) == 0 {
			t.Fatal("the engine got no request")
		}
		return auths[len(auths)-1]
	}

	bin, nats := buildDaemon(t), freeport.TB(t)
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--nats-listen", nats, "--frontend-addr", front}
	d := startDaemon(t, bin, append(args, "--worker-api-keys-file", keys)...)
	defer func() { d.cmd.Process.Kill() }()

	daemonCall(t, d.addr, "POST", "/v1/workers", `{"worker_id":1,"model":"m","block_size":4,"http_endpoint":"http://127.0.0.1:1","api_key":"sk-registered-one-0123"}`, 201)
	daemonCall(t, d.addr, "POST", "/v1/workers", `{"worker_id":2,"model":"m","http_endpoint":"http://127.0.0.1:2"}`, 201)
	daemonCall(t, d.addr, "POST", "/v1/workers", `{"worker_id":3,"model":"m","http_endpoint":"http://127.0.0.1:3","api_key":"sk-registered-three-0123"}`, 201)
	daemonCall(t, d.addr, "POST", "/register", `{"instance_id":4,"model_name":"m","block_size":4,"http_endpoint":"http://127.0.0.1:4","api_key":"sk-dynamo-four-0123"}`, 201)
	daemonCall(t, d.addr, "POST", "/v1/workers", `{"worker_id":5,"model":"m","http_endpoint":"http://127.0.0.1:9"}`, 201)
	daemonCall(t, d.addr, "POST", "/v1/workers", `{"worker_id":7,"model":"e","block_size":4,"http_endpoint":"http://`+ln.Addr().String()+`","api_key":"sk-engine-seven-0123"}`, 201)
	refusal := daemonCall(t, d.addr, "POST", "/v1/workers", `{"worker_id":6,"model":"m","http_endpoint":"http://127.0.0.1:6","api_key":"sk-bad key-0123"}`, 400)
	if !strings.Contains(refusal, "api_key") || strings.Contains(refusal, "sk-") {
		t.Fatalf("a key with a space: %s; want a refusal naming api_key, not quoting it", refusal)
	}

	keySet := func(d *proc) map[uint64]bool {
		t.Helper()
		body := daemonCall(t, d.addr, "GET", "/v1/workers", "", 200)
		if strings.Contains(body, "sk-") {
			t.Fatalf("/v1/workers shows a key: %s", body)
		}
		var ws struct {
			Workers []struct {
				ID        uint64 `json:"worker_id"`
				APIKeySet bool   `json:"api_key_set"`
			} `json:"workers"`
		}
		if err := json.Unmarshal([]byte(body), &ws); err != nil {
			t.Fatal(err)
		}
		out := map[uint64]bool{}
		for _, w := range ws.Workers {
			out[w.ID] = w.APIKeySet
		}
		return out
	}
	want := map[uint64]bool{1: true, 2: false, 3: true, 4: true, 5: true, 7: true}
	if got := keySet(d); !sameSet(got, want) {
		t.Fatalf("api_key_set %v, want %v", got, want)
	}
	if got := complete(d); got != "Bearer sk-engine-seven-0123" {
		t.Fatalf("the engine got Authorization %q, want its own key", got)
	}
	for _, path := range []string{"/dump", "/metrics", "/workers"} {
		if body := daemonCall(t, d.addr, "GET", path, "", 200); strings.Contains(body, "sk-") {
			t.Errorf("%s shows a key", path)
		}
	}

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = d.cmd.Wait()
	if logs := d.log(); strings.Contains(logs, "sk-") {
		t.Fatalf("the log shows a key:\n%s", logs)
	}
	// Without the file: the registered keys, restored from the shutdown snapshot.
	d = startDaemon(t, bin, args...)
	if !strings.Contains(d.log(), "restored snapshot") {
		t.Fatalf("the restart restored no snapshot:\n%s", d.log())
	}
	want = map[uint64]bool{1: true, 2: false, 3: true, 4: true, 5: false, 7: true}
	if got := keySet(d); !sameSet(got, want) {
		t.Fatalf("after a restart: api_key_set %v, want %v", got, want)
	}
	if got := complete(d); got != "Bearer sk-engine-seven-0123" {
		t.Fatalf("after a restart the engine got Authorization %q, want its own key", got)
	}
}

// TestWorkerAPIKeysFileEnv: --worker-api-keys-file has its environment twin, and the flag wins.
func TestWorkerAPIKeysFileEnv(t *testing.T) {
	env := func(k string) (string, bool) {
		if k == "KVR_WORKER_API_KEYS_FILE" {
			return "/etc/kvrouterd/from-env", true
		}
		return "", false
	}
	c, err := parseConfig(nil, env, io.Discard)
	if err != nil || c.Security.WorkerAPIKeysFile != "/etc/kvrouterd/from-env" {
		t.Fatalf("from the environment: %q %v", c.Security.WorkerAPIKeysFile, err)
	}
	c, err = parseConfig([]string{"--worker-api-keys-file", "/etc/kvrouterd/keys"}, env, io.Discard)
	if err != nil || c.Security.WorkerAPIKeysFile != "/etc/kvrouterd/keys" {
		t.Fatalf("the flag over the environment: %q %v", c.Security.WorkerAPIKeysFile, err)
	}
}

func sameSet(a, b map[uint64]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
