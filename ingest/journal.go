package ingest

// Changes asked for over HTTP, sent through the event stream so that every replica makes them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Header names and values of the changes a Journal publishes. A message on a worker's event
// subject with HeaderOp is a change to apply as the HTTP API would, not an engine's batch.
const (
	// HeaderOp names the change: OpRegister (a JSON registration), OpUnregister (no body),
	// OpUnregisterRank (a JSON {"dp_rank"}) or OpEvents (a binary event batch, applied to a
	// registered worker only, as /v1/events).
	HeaderOp = "Kvr-Op"
	// HeaderOrigin is "<journal>.<n>": the change a replica's Journal waits on for its answer.
	HeaderOrigin = "Kvr-Origin"

	OpRegister       = "register"
	OpUnregister     = "unregister"
	OpUnregisterRank = "unregister_rank" // body {"dp_rank": N}
	OpEvents         = "events"
)

// DefaultJournalWait is how long a Journal waits for its consumer to apply a change it
// published before it answers router.ErrUnavailable.
const DefaultJournalWait = 10 * time.Second

// Journal is a router.Changer that publishes each change to the event stream and returns once
// this replica's Consumer has applied it, with what applying it gave: the Router's error or the
// batch's outcomes. Every replica reading the stream applies the same changes in the same
// order as engines' events, so replicas agree on workers and blocks whichever one was asked.
// Requests a local look shows are refused (an unknown worker) are answered by the local
// Router without publishing, and so are registrations router.Registration.Checked refuses.
// Safe for concurrent use.
type Journal struct {
	c     *Consumer
	local Local
	nc    *nats.Conn
	js    jetstream.JetStream
	wait  time.Duration
}

// Local is the router a Journal's consumer applies to: what the Journal reads of it before
// publishing.
type Local interface {
	router.Changer
	WorkerModel(id uint64) (string, bool)
}

var _ router.Changer = (*Journal)(nil)

