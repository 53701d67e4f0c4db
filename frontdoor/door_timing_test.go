package frontdoor

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkFrontDoor: what the front door adds to a request — a /tokenize call, the route and
// its booking, the forward and the relay — against the same client calling the engine
// directly, over loopback, one client goroutine per CPU; the -ids pair sends a prompt of token
// ids, which the front door does not tokenize. The fake engine answers at once (a
// 3-chunk stream), so the difference is the front door's own cost.
//
//	go test -run '^$' -bench FrontDoor -count 6 ./frontdoor/
func BenchmarkFrontDoor(b *testing.B) {
	e := startEngine(b, 3)
	f := newFixture(b, Config{Retries: 2}, e)
	go func() { // the fake engine records what it gets: drain it
		for {
			select {
			case <-e.received:
			case <-e.ranks:
			}
		}
	}()
	c := &fasthttp.Client{MaxConnsPerHost: 1024}
	run := func(b *testing.B, url, body string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for pb.Next() {
				req.SetRequestURI(url)
				req.Header.SetMethod("POST")
				req.Header.SetContentType("application/json")
				req.SetBodyString(body)
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d", err, resp.StatusCode())
				}
			}
		})
	}
	const ids = `{"model":"m","stream":true,"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24]}`
	b.Run("direct", func(b *testing.B) { run(b, e.addr+"/v1/chat/completions", chatBody) })
	b.Run("frontdoor", func(b *testing.B) { run(b, f.addr+"/v1/chat/completions", chatBody) })
	// A prompt of token ids: no /tokenize call.
	b.Run("direct-ids", func(b *testing.B) { run(b, e.addr+"/v1/completions", ids) })
	b.Run("frontdoor-ids", func(b *testing.B) { run(b, f.addr+"/v1/completions", ids) })
}
