// Package natstest runs nats-server processes (the Debian package's binary, from PATH) on
// loopback for tests: one server, or a cluster of three with JetStream, which a test kills
// (SIGKILL) and starts again on its ports and files. Only tests import it; every process it
// starts is killed when the test ends.
package natstest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/extbin"
	"github.com/kvrouterd/kvrouterd/internal/freeport"
)

// Binary is nats-server from PATH; without it the test skips, or fails under
// KVR_REQUIRE_EXTERNAL=1 (extbin).
func Binary(t testing.TB) string {
	t.Helper()
	return extbin.Find(t, "nats-server", "the tests against nats-server processes do not run")
}

// Node is one nats-server process with JetStream on loopback. Its configuration is written to
// a file in Dir, and it keeps its ports and its store across restarts. Not safe for concurrent
// use: the test's goroutine drives it.
type Node struct {
	Name    string
	Dir     string // the configuration file and the JetStream store
	Client  string // host:port of clients
	Monitor string // host:port of the monitoring endpoints (/healthz, /jsz, /routez)
	Route   string // host:port of cluster routes; empty outside a cluster
	// Extra is more configuration (authorization, tls), set before Start.
	Extra string

	t     testing.TB
	bin   string
	cmd   *exec.Cmd
	done  chan struct{} // closed when cmd has exited
	mu    sync.Mutex    // logs
	logs  bytes.Buffer
	peers []*Node
}

// NewNode returns a node with free loopback ports (package freeport: below the kernel's
// ephemeral range, so that no other test's connection takes one before the node binds it),
// not started, in a cluster if clustered; it
// is killed when the test ends.
func NewNode(t testing.TB, bin, name string, clustered bool) *Node {
	n := &Node{t: t, bin: bin, Name: name, Dir: t.TempDir(), Client: freeport.TB(t), Monitor: freeport.TB(t)}
	if clustered {
		n.Route = freeport.TB(t)
	}
	t.Cleanup(n.Kill)
	return n
}

// URL is the node's client URL.
func (n *Node) URL() string { return "nats://" + n.Client }

// config is n's configuration file.
func (n *Node) config() string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\nlisten: %q\nhttp: %q\n", n.Name, n.Client, n.Monitor)
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n}\n", filepath.Join(n.Dir, "js"))
	if n.Route != "" {
		fmt.Fprintf(&b, "cluster {\n  name: kvr\n  listen: %q\n  routes: [\n", n.Route)
		for _, p := range n.peers {
			if p != n {
				fmt.Fprintf(&b, "    %q\n", "nats-route://"+p.Route)
			}
		}
		b.WriteString("  ]\n}\n")
	}
	b.WriteString(n.Extra)
	return b.String()
}

// Start runs n (again) and waits until it listens for clients.
func (n *Node) Start() {
	n.t.Helper()
	conf := filepath.Join(n.Dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(n.config()), 0o600); err != nil {
		n.t.Fatal(err)
	}
	n.mu.Lock()
	fmt.Fprintf(&n.logs, "=== start %s\n", n.Name)
	n.mu.Unlock()
	n.cmd = exec.Command(n.bin, "-c", conf)
	n.cmd.Stdout = (*lockedWriter)(n)
	n.cmd.Stderr = (*lockedWriter)(n)
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	done := make(chan struct{})
	n.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(n.cmd)
	n.Await("nats-server "+n.Name+" to listen", func() bool {
		c, err := net.Dial("tcp", n.Client)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

type lockedWriter Node

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.logs.Write(p)
}

// Kill ends n at once (SIGKILL), as a crash or an OOM kill would, and waits for it; nothing if
// it does not run.
func (n *Node) Kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
	n.cmd = nil
}

// Log is what n wrote, for a failure's message.
func (n *Node) Log() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.logs.String()
}

// Await polls cond until it holds; a minute bounds a server that never gets there, not a
// timing.
func (n *Node) Await(what string, cond func() bool) {
	n.t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		select {
		case <-n.done:
			n.t.Fatalf("%s: nats-server exited\n%s", what, n.Log())
		default:
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("gave up waiting for %s\n%s", what, n.Log())
		}
	}
}

// MonitorGet decodes the JSON of n's monitoring path into v (nil: only the status matters);
// false if it does not answer 200.
func (n *Node) MonitorGet(path string, v any) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + n.Monitor + path)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return false
	}
	return v == nil || json.Unmarshal(body, v) == nil
}

// MetaLeader is the JetStream meta leader's name as n sees it; "" when it knows none.
func (n *Node) MetaLeader() string {
	var jsz struct {
		Meta struct {
			Leader string `json:"leader"`
		} `json:"meta_cluster"`
	}
	if !n.MonitorGet("/jsz", &jsz) {
		return ""
	}
	return jsz.Meta.Leader
}

// Cluster is three nats-server processes with JetStream, routed to each other on loopback.
type Cluster struct {
	Nodes []*Node
	t     testing.TB
}

// StartCluster starts the cluster and waits until it has formed: every node routed to the
// others, a JetStream meta leader, every node healthy.
func StartCluster(t testing.TB, bin string) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	for i := range 3 {
		c.Nodes = append(c.Nodes, NewNode(t, bin, fmt.Sprintf("n%d", i+1), true))
	}
	for _, n := range c.Nodes {
		n.peers = c.Nodes
		n.Start()
	}
	for _, n := range c.Nodes {
		c.AwaitJoined(n)
	}
	return c
}

// URLs is every node's client URL, comma-separated, as NATS clients and --nats-url take them.
func (c *Cluster) URLs() string {
	var u []string
	for _, n := range c.Nodes {
		u = append(u, n.URL())
	}
	return strings.Join(u, ",")
}

// Node is the node named name; nil if none is.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// AwaitJoined waits until n is routed to the other nodes, knows the JetStream meta leader, and
// answers /healthz 200: caught up with the meta leader and with every stream it holds a
// replica of.
func (c *Cluster) AwaitJoined(n *Node) {
	c.t.Helper()
	n.Await("nats-server "+n.Name+" to join the cluster", func() bool {
		var routez struct {
			NumRoutes int `json:"num_routes"`
		}
		return n.MonitorGet("/routez", &routez) && routez.NumRoutes >= len(c.Nodes)-1 &&
			n.MetaLeader() != "" && n.MonitorGet("/healthz", nil)
	})
}

// Logs is every node's output, for a failure's message.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "--- nats-server %s\n%s", n.Name, n.Log())
	}
	return b.String()
}
