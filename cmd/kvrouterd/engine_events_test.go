package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestDaemonEngineEvents drives through the daemon, over real sockets, what engines send that
// the other daemon tests do not: the history an engine published before it registered, fetched
// from its replay socket on the first connection; the pairs of token ids an SGLang worker running
// EAGLE publishes, which give it cache credit for a request of the same tokens; and a storage
// medium kvrouterd does not know, applied as the device tier and counted (history and medium in
// each engine form).
func TestDaemonEngineEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d := startDaemon(t, buildDaemon(t), "--nats-listen", freeport.TB(t), "--data-dir", t.TempDir())
	defer func() { d.cmd.Process.Kill() }()
	register := func(r *enginetest.Rank, worker uint64, model string, bs int) {
		t.Helper()
		hr, err := http.Post("http://"+d.addr+"/register", "application/json", strings.NewReader(r.Registration(worker, model, bs)))
		if err != nil || hr.StatusCode != http.StatusCreated {
			t.Fatalf("/register worker %d: %v %v", worker, hr, err)
		}
		hr.Body.Close()
	}
	// cachedIs says whether worker's rank 0 holds n blocks of model.
	cachedIs := func(model string, worker uint64, n int) func() bool {
		name := fmt.Sprintf(`kvrouterd_worker_load{dp_rank="0",kind="cached_blocks",model=%q,worker="%d"}`, model, worker)
		return func() bool {
			v, _ := sampleText(scrape(d.addr), name)
			return v == fmt.Sprint(n)
		}
	}
	// probe makes r's first batch, once the daemon's subscription to worker of model reads it.
	probe := func(r *enginetest.Rank, model string, worker uint64) {
		t.Helper()
		name := fmt.Sprintf(`kvrouterd_zmq_messages_total{dp_rank="0",model=%q,worker="%d"}`, model, worker)
		r.Probe(func() bool {
			v, _ := sampleText(scrape(d.addr), name)
			return v != "" && v != "0"
		})
	}
	// await waits until worker holds n blocks of model.
	await := func(model string, worker uint64, n int, what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cachedIs(model, worker, n)() {
			if time.Now().After(deadline) {
				t.Fatalf("%s never listed:\n%s", what, d.log())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Run("history", func(t *testing.T) {
		for i, f := range enginetest.Forms() {
			worker := uint64(10 + i)
			eng := enginetest.Start(t, enginetest.Options{Replay: true})
			r := eng.Rank(0)
			// Published before kvrouterd knows of the engine: only its replay buffer has it.
			r.Publish(r.Batch(kvevent.Event{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{1, 2}, Tokens: tokenRun(100*i, 8)}), f.EngineForm)
			register(r, worker, "h", 4)
			// The next batch, once it arrives, makes the subscription fetch what came before it.
			r.PublishUntil(r.Batch(), f.EngineForm, cachedIs("h", worker, 2))
		}
	})

	t.Run("eagle", func(t *testing.T) {
		prompt := []uint32{128000, 791, 4062, 14198, 39935, 35308, 927, 279, 16053, 5679, 13, 578, 3290}
		eng := enginetest.Start(t, enginetest.Options{})
		r := eng.Rank(0)
		register(r, 20, "e", 4)
		probe(r, "e", 20)
		payload := enginetest.SGLangEAGLE(prompt, 4, -0x3b1f0e2a47550163)
		r.Send(nil, enginetest.SeqFrame(r.Record(payload)), payload)
		await("e", 20, 3, "the EAGLE worker's 3 blocks")
		var resp wire.RouteResponse
		c := client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second})
		if err := c.Route(&wire.RouteRequest{RequestID: "eagle-1", Model: "e", Tokens: prompt}, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Worker != 20 || len(resp.Candidates) != 1 || resp.Candidates[0].CachedBlocks != 3 {
			t.Fatalf("routed to %d with candidates %+v; want worker 20 with 3 cached blocks", resp.Worker, resp.Candidates)
		}
	})

	t.Run("medium", func(t *testing.T) {
		for i, f := range enginetest.Forms() {
			worker := uint64(30 + i)
			eng := enginetest.Start(t, enginetest.Options{})
			r := eng.Rank(0)
			register(r, worker, "u", 4)
			probe(r, "u", worker)
			payload := enginetest.WithMedium(r.Batch(
				kvevent.Event{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{1, 2}, Tokens: tokenRun(500+100*i, 8)},
			), f.EngineForm, "TPU")
			r.Send([]byte(""), enginetest.SeqFrame(r.Record(payload)), payload)
			await("u", worker, 2, f.Name+": the blocks of an unknown medium, as the device's,")
			counted := fmt.Sprintf(`kvrouterd_engine_unknown_medium_total{dp_rank="0",model="u",worker="%d"}`, worker)
			if v := metricValue(t, scrape(d.addr), counted); v != 1 {
				t.Fatalf("%s: %s = %v, want 1", f.Name, counted, v)
			}
		}
		if !strings.Contains(d.log(), "TPU") {
			t.Fatalf("no log line naming the medium:\n%s", d.log())
		}
	})

	// A request's cache salt, among the first block's extra keys as Dynamo's vLLM handler
	// passes it: /query finds the blocks with the same cache_salt, and not without it.
	t.Run("salt", func(t *testing.T) {
		for i, f := range enginetest.Forms() {
			worker := uint64(40 + i)
			model := fmt.Sprintf("s%d", i)
			eng := enginetest.Start(t, enginetest.Options{})
			r := eng.Rank(0)
			register(r, worker, model, 4)
			probe(r, model, worker)
			toks := tokenRun(700+100*i, 8)
			r.Publish(r.Batch(kvevent.Event{Kind: kvevent.Stored, BlockSize: 4, Hashes: []uint64{1, 2}, Tokens: toks, Salt: "tenant-a"}), f.EngineForm)
			await(model, worker, 2, f.Name+": the salted blocks")
			query := func(salt string) string {
				body := fmt.Sprintf(`{"model_name":%q,"token_ids":%s,"cache_salt":%s}`, model, strings.Join(strings.Fields(fmt.Sprint(toks)), ","), salt)
				hr, err := http.Post("http://"+d.addr+"/query", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer hr.Body.Close()
				b, _ := io.ReadAll(hr.Body)
				return string(b)
			}
			want := fmt.Sprintf(`"scores":{"%d":{"0":8}}`, worker)
			if got := query(`"tenant-a"`); !strings.Contains(got, want) {
				t.Errorf("%s: /query with the salt: %s, want %s", f.Name, got, want)
			}
			if got := query("null"); !strings.Contains(got, `"scores":{}`) {
				t.Errorf("%s: /query without the salt: %s, want no match", f.Name, got)
			}
		}
	})
}

// tokenRun is n token ids counting up from from.
func tokenRun(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}