// NewJournal returns a Journal publishing through nc (JetStream) and waiting on c, whose sink
// is local. wait ≤ 0 is DefaultJournalWait.
func NewJournal(c *Consumer, nc *nats.Conn, local Local, wait time.Duration) (*Journal, error) {
	if wait <= 0 {
		wait = DefaultJournalWait
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Journal{c: c, local: local, nc: nc, js: js, wait: wait}, nil
}

// registrationJSON is a registration in the stream.
type registrationJSON struct {
	Worker    uint64   `json:"worker_id"`
	Model     string   `json:"model"`
	BlockSize int      `json:"block_size,omitempty"`
	Ranks     []uint32 `json:"dp_ranks,omitempty"`
	Capacity  int64    `json:"capacity_blocks,omitempty"`
	MaxTokens int64    `json:"max_batched_tokens,omitempty"`
	Endpoint  string   `json:"endpoint,omitempty"`
	Replay    string   `json:"replay_endpoint,omitempty"`
	// HTTPEndpoint: a replica older than it ignores it (the worker's API then unknown there).
	HTTPEndpoint string `json:"http_endpoint,omitempty"`
	// APIKey is the worker's own API key, which every replica's front door sends it: the
	// stream carries it as it carries the rest of the registration (docs/security.md,
	// "Credentials at the front door"). A replica older than it ignores it.
	APIKey string `json:"api_key,omitempty"`
	// Weight: a replica older than it ignores it (the worker's weight then 1 there).
	Weight float64 `json:"weight,omitempty"`
	// Role: prefill, decode or both; absent keeps a registered worker's (Registration.KeepRole).
	// A replica older than it ignores it (every worker then both there).
	Role string `json:"role,omitempty"`
}

// roleJSON is g's role as the stream carries it: none with KeepRole.
func roleJSON(g router.Registration) string {
	if g.KeepRole {
		return ""
	}
	return g.Role.String()
}

// Register publishes g and returns the Router's answer to it.
func (j *Journal) Register(g router.Registration) error {
	g, err := g.Checked() // what is refused whatever is registered stays out of the stream
	if err != nil {
		return err
	}
	body, err := json.Marshal(registrationJSON{Worker: g.ID, Model: g.Model, BlockSize: g.BlockSize, Ranks: g.Ranks,
		Capacity: g.Capacity, MaxTokens: g.MaxTokens, Endpoint: g.Endpoint, Replay: g.Replay, HTTPEndpoint: g.HTTPEndpoint, APIKey: g.APIKey, Weight: g.Weight,
		Role: roleJSON(g)})
	if err != nil {
		return err
	}
	w, err := j.publish(OpRegister, g.Model, g.ID, body, "model", nil)
	if err != nil {
		return err
	}
	return w.err
}

// Unregister publishes the removal of worker id and returns the Router's answer to it.
func (j *Journal) Unregister(id uint64) error {
	model, ok := j.local.WorkerModel(id)
	if !ok {
		return j.local.Unregister(id) // not registered here: the Router's refusal
	}
	w, err := j.publish(OpUnregister, model, id, nil, "worker_id", nil)
	if err != nil {
		return err
	}
	return w.err
}

// UnregisterRank publishes the removal of worker id's rank and returns the Router's answer.
func (j *Journal) UnregisterRank(id uint64, rank uint32) error {
	model, ok := j.local.WorkerModel(id)
	if !ok {
		return j.local.UnregisterRank(id, rank) // not registered here: the Router's refusal
	}
	body, err := json.Marshal(rankJSON{Rank: rank})
	if err != nil {
		return err
	}
	w, err := j.publish(OpUnregisterRank, model, id, body, "dp_rank", nil)
	if err != nil {
		return err
	}
	return w.err
}

// rankJSON is the body of OpUnregisterRank.
type rankJSON struct {
	Rank uint32 `json:"dp_rank"`
}

// ApplyEvents publishes b and returns the outcomes of its events, appended to dst.
func (j *Journal) ApplyEvents(b *wire.EventBatch, dst []shard.Outcome) ([]shard.Outcome, error) {
	model, ok := j.local.WorkerModel(b.Worker)
	if !ok || b.Model != "" && b.Model != model {
		return j.local.ApplyEvents(b, dst) // refused here: the Router says why
	}
	w, err := j.publish(OpEvents, model, b.Worker, wire.AppendEventBatch(nil, b), "events", dst)
	if err != nil {
		return dst, err
	}
	return w.oc, w.err
}

// publish publishes one change and waits until the consumer applied it; field names the
// request's part at fault when the change is too large for the stream, and dst is where the
// outcomes of an event batch go (nil for other changes).
func (j *Journal) publish(op, model string, worker uint64, body []byte, field string, dst []shard.Outcome) (*waiter, error) {
	if limit := j.nc.MaxPayload(); int64(len(body)) > limit {
		return nil, &router.FieldError{Field: field, Err: router.ErrTooLong,
			Msg: fmt.Sprintf("the change is %d bytes in the event stream, over its message limit of %d (NATS max_payload); send less at once", len(body), limit)}
	}
	id, w := j.c.await(dst)
	m := nats.NewMsg(EventSubject(j.c.cfg.Prefix, model, worker))
	m.Data = body
	m.Header.Set(HeaderOp, op)
	m.Header.Set(HeaderOrigin, j.c.origin+"."+strconv.FormatUint(id, 10))
	ctx, cancel := context.WithTimeout(context.Background(), j.wait)
	defer cancel()
	if _, err := j.js.PublishMsg(ctx, m); err != nil {
		j.c.abandon(id)
		return nil, fmt.Errorf("%w: the event stream did not acknowledge the change (if it took it, it will still be made): %v", router.ErrUnavailable, err)
	}
	select {
	case <-w.done:
		return w, nil
	case <-ctx.Done():
	}
	if !j.c.abandon(id) {
		<-w.done // the consumer is applying it now
		return w, nil
	}
	return nil, fmt.Errorf("%w: the change is in the event stream, but this replica has not applied it within %v; it will be",
		router.ErrUnavailable, j.wait)
}

// waiter is a change a Journal waits on. The consumer that takes it out of the table fills it
// and closes done; until then only the consumer touches oc and err.
type waiter struct {
	oc   []shard.Outcome
	err  error
	done chan struct{}
}

// waiters is a Consumer's table of the changes its Journal waits on.
type waiters struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]*waiter
}

// await enters a new waiter whose outcomes are appended to dst, and returns its number.
func (c *Consumer) await(dst []shard.Outcome) (uint64, *waiter) {
	w := &waiter{oc: dst, done: make(chan struct{})}
	c.waiting.mu.Lock()
	defer c.waiting.mu.Unlock()
	if c.waiting.m == nil {
		c.waiting.m = make(map[uint64]*waiter)
	}
	c.waiting.next++
	c.waiting.m[c.waiting.next] = w
	return c.waiting.next, w
}

