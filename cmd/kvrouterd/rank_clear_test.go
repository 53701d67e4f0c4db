package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// The tests below run the daemon against fake engines of two data-parallel ranks
// (internal/enginetest), one per payload form and per way the daemon learns of them (--zmq
// with ranks=2, or one POST /register per rank as Dynamo's workers do), and check through
// /v1/match and /metrics that a clear of rank 0 — its AllBlocksCleared, its publisher's
// restart, a gap in its batches the replay socket cannot close — empties rank 0 alone: rank 1
// keeps its blocks and goes on chaining onto them. Each case waits until the daemon has
// applied every event it was sent (kvrouterd_events_total), then reads the index.

// The prompt the tests match: three blocks of 4 tokens. Block 9 is one outside it.
const rankBlock = 4

var rankPrompt = []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

// rankBlockTokens are the tokens of block i: the prompt's i-th, or, from 3 on, tokens no
// prompt holds.
func rankBlockTokens(i int) []uint32 {
	if i < 3 {
		return rankPrompt[i*rankBlock : (i+1)*rankBlock]
	}
	return []uint32{uint32(100 * i), uint32(100*i + 1), uint32(100*i + 2), uint32(100*i + 3)}
}

// rankBlockHash is the engine's hash of block i: at 2^63 or above, so that SGLang's form
// writes it as a negative int64 and vLLM's as a large unsigned one.
func rankBlockHash(i int) uint64 { return 1<<63 | uint64(i+1)*0x1111 }

// rankCase is one fake engine of two ranks and how the daemon subscribes to it.
type rankCase struct {
	name     string
	form     enginetest.Form
	register bool // one POST /register per rank rather than --zmq
	replay   bool
	worker   uint64
	eng      *enginetest.Engine
}

// startRankFleet starts an engine per form, per way of subscribing and per replay option
// given, and a daemon subscribed to them all.
func startRankFleet(t *testing.T, replays ...bool) (*proc, []*rankCase) {
	t.Helper()
	return startRankFleetArgs(t, nil, replays...)
}

// startRankFleetArgs is startRankFleet with extra daemon flags.
func startRankFleetArgs(t *testing.T, extra []string, replays ...bool) (*proc, []*rankCase) {
	t.Helper()
	bin := buildDaemon(t)
	args := []string{"--nats-listen", freeport.TB(t), "--data-dir", t.TempDir(), "--no-snapshots", "--block-size", strconv.Itoa(rankBlock)}
	args = append(args, extra...)
	var cases []*rankCase
	for _, replay := range replays {
		for _, f := range enginetest.Forms() {
			for _, register := range []bool{false, true} {
				rc := &rankCase{form: f, register: register, replay: replay, worker: uint64(100 + len(cases))}
				rc.eng = enginetest.Start(t, enginetest.Options{Ranks: 2, Replay: replay})
				how := "zmq-flag"
				if register {
					how = "register"
				} else {
					args = append(args, "--zmq", rc.eng.ZMQFlag(rc.worker, "m"))
				}
				rc.name = f.Name + "/" + how
				if len(replays) > 1 {
					rc.name = fmt.Sprintf("replay=%v/%s", replay, rc.name)
				}
				cases = append(cases, rc)
			}
		}
	}
	d := startDaemon(t, bin, args...)
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Kill()
			d.cmd.Wait()
		}
	})
	for _, rc := range cases {
		if !rc.register {
			continue
		}
		for r := range rc.eng.Ranks() {
			resp, err := http.Post("http://"+d.addr+"/register", "application/json", strings.NewReader(rc.eng.Rank(r).Registration(rc.worker, "m", rankBlock)))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("/register rank %d of worker %d: %s %s", r, rc.worker, resp.Status, body)
			}
		}
	}
	return d, cases
}

// stopDaemon stops d with SIGTERM and checks that it exits cleanly.
func stopDaemon(t *testing.T, d *proc) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, d.log())
	}
}

// rankRun drives one rankCase against the daemon.
type rankRun struct {
	t    *testing.T
	d    *proc
	c    *client.Client
	rc   *rankCase
	want float64 // events the daemon should have applied: every event sent, and its own clears
}

