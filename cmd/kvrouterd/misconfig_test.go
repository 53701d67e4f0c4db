package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestDaemonWrongBlockSize: a worker registered for a model of 16-token blocks whose engine
// publishes 32-token blocks (in vLLM's form, stating block_size, and in SGLang's, which states
// none: its tokens per block tell) is flagged, as soon as its first batch arrives, in
// /v1/workers, in /metrics and in the log, with the setting to change.
func TestDaemonWrongBlockSize(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d := startDaemon(t, buildDaemon(t), "--nats-listen", freeAddr(t), "--data-dir", t.TempDir(), "--block-size", "16")
	defer func() { d.cmd.Process.Kill() }()
	for _, c := range []struct {
		worker  uint64
		stated  int // the block_size the engine states, 0 for none
		form    wire.EngineForm
		tokens  int
		engine  string
		problem string
	}{
		{1, 32, wire.EngineForm{MapBatch: true, MapEvents: true}, 64, "vLLM", "the engine publishes blocks of 32 tokens, the model's are 16"},
		{2, 0, wire.EngineForm{Hashes: wire.HashInt64}, 64, "SGLang", "the engine publishes blocks of 32 tokens, the model's are 16"},
	} {
		pub := zmq4.NewPub(context.Background())
		defer pub.Close()
		addr := freeAddr(t)
		if err := pub.Listen("tcp://" + addr); err != nil {
			t.Fatal(err)
		}
		reg := fmt.Sprintf(`{"instance_id":%d,"endpoint":"tcp://%s","model_name":"m","block_size":16,"dp_rank":0}`, c.worker, addr)
		hr, err := http.Post("http://"+d.addr+"/register", "application/json", strings.NewReader(reg))
		if err != nil || hr.StatusCode/100 != 2 {
			t.Fatalf("/register: %v %v", hr, err)
		}
		hr.Body.Close()
		toks := make([]uint32, c.tokens)
		for i := range toks {
			toks[i] = uint32(i + 1)
		}
		b := wire.EngineBatch{Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: c.stated, Hashes: []uint64{1, 2}, Tokens: toks}}}
		payload := wire.AppendEngineBatch(nil, &b, c.form)
		name := fmt.Sprintf(`kvrouterd_worker_misconfigured{model="m",reason="block_size",worker="%d"}`, c.worker)
		deadline := time.Now().Add(20 * time.Second)
		for seq := uint64(0); ; seq++ {
			// A new batch each time until one lands (a new subscription misses what came before).
			if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), be8(seq), payload)); err != nil {
				t.Fatal(err)
			}
			if v, ok := sampleText(scrape(d.addr), name); ok && v == "1" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never flagged in /metrics (%s)\n%s", c.engine, name, d.log())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if v := metricValue(t, scrape(d.addr), fmt.Sprintf(`kvrouterd_worker_events_refused_total{model="m",reason="block_size",worker="%d"}`, c.worker)); v < 1 {
			t.Fatalf("%s: %v events refused", c.engine, v)
		}
		hr, err = http.Get("http://" + d.addr + "/v1/workers")
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Workers []struct {
				ID       uint64   `json:"worker_id"`
				Problems []string `json:"problems"`
			} `json:"workers"`
		}
		err = json.NewDecoder(hr.Body).Decode(&list)
		hr.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, w := range list.Workers {
			if w.ID == c.worker {
				found = len(w.Problems) == 1 && strings.Contains(w.Problems[0], c.problem)
				if !found {
					t.Fatalf("%s: /v1/workers problems %q, want one naming %q", c.engine, w.Problems, c.problem)
				}
			}
		}
		if !found {
			t.Fatalf("%s: worker %d not in /v1/workers", c.engine, c.worker)
		}
		// Dynamo's /workers lists it too, in a field Dynamo's clients ignore.
		hr, err = http.Get("http://" + d.addr + "/workers")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(hr.Body)
		hr.Body.Close()
		if !strings.Contains(string(body), fmt.Sprintf(`"instance_id":%d`, c.worker)) || !strings.Contains(string(body), c.problem) {
			t.Fatalf("%s: /workers does not name the problem: %s", c.engine, body)
		}
		if !strings.Contains(d.log(), "worker misconfigured") || !strings.Contains(d.log(), "start the engine with a block size of 16") {
			t.Fatalf("%s: no log line naming the setting:\n%s", c.engine, d.log())
		}
	}
}

// be8 is v as an engine's 8-byte big-endian batch sequence.
func be8(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
