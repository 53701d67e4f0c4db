package main

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/hostile"
)

// TestHostileZMQPeer: anyone who reaches the HTTP port can register an engine endpoint they
// control, and kvrouterd dials it. A peer whose frame headers announce 2^62, 2^36 and 2^30
// bytes (which crashed the daemon, exhausted its memory, or wedged the subscription) costs its
// connection only: the daemon keeps serving, redials with backoff, counts each refusal per
// worker and rank, and never holds more than --zmq-max-message-bytes for it. The registration
// outlives a restart, and the restarted daemon survives the same peer (before, every restart
// crashed again). A message that is not an engine batch is dropped and counted too.
func TestHostileZMQPeer(t *testing.T) {
	bin := buildDaemon(t)
	sizes := []uint64{1 << 62, 1 << 36, 1 << 30, 0}
	pub, err := hostile.NewPublisher(func(n int, c *hostile.Conn) {
		if c.Handshake("PUB", nil) != nil {
			return
		}
		if size := sizes[n%len(sizes)]; size > 0 {
			if c.Header(0, size, true) != nil {
				return
			}
		} else {
			// After the subscription, a message of three frames whose payload is not msgpack.
			if _, err := c.ReadFrame(); err != nil || c.Message([]byte("kv"), make([]byte, 8), []byte("garbage")) != nil {
				return
			}
		}
		c.Hold(time.Minute)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const maxMsg = 4 << 20
	dir := t.TempDir()
	args := []string{"--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--zmq-max-message-bytes", strconv.Itoa(maxMsg)}

	run := func(register bool) {
		conns := pub.Connections() // counters in /metrics start from 0 with each process
		d := startDaemon(t, bin, args...)
		defer func() {
			if d.cmd.ProcessState == nil {
				_ = d.cmd.Process.Kill()
				_ = d.cmd.Wait()
			}
		}()
		if register {
			body := fmt.Sprintf(`{"instance_id":7,"endpoint":%q,"model_name":"m","block_size":16,"dp_rank":0}`, pub.Endpoint())
			resp, err := http.Post("http://"+d.addr+"/register", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("/register: %s", resp.Status)
			}
		}
		deadline := time.Now().Add(30 * time.Second)
		for pub.Connections() < conns+4 || zmqRefused(t, d.addr) < 3 || zmqSample(t, d.addr, "dropped_total", "decode") < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections, %v refused, %d dropped as undecodable: the subscription did not redial or count\n%s", pub.Connections(), zmqRefused(t, d.addr), zmqSample(t, d.addr, "dropped_total", "decode"), d.log())
			}
			if resp, err := http.Get("http://" + d.addr + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("/healthz while attacked: %v %v\n%s", resp, err, d.log())
			} else {
				resp.Body.Close()
			}
			time.Sleep(20 * time.Millisecond)
		}
		hwm := peakRSS(t, d.cmd.Process.Pid)
		if hwm > maxMsg+256<<20 {
			t.Errorf("peak RSS %d MiB: more than --zmq-max-message-bytes plus 256 MiB", hwm>>20)
		}
		t.Logf("%d connections refused as oversized; peak RSS %d MiB", zmqRefused(t, d.addr), hwm>>20)
		if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Wait(); err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, d.log())
		}
	}
	run(true)
	run(false) // the snapshot holds the registration: the restart dials the same peer
}

// zmqRefused is worker 7's count of connections refused as oversized, from /metrics.
func zmqRefused(t *testing.T, addr string) int {
	return zmqSample(t, addr, "refused_connections_total", "oversized")
}

// zmqSample is worker 7's rank-0 sample of kvrouterd_zmq_<name>{reason} from /metrics.
func zmqSample(t *testing.T, addr, name, reason string) int {
	t.Helper()
	return int(sample(t, scrape(addr), `kvrouterd_zmq_`+name+`{dp_rank="0",model="m",reason="`+reason+`",worker="7"}`))
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func peakRSS(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}
