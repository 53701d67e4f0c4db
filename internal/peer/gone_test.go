package peer

import (
	"io"
	"net"
	"testing"
	"time"
)

func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestGone(t *testing.T) {
	client, server := pair(t)
	if Gone(server) {
		t.Fatal("an idle, open connection is gone")
	}
	if _, err := client.Write([]byte("GET")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if Gone(server) {
		t.Fatal("a connection with data waiting is gone")
	}
	// Gone consumed nothing.
	buf := make([]byte, 3)
	if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "GET" {
		t.Fatalf("read after Gone: %q %v", buf, err)
	}
	client.Close()
	deadline := time.Now().Add(2 * time.Second)
	for !Gone(server) {
		if time.Now().After(deadline) {
			t.Fatal("a closed connection is not reported gone")
		}
		time.Sleep(5 * time.Millisecond)
	}
	server.Close()
	if !Gone(server) {
		t.Fatal("a connection closed here is not gone")
	}
}

type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

func TestGoneUnwraps(t *testing.T) {
	client, server := pair(t)
	client.Close()
	deadline := time.Now().Add(2 * time.Second)
	for !Gone(wrapped{server}) {
		if time.Now().After(deadline) {
			t.Fatal("a wrapped closed connection is not reported gone")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGoneDeadline: a read deadline that has passed (a server's read timeout, set for the
// request, still on the connection while the request is served) does not make a present client
// look gone.
func TestGoneDeadline(t *testing.T) {
	client, server := pair(t)
	if err := server.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if Gone(server) {
		t.Fatal("an open connection past its read deadline is gone")
	}
	client.Close()
	time.Sleep(20 * time.Millisecond)
	if !Gone(server) {
		t.Fatal("a closed connection past its read deadline is not gone")
	}
}