// newRankRun probes both ranks of rc until the daemon reads them.
func newRankRun(t *testing.T, d *proc, rc *rankCase) *rankRun {
	t.Helper()
	x := &rankRun{t: t, d: d, c: client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second}), rc: rc}
	x.want = x.applied()
	for r := range rc.eng.Ranks() {
		rc.eng.Rank(r).Probe(func() bool { return x.zmq("kvrouterd_zmq_messages_total", r) > 0 })
	}
	return x
}

// applied is the number of events the daemon has applied, whatever their outcome.
func (x *rankRun) applied() float64 {
	n := 0.0
	for line := range strings.SplitSeq(scrape(x.d.addr), "\n") {
		if rest, ok := strings.CutPrefix(line, "kvrouterd_events_total{"); ok {
			_, v, _ := strings.Cut(rest, "} ")
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				x.t.Fatalf("%s: %v", line, err)
			}
			n += f
		}
	}
	return n
}

// zmq is rank r's sample of the subscription metric name; kv are extra labels after model
// (outcome or reason) in the order /metrics writes them.
func (x *rankRun) zmq(name string, r int, kv ...string) float64 {
	labels := fmt.Sprintf(`dp_rank="%d",model="m",`, r)
	for i := 0; i+1 < len(kv); i += 2 {
		labels += fmt.Sprintf("%s=%q,", kv[i], kv[i+1])
	}
	labels += fmt.Sprintf(`worker="%d"`, x.rc.worker)
	return sample(x.t, scrape(x.d.addr), name+"{"+labels+"}")
}

func (x *rankRun) status(s string) float64 {
	return sample(x.t, scrape(x.d.addr), `kvrouterd_events_total{status="`+s+`"}`)
}

// stored is what the engine sends for blocks stored after parent (-1: at the root): one event,
// or for SGLang one per block (page), each chained onto the one before.
func (x *rankRun) stored(parent int, blocks ...int) []kvevent.Event {
	ev := func(parent int, blocks []int) kvevent.Event {
		e := kvevent.Event{Kind: kvevent.Stored, BlockSize: rankBlock}
		if parent >= 0 {
			e.Parent, e.HasParent = rankBlockHash(parent), true
		}
		for _, b := range blocks {
			e.Hashes = append(e.Hashes, rankBlockHash(b))
			e.Tokens = append(e.Tokens, rankBlockTokens(b)...)
		}
		return e
	}
	if x.rc.form != enginetest.SGLang {
		return []kvevent.Event{ev(parent, blocks)}
	}
	var evs []kvevent.Event
	for _, b := range blocks {
		evs = append(evs, ev(parent, []int{b}))
		parent = b
	}
	return evs
}

func cleared() []kvevent.Event { return []kvevent.Event{{Kind: kvevent.Cleared}} }

// publish publishes evs as one batch of rank r.
func (x *rankRun) publish(r int, evs []kvevent.Event) {
	x.t.Helper()
	rk := x.rc.eng.Rank(r)
	rk.Publish(rk.Batch(evs...), x.rc.form.EngineForm)
	x.want += float64(len(evs))
}

// settle waits until the daemon has applied every event sent, and checks it applied no other.
func (x *rankRun) settle() {
	x.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); x.applied() < x.want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			x.t.Fatalf("the daemon applied %v events, want %v\n%s", x.applied(), x.want, x.d.log())
		}
	}
	if n := x.applied(); n != x.want {
		x.t.Fatalf("the daemon applied %v events, want %v", n, x.want)
	}
}

// expect settles, then checks how many leading blocks of the prompt each rank caches; the
// test goes on after a mismatch, to show what the later events do.
func (x *rankRun) expect(what string, rank0, rank1 uint32) {
	x.t.Helper()
	x.settle()
	var resp wire.RouteResponse
	if err := x.c.Match(&wire.RouteRequest{Model: "m", Tokens: rankPrompt}, &resp); err != nil {
		x.t.Fatal(err)
	}
	got := [2]uint32{}
	for _, cd := range resp.Candidates {
		if cd.Worker == x.rc.worker && cd.Rank < 2 {
			got[cd.Rank] = cd.CachedBlocks
		}
	}
	if got != [2]uint32{rank0, rank1} {
		x.t.Errorf("%s: ranks 0 and 1 cache %d and %d blocks of the prompt, want %d and %d (unknown_parent events so far: %v)",
			what, got[0], got[1], rank0, rank1, x.status("unknown_parent"))
	}
}

