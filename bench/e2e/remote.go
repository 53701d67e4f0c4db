package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/valyala/fasthttp"
)

// Target says where a running kvrouterd is; a plain value. Zero fields take the defaults listed.
type Target struct {
	Addr    string        // HTTP host:port (required)
	NATSURL string        // the NATS server the daemon takes events from (required)
	Prefix  string        // subject prefix (ingest.DefaultPrefix)
	Stream  string        // the stream the daemon consumes (ingest.DefaultStream)
	Timeout time.Duration // bound of one HTTP call (5 s)
}

func (t *Target) defaults() {
	if t.Prefix == "" {
		t.Prefix = ingest.DefaultPrefix
	}
	if t.Stream == "" {
		t.Stream = ingest.DefaultStream
	}
	if t.Timeout <= 0 {
		t.Timeout = 5 * time.Second
	}
}

// PublishStats count what a Remote published; a plain value.
type PublishStats struct {
	Batches, Events int64  // published (acknowledged or not)
	Errors          int    // batches the stream did not store: the daemon sees a gap
	FirstErr        string // the first such error
}

// Remote, for one goroutine at a time (the simulation's), is a fleet.Router that drives a
// running kvrouterd over HTTP and NATS (see the package doc).
type Remote struct {
	t    Target
	c    *client.Client
	hc   *fasthttp.HostClient // GET /v1/workers
	nc   *nats.Conn
	pub  *ingest.Publisher
	tag  string   // prefix of request ids
	regs []uint64 // workers registered, to unregister

	pending []pending         // publishes not acknowledged yet, oldest first
	stored  map[uint64]uint64 // worker → highest event id the stream stored
	st      PublishStats
}

// pending is one asynchronous publish.
type pending struct {
	f      jetstream.PubAckFuture
	worker uint64
	last   uint64 // highest event id in the batch
}

