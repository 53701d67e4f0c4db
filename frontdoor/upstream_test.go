package frontdoor

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"sync/atomic"
	"testing"
	"time"
)

// upServer is a worker's HTTP/1.1 server at its most basic: it answers each request on a
// connection with answer(n), n counting the connection's requests from 1, and counts the
// connections it accepted. answer returns "" to close the connection without answering.
func upServer(t *testing.T, answer func(n int) string) (addr string, conns *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 1; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					a := answer(n)
					if a == "" {
						return
					}
					if _, err := io.WriteString(c, a); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), conns
}

const upChunked = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
	"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"

// callUp calls addr and reads the answer's body; attach, if set, is given the call's cancel.
func callUp(t *testing.T, u *upstream, addr string, attach func(func())) (string, error) {
	t.Helper()
	o := &outgoing{path: "/v1/completions", reqID: "r", body: []byte(`{}`)}
	if attach == nil {
		attach = func(func()) {}
	}
	resp, err := u.do(addr, addr, o.path, o, time.Time{}, attach)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestUpstreamReuses: answers read to their end leave their connection for the next call.
func TestUpstreamReuses(t *testing.T) {
	addr, conns := upServer(t, func(int) string { return upChunked })
	var u upstream
	defer u.closeIdle()
	for range 5 {
		if b, err := callUp(t, &u, addr, nil); err != nil || b != "data: [DONE]\n\n" {
			t.Fatalf("%q %v", b, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 5 calls, want 1", n)
	}
}

// TestUpstreamStale: a kept connection the worker closed meanwhile costs the call nothing but a
// new connection; a new connection that fails is the call's error.
func TestUpstreamStale(t *testing.T) {
	addr, conns := upServer(t, func(n int) string {
		if n == 2 {
			return "" // each connection serves one request, then closes when the next comes
		}
		return upChunked
	})
	var u upstream
	defer u.closeIdle()
	for i := range 3 {
		if b, err := callUp(t, &u, addr, nil); err != nil || b != "data: [DONE]\n\n" {
			t.Fatalf("call %d: %q %v", i, b, err)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3", n)
	}
	dead, _ := upServer(t, func(int) string { return "" })
	if _, err := callUp(t, &u, dead, nil); err == nil {
		t.Error("a worker that never answers: no error")
	}
}

// TestUpstreamCancel: a call is cancelled before its answer's headers and during its body, at
// once, and its connection is not kept.
func TestUpstreamCancel(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	addr, _ := upServer(t, func(n int) string {
		<-release
		return ""
	})
	var u upstream
	defer u.closeIdle()
	later := func(cancel func()) {
		go func() {
			time.Sleep(50 * time.Millisecond)
			cancel()
		}()
	}
	start := time.Now()
	if _, err := callUp(t, &u, addr, later); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("before the headers: %v after %v", err, time.Since(start))
	}

	body, _ := upServer(t, func(n int) string {
		return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n" // and no more
	})
	o := &outgoing{path: "/", reqID: "r", body: []byte(`{}`)}
	var cancel func()
	resp, err := u.do(body, body, "/", o, time.Time{}, func(c func()) { cancel = c })
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, p); err != nil || string(p) != "hello" {
		t.Fatalf("%q %v", p, err)
	}
	later(cancel)
	if _, err := resp.Body.Read(p); err == nil {
		t.Fatal("during the body: no error")
	}
	resp.Body.Close()
	if len(u.idle) != 0 {
		t.Errorf("a cancelled call's connection kept: %v", u.idle)
	}
}

// TestSplitEndpoint: an http_endpoint's address to dial, Host and path prefix.
func TestSplitEndpoint(t *testing.T) {
	f := func(endpoint, addr, host, prefix string, ok bool) {
		t.Helper()
		a, h, p, k := splitEndpoint(endpoint)
		if a != addr || h != host || p != prefix || k != ok {
			t.Errorf("%s: %q %q %q %v", endpoint, a, h, p, k)
		}
	}
	f("http://w1:8000", "w1:8000", "w1:8000", "", true)
	f("http://w1:8000/", "w1:8000", "w1:8000", "", true)
	f("http://w1/v2/", "w1:80", "w1", "/v2", true)
	f("http://[::1]:9/x", "[::1]:9", "[::1]:9", "/x", true)
	f("http://[::1]", "[::1]:80", "[::1]", "", true)
	f("https://w1:8000", "", "", "", false)
	f("http://", "", "", "", false)
}

// TestUpstreamWhole: an answer closed once whole, before its body's end, leaves its connection
// for the next call, which reads that end first; a connection whose end never comes is not
// used again.
func TestUpstreamWhole(t *testing.T) {
	f := func(rest string, wantConns int32) {
		t.Helper()
		addr, conns := upServer(t, func(int) string {
			return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\ne\r\ndata: [DONE]\n\n\r\n" + rest
		})
		var u upstream
		defer u.closeIdle()
		for i := range 3 {
			o := &outgoing{path: "/", reqID: "r", body: []byte(`{}`)}
			resp, err := u.do(addr, addr, "/", o, time.Time{}, func(func()) {})
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			p := make([]byte, 14)
			if _, err := io.ReadFull(resp.Body, p); err != nil || string(p) != "data: [DONE]\n\n" {
				t.Fatalf("call %d: %q %v", i, p, err)
			}
			resp.Body.(*upBody).Whole()
			resp.Body.Close()
		}
		if n := conns.Load(); n != wantConns {
			t.Errorf("rest %q: %d connections for 3 calls, want %d", rest, n, wantConns)
		}
	}
	f("0\r\n\r\n", 1)
	f("", 3)
}

// FuzzUpBody: a chunked body, as net/http writes one, reads back whole, its trailer read; any
// bytes read as a chunked body end in an answer or an error, never a panic.
func FuzzUpBody(f *testing.F) {
	f.Add([]byte("data: [DONE]\n\n"), []byte("5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"))
	f.Add([]byte(""), []byte("fffffffffffffff\r\n"))
	f.Add([]byte("a"), []byte("1;ext=1\r\na\r\n0\r\n\r\n"))
	read := func(b []byte) ([]byte, error) {
		body := &upBody{br: bufio.NewReaderSize(bytes.NewReader(b), 16), framing: bodyChunked}
		return io.ReadAll(body)
	}
	f.Fuzz(func(t *testing.T, data, raw []byte) {
		var enc bytes.Buffer
		cw := httputil.NewChunkedWriter(&enc)
		for p := data; len(p) > 0; p = p[min(len(p), 7):] {
			cw.Write(p[:min(len(p), 7)])
		}
		cw.Close()
		enc.WriteString("\r\n")
		if got, err := read(enc.Bytes()); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%q: %q %v", enc.Bytes(), got, err)
		}
		_, _ = read(raw)
	})
}
