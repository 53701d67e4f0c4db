package fleet

import (
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// Router, called by Run from one goroutine, one call at a time, is what a simulation calls on
// kvrouterd: its router.Router in process (Run's default), or a running daemon reached over
// HTTP and NATS (package bench/e2e). The values Run passes may be reused once a call returns.
type Router interface {
	// Register registers a simulated worker before the first arrival.
	Register(g router.Registration) error
	// Route chooses a worker for req and books its load.
	Route(req *wire.RouteRequest, resp *wire.RouteResponse) error
	// Events hands over the KV events one worker published in a step, as its engine would
	// publish them. The router may apply them after Events returns.
	Events(b *wire.EventBatch) error
	// PrefillDone and Complete report a routed request's progress.
	PrefillDone(id string) error
	Complete(id string) error
}

// Queuer is a Router with kvrouterd's router queue in front of it (router.Router.Enqueue and
// Cancel), called as Router is. Enqueue routes req at once (nil ticket) or holds it back; done
// then runs later, inside the PrefillDone, Complete or Events call that frees room, with the
// outcome in the ticket. Run needs one for Config.Queue.
type Queuer interface {
	Enqueue(req *wire.RouteRequest, resp *wire.RouteResponse, done func(*router.Ticket)) (*router.Ticket, error)
	Cancel(t *router.Ticket) bool
}

// local is Run's default Router: a router.Router in process that applies each batch before
// Events returns, so a simulation sees exactly what the workers published by then.
type local struct {
	r  *router.Router
	oc []shard.Outcome // ApplyEvents' outcomes, reused
}

func (l *local) Register(g router.Registration) error { return l.r.Register(g) }

func (l *local) Route(req *wire.RouteRequest, resp *wire.RouteResponse) error {
	return l.r.Route(req, resp)
}

func (l *local) Enqueue(req *wire.RouteRequest, resp *wire.RouteResponse, done func(*router.Ticket)) (*router.Ticket, error) {
	return l.r.Enqueue(req, resp, done)
}

func (l *local) Cancel(t *router.Ticket) bool { return l.r.Cancel(t) }

func (l *local) Events(b *wire.EventBatch) error {
	var err error
	l.oc, err = l.r.ApplyEvents(b, l.oc[:0])
	return err
}

func (l *local) PrefillDone(id string) error { return l.r.PrefillDone(id) }
func (l *local) Complete(id string) error    { return l.r.Complete(id) }

// pacer holds a simulation to a pace: simulated time t is due at start + (t − origin)/pace of
// wall time. It sleeps until an event is due and records how late the latest-handled event was.
type pacer struct {
	pace   float64 // simulated seconds per wall second; 0: unpaced
	origin int64   // simulated ns due at start
	start  time.Time
	maxLag time.Duration
}

// wait returns once simulated time t is due.
func (p *pacer) wait(t int64) {
	if p.pace <= 0 {
		return
	}
	due := p.start.Add(time.Duration(float64(t-p.origin) / p.pace))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
	p.maxLag = max(p.maxLag, time.Since(due))
}