// expectHeld checks how many blocks each rank holds in all, per kvrouterd_worker_load.
func (x *rankRun) expectHeld(what string, rank0, rank1 float64) {
	x.t.Helper()
	page := scrape(x.d.addr)
	for r, want := range []float64{rank0, rank1} {
		name := fmt.Sprintf(`kvrouterd_worker_load{dp_rank="%d",kind="cached_blocks",model="m",worker="%d"}`, r, x.rc.worker)
		if got := metricValue(x.t, page, name); got != want {
			x.t.Errorf("%s: rank %d holds %v blocks, want %v", what, r, got, want)
		}
	}
}

// expectZMQ checks rank r's sample of a subscription metric.
func (x *rankRun) expectZMQ(name string, r int, want float64, kv ...string) {
	x.t.Helper()
	if got := x.zmq(name, r, kv...); got != want {
		x.t.Errorf("%s%v of rank %d = %v, want %v", name, kv, r, got, want)
	}
}

// TestDaemonRankAllBlocksCleared: AllBlocksCleared from rank 0 alone, as SGLang sends it from
// each rank at start, on /flush_cache and on a weight update, clears rank 0 and leaves rank 1,
// whose next store chains onto its own earlier block and is applied.
func TestDaemonRankAllBlocksCleared(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d, cases := startRankFleet(t, false)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			x := newRankRun(t, d, rc)
			parents := x.status("unknown_parent")
			x.publish(0, x.stored(-1, 0, 1))
			x.publish(1, x.stored(-1, 0))
			x.expect("stored", 2, 1)
			x.publish(0, cleared())
			x.expect("rank 0 cleared", 0, 1)
			x.expectHeld("rank 0 cleared", 0, 1)
			x.publish(1, x.stored(0, 1))
			x.expect("rank 1 chained onto its block", 0, 2)
			x.publish(0, x.stored(-1, 0))
			x.expect("rank 0 stored again", 1, 2)
			x.expectHeld("rank 0 stored again", 1, 2)
			if n := x.status("unknown_parent") - parents; n != 0 {
				t.Errorf("%v stores refused for an unknown parent", n)
			}
			for r := range 2 {
				x.expectZMQ("kvrouterd_zmq_restarts_total", r, 0)
				x.expectZMQ("kvrouterd_zmq_gaps_total", r, 0, "outcome", "cleared")
			}
		})
	}
	stopDaemon(t, d)
}

// TestDaemonRankRestart: rank 0's publisher restarts (a new socket on its port, numbering
// from 0): the daemon clears rank 0 alone before the new process's first batch.
func TestDaemonRankRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d, cases := startRankFleet(t, false)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			x := newRankRun(t, d, rc)
			parents := x.status("unknown_parent")
			x.publish(0, x.stored(-1, 0, 1))
			x.publish(1, x.stored(-1, 0))
			x.expect("stored", 2, 1)

			r0 := rc.eng.Rank(0)
			r0.Restart()
			first := x.stored(-1, 0)
			// The new process's batch 0, sent until the daemon, connected again, has it.
			r0.PublishUntil(r0.Batch(first...), rc.form.EngineForm, func() bool { return x.zmq("kvrouterd_zmq_restarts_total", 0) > 0 })
			x.want += float64(len(first)) + 1 // and the daemon's clear of rank 0
			x.expect("rank 0 restarted", 1, 1)
			x.expectHeld("rank 0 restarted", 1, 1)
			x.publish(1, x.stored(0, 1))
			x.expect("rank 1 chained onto its block", 1, 2)
			if n := x.status("unknown_parent") - parents; n != 0 {
				t.Errorf("%v stores refused for an unknown parent", n)
			}
			x.expectZMQ("kvrouterd_zmq_restarts_total", 0, 1)
			x.expectZMQ("kvrouterd_zmq_restarts_total", 1, 0)
			for r := range 2 {
				x.expectZMQ("kvrouterd_zmq_gaps_total", r, 0, "outcome", "cleared")
			}
		})
	}
	stopDaemon(t, d)
}

