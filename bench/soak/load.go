package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// Delays of a request's lifecycle after its route: its prefill is done after prefillAfter, it
// completes after completeAfter. At r routes per second the daemon holds about
// r × completeAfter bookings, plus those left to expire.
const (
	prefillAfter  = 300 * time.Millisecond
	completeAfter = 1500 * time.Millisecond
)

// lifecycle calls are due at their time; each queue has one delay, so it is in time order.
type call struct {
	due time.Time
	id  string
}

// lifecycle holds the prefill-dones and completions of routed requests until they are due.
type lifecycle struct {
	mu                sync.Mutex
	prefill, complete []call
	dropped           atomic.Int64
}

// maxPending bounds each queue: a daemon too slow to keep up drops lifecycle calls (their
// bookings expire) instead of growing the load generator.
const maxPending = 20000

func (l *lifecycle) add(q *[]call, c call) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(*q) >= maxPending {
		l.dropped.Add(1)
		return
	}
	*q = append(*q, c)
}

// due takes the calls of q due by now.
func (l *lifecycle) due(q *[]call, now time.Time, dst []call) []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	for i < len(*q) && !(*q)[i].due.After(now) {
		i++
	}
	dst = append(dst, (*q)[:i]...)
	*q = append((*q)[:0], (*q)[i:]...)
	return dst
}

// run makes the due calls every 50 ms until ctx ends.
func (l *lifecycle) run(ctx context.Context, c *client.Client, n *counters) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var batch []call
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			batch = l.due(&l.prefill, now, batch[:0])
			for _, x := range batch {
				n.count(&n.prefillDone, c.PrefillDone(x.id))
			}
			batch = l.due(&l.complete, now, batch[:0])
			for _, x := range batch {
				if x.id[0] == '!' {
					// A completion sent twice: the second must be refused (404), and change nothing.
					err := c.Complete(x.id[1:])
					if se, ok := err.(*client.StatusError); ok && se.Code == fasthttp.StatusNotFound {
						err = nil
					} else if err == nil {
						err = fmt.Errorf("a second completion of %s was accepted", x.id[1:])
					}
					n.count(&n.badRequests, err)
					continue
				}
				n.count(&n.complete, c.Complete(x.id))
			}
		}
	}
}

// routeLoop sends cfg.Routes / cfg.Conns calls a second from one goroutine: binary routes, JSON
// routes, matches and malformed routes; it hands each routed prompt to the fleet, whose chosen
// worker then stores it, and queues the request's lifecycle.
type routeLoop struct {
	cfg   Config
	c     *client.Client
	hc    *fasthttp.HostClient
	life  *lifecycle
	fleet chan<- stored
	n     *counters
	seq   *atomic.Uint64
	rng   *rand.Rand
}

func (r *routeLoop) run(ctx context.Context) {
	tick := time.NewTicker(time.Duration(float64(r.cfg.Conns) * float64(time.Second) / r.cfg.Routes))
	defer tick.Stop()
	var (
		req  wire.RouteRequest
		resp wire.RouteResponse
		toks []uint32
		body []byte
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p := prompt{model: r.rng.IntN(r.cfg.Models), doc: r.zipf(r.cfg.Docs), question: r.rng.IntN(r.cfg.Questions)}
		toks = p.tokens(toks[:0])
		k := r.seq.Add(1)
		id := fmt.Sprintf("soak-%d", k)
		req = wire.RouteRequest{RequestID: id, Model: modelName(p.model), Tokens: toks}
		// Three requests in ten belong to a conversation, of fifteen requests (those of 50 in a
		// row): session affinity binds each, and forgets it after its time to live.
		if k%10 < 3 {
			req.SessionID = fmt.Sprintf("conv-%d", k/50)
		}
		var err error
		switch x := r.rng.IntN(100); {
		case x < 5:
			req.RequestID = ""
			r.n.count(&r.n.matches, r.c.Match(&req, &resp))
			continue
		case x < 6:
			// A malformed route: refused with 400, nothing booked.
			r.n.count(&r.n.badRequests, post(r.hc, "/v1/route", []byte(`{"model":"soak-0","token_ids":[1,2,3]}`), fasthttp.StatusBadRequest))
			continue
		case x < 30:
			body, err = json.Marshal(struct {
				ID      string   `json:"request_id"`
				Model   string   `json:"model"`
				Tokens  []uint32 `json:"token_ids"`
				Session string   `json:"session_id,omitempty"`
			}{id, req.Model, toks, req.SessionID})
			if err == nil {
				err = r.routeJSON(body, &resp)
			}
			r.n.count(&r.n.routesJSON, err)
		default:
			err = r.c.Route(&req, &resp)
			r.n.count(&r.n.routesBinary, err)
		}
		if err != nil {
			continue
		}
		select {
		case r.fleet <- stored{worker: resp.Worker, rank: resp.Rank, p: p}:
		default:
		}
		now := time.Now()
		switch x := r.rng.IntN(100); {
		case x < 3:
			// Never completed: the booking expires after --request-expiry.
			r.n.expired.ok.Add(1)
		case x < 8:
			r.life.add(&r.life.complete, call{now.Add(completeAfter), id})
		case x < 10:
			r.life.add(&r.life.prefill, call{now.Add(prefillAfter), id})
			r.life.add(&r.life.complete, call{now.Add(completeAfter), id})
			r.life.add(&r.life.complete, call{now.Add(completeAfter), "!" + id})
		default:
			r.life.add(&r.life.prefill, call{now.Add(prefillAfter), id})
			r.life.add(&r.life.complete, call{now.Add(completeAfter), id})
		}
	}
}

// zipf picks one of n documents, the first ones more often, as a popular system prompt is.
func (r *routeLoop) zipf(n int) int {
	return int(float64(n) * r.rng.Float64() * r.rng.Float64())
}

func (r *routeLoop) routeJSON(body []byte, resp *wire.RouteResponse) error {
	req, hresp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(hresp)
	req.Header.SetMethod("POST")
	req.SetRequestURI("/v1/route")
	req.Header.SetHost(r.hc.Addr)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := r.hc.DoTimeout(req, hresp, 5*time.Second); err != nil {
		return err
	}
	if hresp.StatusCode() != fasthttp.StatusOK {
		return fmt.Errorf("JSON route: HTTP %d: %s", hresp.StatusCode(), hresp.Body())
	}
	var out struct {
		Worker uint64 `json:"worker_id"`
		Rank   uint32 `json:"dp_rank"`
	}
	if err := json.Unmarshal(hresp.Body(), &out); err != nil {
		return fmt.Errorf("JSON route: %w", err)
	}
	resp.Worker, resp.Rank = out.Worker, out.Rank
	return nil
}

// post posts body (JSON) to path and wants the status want.
func post(hc *fasthttp.HostClient, path string, body []byte, want int) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod("POST")
	req.SetRequestURI(path)
	req.Header.SetHost(hc.Addr)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := hc.DoTimeout(req, resp, 5*time.Second); err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	if resp.StatusCode() != want {
		return fmt.Errorf("POST %s: HTTP %d, want %d: %s", path, resp.StatusCode(), want, resp.Body())
	}
	return nil
}
