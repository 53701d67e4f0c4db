package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
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
	d := startDaemon(t, buildDaemon(t), "--nats-listen", freeport.TB(t), "--data-dir", t.TempDir(), "--block-size", "16")
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
		addr := freeport.TB(t)
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

// TestDaemonZeroHits: a vLLM worker serving a LoRA adapter publishes its blocks under the
// engine's name for it, while the gateway's requests name it otherwise; another worker's blocks
// are found by every request. With the daemon's defaults (one request in 64 sampled, 500 such
// requests finding other workers' blocks), the worker holding blocks no request finds is
// flagged in /v1/workers, /metrics and the log, and no longer once requests name the adapter
// as the engine does.
func TestDaemonZeroHits(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d := startDaemon(t, buildDaemon(t), "--nats-listen", freeport.TB(t), "--data-dir", t.TempDir(), "--block-size", "16")
	defer func() { d.cmd.Process.Kill() }()
	eng := enginetest.Start(t, enginetest.Options{Ranks: 1})
	other := enginetest.Start(t, enginetest.Options{Ranks: 1})
	shared, tuned := tokenRun(1, 16*64), tokenRun(100000, 16*64) // 64 blocks each
	for _, w := range []struct {
		id   uint64
		eng  *enginetest.Engine
		toks []uint32
		lora string
	}{{1, other, shared, ""}, {2, eng, tuned, "adapter-a"}} {
		hr, err := http.Post("http://"+d.addr+"/register", "application/json", strings.NewReader(w.eng.Rank(0).Registration(w.id, "m", 16)))
		if err != nil || hr.StatusCode != http.StatusCreated {
			t.Fatalf("/register worker %d: %v %v", w.id, hr, err)
		}
		hr.Body.Close()
		hashes := make([]uint64, 64)
		for i := range hashes {
			hashes[i] = w.id<<32 | uint64(i+1)
		}
		b := &wire.EngineBatch{Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 16, Hashes: hashes, Tokens: w.toks, LoRA: w.lora}}}
		cached := fmt.Sprintf(`kvrouterd_worker_load{dp_rank="0",kind="cached_blocks",model="m",worker="%d"}`, w.id)
		w.eng.Rank(0).PublishUntil(b, enginetest.VLLMMap.EngineForm, func() bool {
			v, _ := sampleText(scrape(d.addr), cached)
			return v == "64"
		})
	}
	c := client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second})
	// match sends n requests for toks naming lora, from 4 connections at once.
	match := func(n int, toks []uint32, lora string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				var resp wire.RouteResponse
				for range n / 4 {
					if err := c.Match(&wire.RouteRequest{Model: "m", Tokens: toks, LoRA: lora}, &resp); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	misconfigured := `kvrouterd_worker_misconfigured{model="m",reason="zero_hits",worker="2"}`
	eventually := func(what string, send func(), cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s:\n%s", what, d.log())
			}
			if send != nil {
				send()
			}
		}
	}
	// Sampling is random: 40,000 requests sample 500 with near certainty, and more are sent
	// until the flag is up.
	match(40000, shared, "")
	match(4000, tuned, "adapter_a") // the gateway's name for the adapter: nothing found
	eventually("worker 2 flagged", func() { match(4000, shared, "") }, func() bool {
		v, _ := sampleText(scrape(d.addr), misconfigured)
		return v == "1"
	})
	page := scrape(d.addr)
	if v, _ := sampleText(page, `kvrouterd_worker_misconfigured{model="m",reason="zero_hits",worker="1"}`); v != "0" {
		t.Fatalf("worker 1, whose blocks are found, is flagged: %q", v)
	}
	if v := metricValue(t, page, `kvrouterd_worker_unmatched_requests{model="m",worker="2"}`); v < 500 {
		t.Fatalf("kvrouterd_worker_unmatched_requests = %v, want at least 500", v)
	}
	if body := daemonGet(t, d.addr, "/v1/workers"); !strings.Contains(body, "zero_hits: none of") {
		t.Fatalf("/v1/workers names no zero-hit problem: %.2000s", body)
	}
	if log := d.log(); strings.Count(log, "requests find other workers' cached blocks but never its own") != 1 || !strings.Contains(log, "lora_name") {
		t.Fatalf("want one log line naming lora_name:\n%s", log)
	}
	// Requests naming the adapter as the engine does find its blocks: the flag goes down.
	eventually("worker 2's flag down", func() { match(400, tuned, "adapter-a") }, func() bool {
		v, _ := sampleText(scrape(d.addr), misconfigured)
		return v == "0"
	})
}