// TestDaemonRankGap: rank 0 loses a batch, under --clear-on-gap. Without a replay socket the
// gap cannot be closed and the daemon clears rank 0 alone; with one, the batch comes back and
// nothing is cleared.
func TestDaemonRankGap(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d, cases := startRankFleetArgs(t, []string{"--clear-on-gap"}, false, true)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			x := newRankRun(t, d, rc)
			parents := x.status("unknown_parent")
			x.publish(0, x.stored(-1, 0))
			x.publish(1, x.stored(-1, 0))
			x.expect("stored", 1, 1)

			r0 := rc.eng.Rank(0)
			lost := x.stored(0, 1)
			r0.Drop(r0.Batch(lost...), rc.form.EngineForm)
			if rc.replay {
				x.want += float64(len(lost))
				x.publish(0, x.stored(1, 2)) // reveals the gap, which the replay fills
				x.expect("gap recovered", 3, 1)
				x.expectHeld("gap recovered", 3, 1)
				x.expectZMQ("kvrouterd_zmq_gaps_total", 0, 1, "outcome", "recovered")
				x.expectZMQ("kvrouterd_zmq_gaps_total", 0, 0, "outcome", "cleared")
			} else {
				x.want++                      // the daemon's clear of rank 0
				x.publish(0, x.stored(-1, 9)) // reveals the gap: a block outside the prompt
				x.expect("gap cleared", 0, 1)
				x.expectHeld("gap cleared", 1, 1) // rank 0 holds block 9 alone
				x.expectZMQ("kvrouterd_zmq_gaps_total", 0, 1, "outcome", "cleared")
				x.expectZMQ("kvrouterd_zmq_gaps_total", 0, 0, "outcome", "recovered")
			}
			x.publish(1, x.stored(0, 1))
			if rc.replay {
				x.expect("rank 1 chained onto its block", 3, 2)
			} else {
				x.expect("rank 1 chained onto its block", 0, 2)
			}
			if n := x.status("unknown_parent") - parents; n != 0 {
				t.Errorf("%v stores refused for an unknown parent", n)
			}
			for _, outcome := range []string{"recovered", "cleared"} {
				x.expectZMQ("kvrouterd_zmq_gaps_total", 1, 0, "outcome", outcome)
			}
			for r := range 2 {
				x.expectZMQ("kvrouterd_zmq_restarts_total", r, 0)
			}
		})
	}
	stopDaemon(t, d)
}

// TestDaemonRankGapKept: rank 0 loses a batch no replay socket can return, under the default
// (--clear-on-gap off): the daemon keeps rank 0's blocks, as Dynamo does, counts the gap as
// kept, and goes on; rank 0 chains onto the block it kept, and rank 1 is untouched.
func TestDaemonRankGapKept(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	d, cases := startRankFleet(t, false)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			x := newRankRun(t, d, rc)
			parents := x.status("unknown_parent")
			x.publish(0, x.stored(-1, 0))
			x.publish(1, x.stored(-1, 0))
			x.expect("stored", 1, 1)

			r0 := rc.eng.Rank(0)
			r0.Drop(r0.Batch(x.stored(0, 1)...), rc.form.EngineForm)
			x.publish(0, x.stored(-1, 9)) // reveals the gap: a block outside the prompt
			x.expect("gap kept", 1, 1)
			x.expectHeld("gap kept", 2, 1) // block 0, kept, and block 9
			x.expectZMQ("kvrouterd_zmq_gaps_total", 0, 1, "outcome", "kept")
			for _, outcome := range []string{"recovered", "cleared"} {
				x.expectZMQ("kvrouterd_zmq_gaps_total", 0, 0, "outcome", outcome)
			}
			x.expectZMQ("kvrouterd_zmq_clears_total", 0, 0)

			x.publish(0, x.stored(0, 1)) // onto the kept block: applied
			x.publish(1, x.stored(0, 1))
			x.expect("both ranks chained onto block 0", 2, 2)
			if n := x.status("unknown_parent") - parents; n != 0 {
				t.Errorf("%v stores refused for an unknown parent", n)
			}
			for _, outcome := range []string{"recovered", "cleared", "kept"} {
				x.expectZMQ("kvrouterd_zmq_gaps_total", 1, 0, "outcome", outcome)
			}
			for r := range 2 {
				x.expectZMQ("kvrouterd_zmq_restarts_total", r, 0)
			}
		})
	}
	stopDaemon(t, d)
}
