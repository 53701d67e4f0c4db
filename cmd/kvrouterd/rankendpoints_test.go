package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestDaemonRankEndpoints registers the two data-parallel ranks of one engine through Dynamo's
// /register one at a time, each with its own PUB socket (on ports that are not consecutive), and
// checks that each rank is read from its own socket: while running, after a restart from the
// snapshot, and on a replica bootstrapped from it. /workers lists each rank's own endpoint.
func TestDaemonRankEndpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin, dir := buildDaemon(t), t.TempDir()
	args := []string{"--nats-listen", freeport.TB(t), "--data-dir", dir}
	d := startDaemon(t, bin, args...)
	defer func() { d.cmd.Process.Kill() }()

	// The engine's two ranks: each its own PUB socket, numbering its batches from 0.
	type rank struct {
		pub  zmq4.Socket
		addr string
		seq  uint64
	}
	var ranks [2]*rank
	for i := range ranks {
		pub := zmq4.NewPub(context.Background())
		t.Cleanup(func() { pub.Close() })
		addr := freeport.TB(t)
		if err := pub.Listen("tcp://" + addr); err != nil {
			t.Fatal(err)
		}
		ranks[i] = &rank{pub: pub, addr: addr}
	}
	for i, rk := range ranks {
		reg := fmt.Sprintf(`{"instance_id":7,"endpoint":"tcp://%s","model_name":"m","block_size":4,"dp_rank":%d}`, rk.addr, i)
		hr, err := http.Post("http://"+d.addr+"/register", "application/json", strings.NewReader(reg))
		if err != nil || hr.StatusCode/100 != 2 {
			t.Fatalf("/register rank %d: %v %v", i, hr, err)
		}
		hr.Body.Close()
	}
	checkWorkers := func(addr string) {
		t.Helper()
		hr, err := http.Get("http://" + addr + "/workers")
		if err != nil {
			t.Fatal(err)
		}
		defer hr.Body.Close()
		var ws []struct {
			ID        uint64            `json:"instance_id"`
			Endpoints map[string]string `json:"endpoints"`
		}
		if err := json.NewDecoder(hr.Body).Decode(&ws); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"0": "tcp://" + ranks[0].addr, "1": "tcp://" + ranks[1].addr}
		for _, w := range ws {
			if w.ID == 7 {
				if !maps.Equal(w.Endpoints, want) {
					t.Fatalf("/workers: worker 7's endpoints %v, want %v", w.Endpoints, want)
				}
				return
			}
		}
		t.Fatalf("/workers does not list worker 7: %+v", ws)
	}
	checkWorkers(d.addr)

	// publish stores, on each rank, a prefix of its own (tokens base.. for rank 0, base+100.. for
	// rank 1), and waits until the daemon at addr holds each on the rank that sent it, and on
	// no other rank.
	publish := func(addr string, base uint32) {
		t.Helper()
		c := client.New(client.Config{Addr: addr, Timeout: 5 * time.Second})
		deadline := time.Now().Add(20 * time.Second)
		for i, rk := range ranks {
			toks := make([]uint32, 8)
			for j := range toks {
				toks[j] = base + uint32(100*i+j)
			}
			b := wire.EngineBatch{Events: []kvevent.Event{{Kind: kvevent.Stored, BlockSize: 4,
				Hashes: []uint64{uint64(base) + uint64(10*i), uint64(base) + uint64(10*i+1)}, Tokens: toks}}}
			payload := wire.AppendEngineBatch(nil, &b, wire.EngineForm{MapBatch: true, MapEvents: true})
			seq := make([]byte, 8)
			seq[7] = byte(rk.seq)
			rk.seq++
			for {
				// Resent until it lands (a new subscription misses what came before it joined);
				// repeats are duplicates the subscriber drops.
				if err := rk.pub.Send(zmq4.NewMsgFrom([]byte("kv"), seq, payload)); err != nil {
					t.Fatal(err)
				}
				var resp wire.RouteResponse
				if err := c.Match(&wire.RouteRequest{Model: "m", Tokens: toks}, &resp); err != nil {
					t.Fatal(err)
				}
				got := map[uint32]uint32{}
				for _, cd := range resp.Candidates {
					if cd.Worker == 7 {
						got[cd.Rank] = cd.CachedBlocks
					}
				}
				if got[uint32(i)] == 2 {
					if other := got[uint32(1-i)]; other != 0 {
						t.Fatalf("rank %d's prefix is held by rank %d too (%d blocks)", i, 1-i, other)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("rank %d's batch never reached the daemon at %s: %v\n%s", i, addr, got, d.log())
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	publish(d.addr, 1000)

	// Restarted from its snapshot, the daemon subscribes each rank to its own socket again.
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := exited(t, d); err != nil {
		t.Fatalf("exit: %v\n%s", err, d.log())
	}
	d = startDaemon(t, bin, args...)
	checkWorkers(d.addr)
	publish(d.addr, 2000)

	// So does a replica bootstrapped from it.
	b := startDaemon(t, bin, "--nats-listen", freeport.TB(t), "--data-dir", t.TempDir(), "--bootstrap-from", "http://"+d.addr)
	defer func() { b.cmd.Process.Kill() }()
	checkWorkers(b.addr)
	publish(b.addr, 3000)
}
