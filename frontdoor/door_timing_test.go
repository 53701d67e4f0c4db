package frontdoor

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkFrontDoor: what the front door adds to a request — a /tokenize call, the route and
// its booking, the forward and the relay — against the same client calling the engine
// directly, over loopback, one client goroutine per CPU. The fake engine answers at once (a
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
	run := func(b *testing.B, url string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for pb.Next() {
				req.SetRequestURI(url)
				req.Header.SetMethod("POST")
				req.Header.SetContentType("application/json")
				req.SetBodyString(chatBody)
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d", err, resp.StatusCode())
				}
			}
		})
	}
	b.Run("direct", func(b *testing.B) { run(b, e.addr+"/v1/chat/completions") })
	b.Run("frontdoor", func(b *testing.B) { run(b, f.addr+"/v1/chat/completions") })
}
