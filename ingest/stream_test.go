package ingest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestStreamLost runs the daemon's event side (StartStream, embedded server with its
// credentials, over TCP) and has kvrouterd's own user do to the stream what an operator's
// mistake could: delete it, change its subjects, seal it. Each is noticed: a deleted stream is
// created again and read from its start, after OnGap (which clears the index, as the daemon's
// does); changed subjects are set back; a sealed stream, which the server will not unseal,
// makes Health and kvrouterd_stream_connected say so until it is deleted. Events published
// after each repair reach the index.
func TestStreamLost(t *testing.T) {
	r := router.New(router.Config{Shards: 1, Logger: quietLog()})
	defer r.Close()
	var (
		mu   sync.Mutex
		gaps [][2]uint64
	)
	st, err := StartStream(context.Background(), r, StreamConfig{
		Embedded: EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0"},
		Consumer: ConsumerConfig{Memory: true, CheckInterval: 5 * time.Millisecond, OnGap: func(from, to uint64) {
			mu.Lock()
			gaps = append(gaps, [2]uint64{from, to})
			mu.Unlock()
			if _, err := r.ClearAll(); err != nil {
				t.Error(err)
			}
		}},
	}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	pnc, err := nats.Connect(st.URL, append(ConnectOptions(quietLog()), st.Credentials.Publisher.Option())...)
	if err != nil {
		t.Fatal(err)
	}
	defer pnc.Close()
	pub, err := NewPublisher(pnc, "")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := nats.Connect(st.URL, st.Credentials.Router.Option())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ajs, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	id := uint64(0)
	// publish stores worker w's first block (a new event id each time) and waits until the
	// index has it, retrying while the stream is being repaired.
	publish := func(w uint64) {
		t.Helper()
		id++
		b := &wire.EventBatch{Worker: w, Model: "m", Events: []kvevent.Event{
			{Kind: kvevent.Stored, ID: id, BlockSize: 4, Hashes: []uint64{100 + id}, Tokens: toks(0, 4)},
		}}
		waitFor(t, "the batch to be stored", func() bool {
			_, err := pub.Batch(ctx, b)
			return err == nil
		})
		waitFor(t, "the batch in the index", func() bool {
			var resp wire.RouteResponse
			if r.Flush() != nil || r.Match(&wire.RouteRequest{Model: "m", Tokens: toks(0, 4)}, &resp) != nil {
				return false // no worker of the model yet
			}
			for _, c := range resp.Candidates {
				if c.Worker == w && c.CachedBlocks == 1 {
					return true
				}
			}
			return false
		})
	}
	healthy := func() {
		t.Helper()
		waitFor(t, "a healthy stream", func() bool { return st.Health() == nil && st.Consumer.Stats().Connected })
	}
	publish(1)
	publish(2)
	healthy()

	// Deleted: created again, the loss reported (every worker cleared), the new stream read
	// from sequence 1.
	last := st.Consumer.LastSeq()
	if err := ajs.DeleteStream(ctx, DefaultStream); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream created again", func() bool { return st.Consumer.Stats().Recreated == 1 })
	mu.Lock()
	if len(gaps) != 1 || gaps[0] != [2]uint64{last + 1, 0} {
		t.Fatalf("OnGap calls %v, want one (%d, 0)", gaps, last+1)
	}
	mu.Unlock()
	publish(3)
	if got := cached(t, r, "m", toks(0, 4)); got[1<<8] != 0 || got[2<<8] != 0 || got[3<<8] != 1 {
		t.Fatalf("cached %v after the stream was lost: want a block on worker 3 only", got)
	}
	if seq := st.Consumer.LastSeq(); seq != 1 {
		t.Fatalf("last sequence %d, want 1: the new stream's first", seq)
	}
	healthy()

	// Subjects changed: set back.
	s, err := ajs.Stream(ctx, DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = []string{"elsewhere.>"}
	if _, err := ajs.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subjects set back", func() bool { return st.Consumer.Stats().Restored >= 1 })
	publish(4)
	healthy()

	// Sealed: the server refuses to unseal it; Health and Connected say so.
	cfg.Subjects, cfg.Sealed = []string{DefaultPrefix + ".events.>"}, true
	if _, err := ajs.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an unhealthy stream", func() bool {
		err := st.Health()
		return err != nil && strings.Contains(err.Error(), "sealed") && !st.Consumer.Stats().Connected
	})
	// Deleting the sealed stream repairs it.
	if err := ajs.DeleteStream(ctx, DefaultStream); err != nil {
		t.Fatal(err)
	}
	publish(5)
	healthy()
	if st := st.Consumer.Stats(); st.Recreated != 2 {
		t.Fatalf("recreated %d times, want 2", st.Recreated)
	}
}

// TestStreamDial: a connection from Dial to an external server carries StreamConfig.Options
// (here the server's only user, without which it is refused), the options given, and the
// name, as the server reports it.
func TestStreamDial(t *testing.T) {
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), Username: "u", Password: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	defer s.Shutdown()
	r := router.New(router.Config{Shards: 1, Logger: quietLog()})
	defer r.Close()
	opts := []nats.Option{nats.UserInfo("u", "secret")}
	st, err := StartStream(context.Background(), r, StreamConfig{URL: s.ClientURL(), Options: opts,
		Consumer: ConsumerConfig{Memory: true}}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	nc, err := st.Dial("kvrouterd-dial-test", nats.NoEcho())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatalf("the dialled connection: %v", err)
	}
	// NoEcho: its own message does not come back to it.
	sub, err := nc.SubscribeSync("kvr.active.A")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("kvr.active.A", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(50 * time.Millisecond); err == nil {
		t.Fatalf("got its own message %q back", m.Data)
	}
	cz, err := s.Connz(&natsserver.ConnzOptions{Username: true})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cz.Conns {
		names = append(names, c.Name+"/"+c.AuthorizedUser)
	}
	if !slices.Contains(names, "kvrouterd-dial-test/u") {
		t.Fatalf("the server's clients %v, want kvrouterd-dial-test as user u", names)
	}
}
