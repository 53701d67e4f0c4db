package replica

import (
	"log/slog"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/nats-io/nats-server/v2/server"
	natstest "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go"
)

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func toks(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

// embedded starts a NATS server in the process on a free loopback port, without JetStream or
// users: load sharing is plain NATS, and who may publish on its subjects is ingest's to test.
func embedded(t testing.TB) *server.Server {
	t.Helper()
	s := natstest.RunRandClientPortServer()
	t.Cleanup(s.Shutdown)
	return s
}

// connect is a plain connection, with echo, as a Sharer sharing the daemon's connection would
// have.
func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// ownConn is a connection of a Sharer's own, without echo, as the daemon opens it.
func ownConn(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("kvrouterd-share"), nats.NoEcho())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// waitFor polls cond; it bounds how long a broken build hangs, it asserts no timing.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestDefaultPrefix: a Sharer configured without a prefix uses the one every other kvrouterd
// subject has, for which the embedded server's users are set up.
func TestDefaultPrefix(t *testing.T) {
	if defaultPrefix != ingest.DefaultPrefix {
		t.Fatalf("replica's default prefix %q, ingest's %q", defaultPrefix, ingest.DefaultPrefix)
	}
}