// Dial connects to the daemon t describes: its HTTP API answers and its stream exists.
func Dial(t Target) (*Remote, error) {
	t.defaults()
	if t.Addr == "" || t.NATSURL == "" {
		return nil, errors.New("e2e: a target needs both the HTTP address and the NATS URL")
	}
	r := &Remote{
		t:      t,
		c:      client.New(client.Config{Addr: t.Addr, Timeout: t.Timeout, MaxConns: 4}),
		hc:     &fasthttp.HostClient{Addr: t.Addr, ReadTimeout: t.Timeout, WriteTimeout: t.Timeout},
		tag:    "e2e-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-",
		stored: make(map[uint64]uint64),
	}
	if _, err := r.workers(); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(t.NATSURL, nats.Name("kvrouterd-e2e"))
	if err != nil {
		return nil, fmt.Errorf("e2e: nats %s: %w", t.NATSURL, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.Timeout)
	defer cancel()
	js, err := jetstream.New(nc)
	if err == nil {
		_, err = js.Stream(ctx, t.Stream)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("e2e: stream %s on %s (does the daemon consume this NATS?): %w", t.Stream, t.NATSURL, err)
	}
	if r.pub, err = ingest.NewPublisher(nc, t.Prefix); err != nil {
		nc.Close()
		return nil, err
	}
	r.nc = nc
	return r, nil
}

// Register registers worker g.ID afresh: a first registration checks that the id is free or
// already a worker of g.Model (a crashed run's), then unregistering drops that worker's blocks
// and event cursor, and the last registration is the run's.
func (r *Remote) Register(g router.Registration) error {
	w := client.Worker{ID: g.ID, Model: g.Model, BlockSize: g.BlockSize, Ranks: g.Ranks, Capacity: g.Capacity, MaxTokens: g.MaxTokens}
	if err := r.c.Register(w); err != nil {
		return err
	}
	if err := r.c.Unregister(g.ID); err != nil {
		return err
	}
	if err := r.c.Register(w); err != nil {
		return err
	}
	if !slices.Contains(r.regs, g.ID) {
		r.regs = append(r.regs, g.ID)
	}
	return nil
}

// Route routes req over HTTP in the binary format; the request id gets the Remote's tag.
func (r *Remote) Route(req *wire.RouteRequest, resp *wire.RouteResponse) error {
	q := *req
	q.RequestID = r.tag + req.RequestID
	return r.c.Route(&q, resp)
}

// PrefillDone reports request id's prefill over HTTP.
func (r *Remote) PrefillDone(id string) error { return r.c.PrefillDone(r.tag + id) }

// Complete reports request id's completion over HTTP.
func (r *Remote) Complete(id string) error { return r.c.Complete(r.tag + id) }

// Events publishes b to the stream without waiting for the store. It fails only for a batch
// the format cannot carry; a publish the stream refuses is counted in Stats.
func (r *Remote) Events(b *wire.EventBatch) error {
	r.reap()
	if err := b.Validate(); err != nil {
		return err
	}
	var last uint64
	for i := range b.Events {
		last = max(last, b.Events[i].ID)
	}
	r.st.Batches++
	r.st.Events += int64(len(b.Events))
	f, err := r.pub.BatchAsync(b)
	if err != nil {
		r.fail(err)
		return nil
	}
	r.pending = append(r.pending, pending{f: f, worker: b.Worker, last: last})
	return nil
}

// reap takes in the acknowledgements that have arrived, oldest first.
func (r *Remote) reap() {
	for len(r.pending) > 0 {
		p := r.pending[0]
		select {
		case <-p.f.Ok():
			r.stored[p.worker] = max(r.stored[p.worker], p.last)
		case err := <-p.f.Err():
			r.fail(err)
		default:
			return
		}
		r.pending = r.pending[1:]
	}
}

func (r *Remote) fail(err error) {
	if r.st.Errors == 0 {
		r.st.FirstErr = err.Error()
	}
	r.st.Errors++
}

// Stats returns what the Remote published so far.
func (r *Remote) Stats() PublishStats { return r.st }

// Drain waits until the stream has acknowledged every batch published and the daemon has
// applied every stored event (each worker's event cursor, GET /v1/workers, reaches the last
// event id stored), or ctx ends.
func (r *Remote) Drain(ctx context.Context) error {
	for _, p := range r.pending {
		select {
		case <-p.f.Ok():
			r.stored[p.worker] = max(r.stored[p.worker], p.last)
		case err := <-p.f.Err():
			r.fail(err)
		case <-ctx.Done():
			return fmt.Errorf("e2e: waiting for the stream's acknowledgements: %w", ctx.Err())
		}
	}
	r.pending = r.pending[:0]
	for {
		ws, err := r.workers()
		if err != nil {
			return err
		}
		behind := ""
		for id, last := range r.stored {
			i := slices.IndexFunc(ws, func(w router.WorkerInfo) bool { return w.ID == id && w.Rank == 0 })
			if i < 0 {
				return fmt.Errorf("e2e: worker %d is no longer registered", id)
			}
			if ws[i].LastEventID < last {
				behind = fmt.Sprintf("worker %d applied up to event %d of %d", id, ws[i].LastEventID, last)
				break
			}
		}
		if behind == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("e2e: daemon still behind (%s): %w", behind, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// workers lists the daemon's workers (GET /v1/workers).
func (r *Remote) workers() ([]router.WorkerInfo, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("/v1/workers")
	req.Header.SetHost(r.t.Addr)
	if err := r.hc.DoTimeout(req, resp, r.t.Timeout); err != nil {
		return nil, fmt.Errorf("e2e: kvrouterd %s: %w", r.t.Addr, err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return nil, fmt.Errorf("e2e: kvrouterd %s GET /v1/workers: HTTP %d: %s", r.t.Addr, resp.StatusCode(), resp.Body())
	}
	var out struct {
		Workers []router.WorkerInfo `json:"workers"`
	}
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		return nil, fmt.Errorf("e2e: kvrouterd %s GET /v1/workers: %w", r.t.Addr, err)
	}
	return out.Workers, nil
}

// Close unregisters the workers the Remote registered and closes its NATS connection. Call
// Drain first: an event applied after its worker left registers the worker again.
func (r *Remote) Close() error {
	var errs []error
	for _, id := range r.regs {
		if err := r.c.Unregister(id); err != nil {
			errs = append(errs, fmt.Errorf("e2e: unregister worker %d: %w", id, err))
		}
	}
	r.regs = nil
	r.nc.Close()
	return errors.Join(errs...)
}
