package main

import (
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/internal/enginetest"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/wire"
)

// TestDaemonResumeAfterKill kills the daemon (SIGKILL) between events, while engines of every
// payload form go on publishing, and restarts it from its last snapshot. Each rank takes up its
// engine's stream after the last batch the snapshot holds: with a replay socket, what was
// published after the snapshot — applied before the kill, or published during the downtime, a
// removal among it — is replayed, so the index is exact; without one, a rank that missed
// batches keeps what the snapshot held, as Dynamo does: rank 0 still lists the block whose
// removal it missed, rank 1 lacks the block it missed.
func TestDaemonResumeAfterKill(t *testing.T) {
	resumeAfterKill(t, false, true, false)
}

// TestDaemonResumeAfterKillClearOnGap: the same without a replay socket under --clear-on-gap:
// a rank that missed batches is cleared rather than left reporting a removed block. Never an
// overcount.
func TestDaemonResumeAfterKillClearOnGap(t *testing.T) {
	resumeAfterKill(t, true, false)
}

func resumeAfterKill(t *testing.T, clearOnGap bool, replays ...bool) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin, dir := buildDaemon(t), t.TempDir()
	// Snapshots at shutdown only, so that the test knows what the snapshot holds.
	args := []string{"--nats-listen", freeport.TB(t), "--data-dir", dir, "--snapshot-interval", "0", "--block-size", strconv.Itoa(rankBlock)}
	if clearOnGap {
		args = append(args, "--clear-on-gap")
	}
	var cases []*rankCase
	for _, replay := range replays {
		for _, f := range enginetest.Forms() {
			rc := &rankCase{form: f, replay: replay, worker: uint64(200 + len(cases)), name: fmt.Sprintf("replay=%v/%s", replay, f.Name)}
			rc.eng = enginetest.Start(t, enginetest.Options{Ranks: 2, Replay: replay})
			args = append(args, "--zmq", rc.eng.ZMQFlag(rc.worker, "m"))
			cases = append(cases, rc)
		}
	}
	d := startDaemon(t, bin, args...)
	defer func() { d.cmd.Process.Kill(); d.cmd.Wait() }()
	runs := make([]*rankRun, len(cases))
	for i, rc := range cases { // one engine at a time: expect counts the daemon's events
		x := newRankRun(t, d, rc)
		x.publish(0, x.stored(-1, 0, 1, 2))
		x.publish(1, x.stored(-1, 0))
		x.expect(x.rc.name+": first run", 3, 1)
		runs[i] = x
	}
	stopDaemon(t, d) // the snapshot: rank 0 holds blocks 0 to 2, rank 1 block 0

	// A second run applies one more batch of rank 1, which no snapshot holds, and is killed.
	d = startDaemon(t, bin, args...)
	c := client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second})
	for _, x := range runs {
		rk := x.rc.eng.Rank(1)
		rk.PublishUntil(rk.Batch(x.stored(0, 1)...), x.rc.form.EngineForm, func() bool { return cachedRanks(t, c, x.rc.worker) == [2]uint32{3, 2} })
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.cmd.Wait()
	// During the downtime rank 0 drops block 2.
	for _, x := range runs {
		rk := x.rc.eng.Rank(0)
		rk.Drop(rk.Batch(kvevent.Event{Kind: kvevent.Removed, Hashes: []uint64{rankBlockHash(2)}}), x.rc.form.EngineForm)
	}

	d = startDaemon(t, bin, args...)
	c = client.New(client.Config{Addr: d.addr, Timeout: 5 * time.Second})
	for _, x := range runs {
		x.d = d
		// The first live batch of each rank (empty) shows what it missed since the snapshot.
		for r := range x.rc.eng.Ranks() {
			rk := x.rc.eng.Rank(r)
			rk.PublishUntil(rk.Batch(), x.rc.form.EngineForm, func() bool { return x.zmq("kvrouterd_zmq_messages_total", r) > 0 })
		}
		want, outcome := [2]uint32{2, 2}, "recovered" // exact: rank 1's batch and rank 0's removal replayed
		switch {
		case x.rc.replay:
		case clearOnGap:
			want, outcome = [2]uint32{0, 0}, "cleared" // each rank missed a batch it cannot get
		default:
			want, outcome = [2]uint32{3, 1}, "kept" // the snapshot's blocks, the missed batches not applied
		}
		var got [2]uint32
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if got = cachedRanks(t, c, x.rc.worker); got == want || time.Now().After(deadline) {
				break
			}
		}
		if got != want {
			t.Errorf("%s: after the kill and restart ranks 0 and 1 cache %d and %d blocks of the prompt, want %d and %d",
				x.rc.name, got[0], got[1], want[0], want[1])
		}
		for r := range 2 {
			x.expectZMQ("kvrouterd_zmq_gaps_total", r, 1, "outcome", outcome)
		}
	}
}

// cachedRanks is how many leading blocks of the test prompt ranks 0 and 1 of worker cache.
func cachedRanks(t *testing.T, c *client.Client, worker uint64) [2]uint32 {
	t.Helper()
	var resp wire.RouteResponse
	if err := c.Match(&wire.RouteRequest{Model: "m", Tokens: rankPrompt}, &resp); err != nil {
		t.Fatal(err)
	}
	var got [2]uint32
	for _, cd := range resp.Candidates {
		if cd.Worker == worker && cd.Rank < 2 {
			got[cd.Rank] = cd.CachedBlocks
		}
	}
	return got
}
