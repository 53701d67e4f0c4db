package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// tcpServer serves a Router with the default server settings (8 MiB bodies) on a loopback
// port, and returns the Router and the address.
func tcpServer(t *testing.T) (*router.Router, string) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := router.New(router.Config{BlockSize: 4, Shards: 2, Logger: quiet})
	s := New(r, Config{Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Shutdown(t.Context())
		r.Close()
	})
	return r, ln.Addr().String()
}

// call sends one request and returns the status and body; a transport error fails the test.
func call(t *testing.T, c *fasthttp.Client, method, url string, body []byte) (int, string) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(method)
	req.SetBody(body)
	if err := c.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return 0, ""
	}
	return resp.StatusCode(), string(resp.Body())
}

// ranksBody is a POST /v1/workers body for worker id of model m with ranks from..from+n-1.
func ranksBody(id uint64, m string, from, n int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"worker_id":%d,"model":%q,"dp_ranks":[`, id, m)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(from + i))
	}
	b.WriteString("]}")
	return b.Bytes()
}

// wantRefused checks an answer is a 4xx naming field.
func wantRefused(t *testing.T, what string, code int, body string, status int, field string) {
	t.Helper()
	if code != status || !strings.Contains(body, `"field":"`+field+`"`) {
		t.Errorf("%s: %d %.300s, want %d naming field %q", what, code, body, status, field)
	}
}

// sameAfterRestore snapshots r, restores the snapshot into a new router, and compares what both
// list.
func sameAfterRestore(t *testing.T, r *router.Router) {
	t.Helper()
	var chunks [][]byte
	st, err := r.Snapshot(0, func(c []byte) error { chunks = append(chunks, bytes.Clone(c)); return nil })
	if err != nil || st.Skipped != 0 {
		t.Fatalf("snapshot: %+v %v", st, err)
	}
	to := router.New(router.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer to.Close()
	if _, err := to.Restore(len(chunks), func(i int, dst []byte) ([]byte, error) { return append(dst, chunks[i]...), nil }); err != nil {
		t.Fatal(err)
	}
	a, b := r.Workers(), to.Workers()
	for i := range a { // when the last events arrived is not part of a snapshot
		a[i].LastEventAt = time.Time{}
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("restored workers differ:\n%+v\n%+v", a, b)
	}
	if a, b := r.Models(), to.Models(); !reflect.DeepEqual(a, b) {
		t.Fatalf("restored models differ:\n%+v\n%+v", a, b)
	}
}

// Registrations the snapshot format cannot hold are refused with 400 naming the field, on both
// APIs, and what is accepted at the limits survives a snapshot.
func TestRegisterOverLimitsRefused(t *testing.T) {
	r, addr := tcpServer(t)
	c := &fasthttp.Client{}
	base := "http://" + addr
	long, at := strings.Repeat("x", wire.MaxString+1), strings.Repeat("y", wire.MaxString)
	post := func(path, body string) (int, string) { return call(t, c, "POST", base+path, []byte(body)) }

	f := func(path, body string, field string) {
		t.Helper()
		code, msg := post(path, body)
		wantRefused(t, fmt.Sprintf("POST %s %.60s", path, body), code, msg, 400, field)
	}
	f("/v1/workers", `{"worker_id":1,"model":"`+long+`"}`, "model")
	f("/v1/workers", `{"worker_id":1,"model":"m","endpoint":"`+long+`"}`, "endpoint")
	f("/v1/workers", `{"worker_id":1,"model":"m","replay_endpoint":"`+long+`"}`, "replay_endpoint")
	f("/v1/workers", string(ranksBody(1, "m", 0, wire.MaxSnapshotRanks+1)), "dp_ranks")
	f("/v1/workers", `{"worker_id":1,"model":"m","block_size":65537}`, "block_size")
	f("/v1/workers", `{"worker_id":1,"model":"m","capacity_blocks":-1}`, "capacity_blocks")
	f("/v1/workers", `{"worker_id":1,"model":"m","max_batched_tokens":-1}`, "max_batched_tokens")
	f("/v1/workers", `{"worker_id":1,"model":"m","dp_ranks":[4294967296]}`, "dp_ranks") // not a u32
	f("/register", `{"instance_id":2,"model_name":"`+long+`","block_size":4}`, "model_name")
	half := strings.Repeat("h", wire.MaxString/2)
	f("/register", `{"instance_id":2,"model_name":"`+half+`","routing_group":"`+half+`","block_size":4}`, "routing_group")
	f("/register", `{"instance_id":2,"model_name":"m","endpoint":"`+long+`","block_size":4}`, "endpoint")
	f("/register", `{"instance_id":2,"model_name":"m","replay_endpoint":"`+long+`","block_size":4}`, "replay_endpoint")
	if ws := r.Workers(); len(ws) != 0 {
		t.Fatalf("refused registrations left workers: %+v", ws)
	}

	// At the limits: accepted; one rank more is refused on either API.
	if code, msg := post("/v1/workers", string(ranksBody(3, at, 0, wire.MaxSnapshotRanks))); code != 201 {
		t.Fatalf("%d ranks: %d %s", wire.MaxSnapshotRanks, code, msg)
	}
	f("/v1/workers", string(ranksBody(3, at, wire.MaxSnapshotRanks, 1)), "dp_ranks")
	f("/register", `{"instance_id":3,"model_name":"`+at+`","block_size":4,"dp_rank":5000}`, "dp_rank")
	if code, msg := post("/v1/workers", `{"worker_id":4,"model":"m","endpoint":"`+at+`","replay_endpoint":"`+at+`","capacity_blocks":9223372036854775807}`); code != 201 {
		t.Fatalf("strings at the limit: %d %s", code, msg)
	}
	if code, msg := post("/register", `{"instance_id":5,"model_name":"`+half+`","routing_group":"`+half[:len(half)-1]+`","block_size":4,"dp_rank":4294967295}`); code != 201 {
		t.Fatalf("model@routing_group at the limit: %d %s", code, msg)
	}
	sameAfterRestore(t, r)
}

// A registration of 100,000 ranks is refused at the cap, naming dp_ranks, and other requests
// are served while it is in flight and while several are processed at once.
func TestRegisterManyRanksServesOthers(t *testing.T) {
	r, addr := tcpServer(t)
	c := &fasthttp.Client{}
	base := "http://" + addr
	big := ranksBody(1, "m", 0, 100_000)
	others := func(i int) {
		t.Helper()
		if code, msg := call(t, c, "POST", base+"/v1/workers", []byte(fmt.Sprintf(`{"worker_id":%d,"model":"m","dp_ranks":[0,1]}`, 100+i))); code != 201 {
			t.Errorf("a registration beside it: %d %s", code, msg)
		}
		if code, msg := call(t, c, "GET", base+"/v1/workers", nil); code != 200 {
			t.Errorf("a listing beside it: %d %s", code, msg)
		}
		if code, msg := call(t, c, "POST", base+"/v1/match", []byte(`{"model":"m","token_ids":[1,2,3,4]}`)); code != 200 {
			t.Errorf("a match beside it: %d %s", code, msg)
		}
	}

	// One sent over a raw connection, half its body first: the rest of the API answers
	// meanwhile.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	head := fmt.Sprintf("POST /v1/workers HTTP/1.1\r\nHost: kvrouterd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(big))
	if _, err := conn.Write(append([]byte(head), big[:len(big)/2]...)); err != nil {
		t.Fatal(err)
	}
	others(0)
	if _, err := conn.Write(big[len(big)/2:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	wantRefused(t, "100,000 ranks", resp.StatusCode, string(msg), 400, "dp_ranks")

	// Several at once, with the other requests beside them.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, msg := call(t, c, "POST", base+"/v1/workers", ranksBody(uint64(10+i), "m", 0, 100_000))
			wantRefused(t, "100,000 ranks, concurrently", code, msg, 400, "dp_ranks")
		}()
	}
	for i := range 8 {
		others(1 + i)
	}
	wg.Wait()
	for _, w := range r.Workers() {
		if w.ID < 100 {
			t.Fatalf("a refused registration left worker %d rank %d", w.ID, w.Rank)
		}
	}
	sameAfterRestore(t, r)
}

// Whatever Dynamo's /register accepts, at, under and over the limits of the format, survives
// snapshot → restore unchanged.
func TestDynamoRegisterSurvivesSnapshot(t *testing.T) {
	r, addr := tcpServer(t)
	c := &fasthttp.Client{}
	rnd := rand.New(rand.NewPCG(5, 7))
	str := func(prefix string) string {
		switch rnd.IntN(5) {
		case 0:
			return ""
		case 1:
			return strings.Repeat(prefix[:1], wire.MaxString-4+rnd.IntN(9))
		}
		return prefix + strconv.Itoa(rnd.IntN(3))
	}
	// endpoint makes a host a ZMQ endpoint (none for none), of up to wire.MaxString+4 bytes.
	endpoint := func(host string) string {
		if host == "" {
			return ""
		}
		e := "tcp://" + host + ":5557"
		return e[:min(len(e), wire.MaxString+rnd.IntN(5))] // cut, it is no endpoint: refused
	}
	accepted := 0
	for range 400 {
		body := map[string]any{
			"instance_id": rnd.IntN(40), "model_name": str("model"), "routing_group": str("group"),
			"block_size": []int{4, 4, 16, 0, wire.MaxBlockSize, wire.MaxBlockSize + 1}[rnd.IntN(6)],
			"endpoint":   endpoint(str("e")), "replay_endpoint": endpoint(str("r")),
			"dp_rank": []uint32{0, 1, uint32(rnd.IntN(wire.MaxSnapshotRanks * 2)), rnd.Uint32()}[rnd.IntN(4)],
		}
		if body["model_name"] == "" {
			body["model_name"] = "m"
		}
		if rnd.IntN(6) == 0 {
			body["model_name"] = strings.Repeat("m", wire.MaxString/2)
			body["routing_group"] = strings.Repeat("t", wire.MaxString/2-2+rnd.IntN(4))
		}
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		code, msg := call(t, c, "POST", "http://"+addr+"/register", b)
		switch {
		case code == 201:
			accepted++
		case code < 400 || code >= 500 || !strings.Contains(msg, `"field":"`):
			t.Fatalf("/register %s: %d %s", b, code, msg)
		}
	}
	t.Logf("%d registrations accepted", accepted)
	if accepted < 20 {
		t.Fatalf("only %d registrations accepted: the generator should exercise acceptance", accepted)
	}
	sameAfterRestore(t, r)
}