// abandon takes waiter id out of the table; false if the consumer took it first.
func (c *Consumer) abandon(id uint64) bool {
	c.waiting.mu.Lock()
	defer c.waiting.mu.Unlock()
	_, ok := c.waiting.m[id]
	delete(c.waiting.m, id)
	return ok
}

// take takes out the waiter a message's origin names, if it is this consumer's and still
// waiting; nil otherwise.
func (c *Consumer) take(origin string) *waiter {
	replica, n, ok := strings.Cut(origin, ".")
	if !ok || replica != c.origin {
		return nil
	}
	id, err := strconv.ParseUint(n, 10, 64)
	if err != nil {
		return nil
	}
	c.waiting.mu.Lock()
	defer c.waiting.mu.Unlock()
	w := c.waiting.m[id]
	delete(c.waiting.m, id)
	return w
}

// errNoChanges refuses a change for a sink that cannot make them.
var errNoChanges = errors.New("this consumer's sink makes no API changes")

// handleOp applies a change a Journal published (c.mu held) and returns the waiter it answers,
// if the change is this replica's: the caller closes its done once the message's sequence is
// stored, so that the Journal's caller finds it in LastSeq.
func (c *Consumer) handleOp(op, model string, worker uint64, m jetstream.Msg) *waiter {
	w := c.take(m.Headers().Get(HeaderOrigin))
	err := c.applyOp(op, model, worker, m.Data(), w)
	if err != nil {
		if errors.Is(err, router.ErrClosed) {
			err = fmt.Errorf("%w: %w", router.ErrUnavailable, err)
		} else {
			c.reject(RejectInvalid, "event stream: change refused", "op", op, "subject", m.Subject(), "err", err)
		}
	} else {
		c.changes.Add(1)
	}
	if w != nil {
		w.err = err
	}
	return w
}

// applyOp applies one change; w, if not nil, receives an event batch's outcomes.
func (c *Consumer) applyOp(op, model string, worker uint64, data []byte, w *waiter) error {
	ch, ok := c.sink.(router.Changer)
	if !ok {
		return errNoChanges
	}
	switch op {
	case OpRegister:
		var j registrationJSON
		if err := json.Unmarshal(data, &j); err != nil {
			return &router.FieldError{Field: "registration", Err: router.ErrInvalid, Msg: err.Error()}
		}
		if j.Worker != worker || j.Model != model {
			return &router.FieldError{Field: "worker_id", Err: router.ErrInvalid, Msg: "the registration's worker or model is not its subject's"}
		}
		role, err := router.ParseRole(j.Role)
		if err != nil {
			return err
		}
		return ch.Register(router.Registration{ID: j.Worker, Model: j.Model, BlockSize: j.BlockSize, Ranks: j.Ranks,
			Capacity: j.Capacity, MaxTokens: j.MaxTokens, Endpoint: j.Endpoint, Replay: j.Replay, HTTPEndpoint: j.HTTPEndpoint, APIKey: j.APIKey, Weight: j.Weight,
			Role: role, KeepRole: j.Role == ""})
	case OpUnregister:
		return ch.Unregister(worker)
	case OpUnregisterRank:
		var j rankJSON
		if err := json.Unmarshal(data, &j); err != nil {
			return &router.FieldError{Field: "dp_rank", Err: router.ErrInvalid, Msg: err.Error()}
		}
		return ch.UnregisterRank(worker, j.Rank)
	case OpEvents:
		if err := wire.DecodeEventBatch(data, &c.batch); err != nil {
			return err
		}
		if c.batch.Worker != worker {
			return &router.FieldError{Field: "worker_id", Err: router.ErrInvalid, Msg: "the batch's worker is not its subject's"}
		}
		dst := c.oc[:0]
		if w != nil {
			dst = w.oc
		}
		oc, err := ch.ApplyEvents(&c.batch, dst)
		if w != nil {
			w.oc = oc
		} else {
			c.oc = oc[:0]
		}
		if err == nil {
			c.events.Add(int64(len(c.batch.Events)))
		}
		return err
	}
	return &router.FieldError{Field: HeaderOp, Err: router.ErrInvalid, Msg: fmt.Sprintf("unknown change %q", op)}
}
