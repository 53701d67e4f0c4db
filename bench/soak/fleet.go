package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/client"
	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// rank is one data-parallel rank of a simulated worker: the blocks it holds, oldest first, and
// the id of its next event.
type rank struct {
	next uint64
	held map[uint64]bool
	fifo []uint64
}

// simWorker is one worker of the bounded fleet. Workers with an even index publish their
// events to the NATS stream, the others post them to /v1/events (binary and JSON in turn).
type simWorker struct {
	id       uint64
	model    int
	nats     bool
	present  bool
	ranks    []rank
	jsonTurn bool
	http     string // the http_endpoint it registers with; "" for none
}

// stored is a route's outcome handed to the fleet: the chosen worker rank now computes the
// prompt, and its engine will tell of the blocks.
type stored struct {
	worker uint64
	rank   uint32
	p      prompt
}

// fleet drives the workers from one goroutine, so that each worker's registration, events and
// removal reach the daemon in the order it made them.
type fleet struct {
	cfg     Config
	c       *client.Client
	hc      *fasthttp.HostClient
	pub     *ingest.Publisher
	workers []*simWorker
	byID    map[uint64]*simWorker
	absent  []*simWorker // unregistered, oldest first
	routed  chan stored
	rng     *rand.Rand
	n       *counters
	buf     []byte
	batch   wire.EventBatch
	lastID  uint64 // the highest worker id given out
}

func newFleet(cfg Config, c *client.Client, hc *fasthttp.HostClient, pub *ingest.Publisher, n *counters) *fleet {
	f := &fleet{cfg: cfg, c: c, hc: hc, pub: pub, byID: map[uint64]*simWorker{},
		routed: make(chan stored, 256), rng: rand.New(rand.NewPCG(1, 2)), n: n}
	for m := range cfg.Models {
		for i := range cfg.Workers {
			w := &simWorker{id: uint64(m*1000 + i + 1), model: m, nats: i%2 == 0}
			nr := 1
			if i%4 == 3 {
				nr = 2
			}
			w.ranks = make([]rank, nr)
			f.workers = append(f.workers, w)
			f.byID[w.id] = w
			f.lastID = max(f.lastID, w.id)
		}
	}
	return f
}

func modelName(m int) string { return fmt.Sprintf("soak-%d", m) }

// register registers w with fresh ranks: a worker that comes back starts its event ids anew,
// as a restarted engine does.
func (f *fleet) register(w *simWorker) error {
	ranks := make([]uint32, len(w.ranks))
	for r := range w.ranks {
		ranks[r] = uint32(r)
		w.ranks[r] = rank{next: 1, held: map[uint64]bool{}}
	}
	reg := client.Worker{ID: w.id, Model: modelName(w.model), BlockSize: blockSize, Ranks: ranks,
		Capacity: int64(f.cfg.Capacity), MaxTokens: 8192}
	var err error
	if w.http == "" {
		err = f.c.Register(reg)
	} else {
		// client.Worker has no http_endpoint: the registration as /v1/workers reads it.
		var body []byte
		body, err = json.Marshal(struct {
			client.Worker
			HTTP string `json:"http_endpoint"`
		}{reg, w.http})
		if err == nil {
			err = post(f.hc, "/v1/workers", body, fasthttp.StatusCreated)
		}
	}
	if f.n.count(&f.n.registers, err) == nil {
		w.present = true
	}
	return err
}

func (f *fleet) unregister(w *simWorker) {
	if f.n.count(&f.n.unregisters, f.c.Unregister(w.id)) == nil {
		w.present = false
		f.absent = append(f.absent, w)
	}
}

// run registers every worker, then at cfg.Batches per second sends one event batch, and every
// cfg.Churn takes a worker away or brings one back, every two seconds each worker present
// reports its load; until ctx ends.
func (f *fleet) run(ctx context.Context) error {
	for _, w := range f.workers {
		if err := f.register(w); err != nil {
			return fmt.Errorf("soak: register worker %d: %w", w.id, err)
		}
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / f.cfg.Batches))
	defer tick.Stop()
	lastChurn, lastReport := time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			if now.Sub(lastChurn) >= f.cfg.Churn {
				lastChurn = now
				f.churn()
			}
			if now.Sub(lastReport) >= 2*time.Second {
				lastReport = now
				f.report()
			}
			f.events()
		}
	}
}

// churn keeps about a quarter of the workers away: below that it unregisters a random worker
// present, at it it brings back the one away longest.
func (f *fleet) churn() {
	if len(f.absent) < len(f.workers)/4 {
		var present []*simWorker
		for _, w := range f.workers {
			if w.present {
				present = append(present, w)
			}
		}
		f.unregister(present[f.rng.IntN(len(present))])
		return
	}
	w := f.absent[0]
	if f.cfg.FreshIDs {
		delete(f.byID, w.id)
		f.lastID++
		w.id = f.lastID
		f.byID[w.id] = w
	}
	if f.register(w) == nil {
		f.absent = f.absent[1:]
	}
}

func (f *fleet) report() {
	for _, w := range f.workers {
		if !w.present {
			continue
		}
		for r := range w.ranks {
			active := int64(len(w.ranks[r].fifo))
			err := f.pub.Report(&router.LoadReport{Worker: w.id, Rank: uint32(r), Model: modelName(w.model),
				ActiveBlocks: active / 4, KVUsage: float64(active) / float64(f.cfg.Capacity), MaxBatchedTokens: 8192})
			f.n.count(&f.n.reports, err)
		}
	}
}

// events sends one batch: the blocks of a routed prompt its worker does not hold yet, or of a
// random prompt on a random worker when no route is waiting, with the removals that keep the
// rank within its capacity; one batch in 200 clears the rank instead.
func (f *fleet) events() {
	var s stored
	var w *simWorker
	select {
	case s = <-f.routed:
		w = f.byID[s.worker]
		if w == nil || !w.present || int(s.rank) >= len(w.ranks) {
			return
		}
	default:
		w = f.workers[f.rng.IntN(len(f.workers))]
		if !w.present {
			return
		}
		s = stored{worker: w.id, rank: uint32(f.rng.IntN(len(w.ranks))),
			p: prompt{model: w.model, doc: f.rng.IntN(f.cfg.Docs), question: f.rng.IntN(f.cfg.Questions)}}
	}
	rk := &w.ranks[s.rank]
	f.batch.Worker, f.batch.Model, f.batch.Events = w.id, modelName(w.model), f.batch.Events[:0]
	if f.rng.IntN(200) == 0 {
		f.batch.Events = append(f.batch.Events, kvevent.Event{Kind: kvevent.Cleared, ID: rk.next, Rank: s.rank})
		rk.next++
		clear(rk.held)
		rk.fifo = rk.fifo[:0]
	} else {
		first := 0
		for first < promptBlocks && rk.held[s.p.blockHash(first)] {
			first++
		}
		if first == promptBlocks {
			return
		}
		ev := kvevent.Event{Kind: kvevent.Stored, ID: rk.next, Rank: s.rank, BlockSize: blockSize}
		if first > 0 {
			ev.Parent, ev.HasParent = s.p.blockHash(first-1), true
		}
		toks := s.p.tokens(nil)
		for i := first; i < promptBlocks; i++ {
			h := s.p.blockHash(i)
			ev.Hashes = append(ev.Hashes, h)
			if !rk.held[h] {
				rk.held[h] = true
				rk.fifo = append(rk.fifo, h)
			}
		}
		ev.Tokens = toks[first*blockSize : promptBlocks*blockSize]
		rk.next++
		f.batch.Events = append(f.batch.Events, ev)
		if over := len(rk.fifo) - f.cfg.Capacity; over > 0 {
			rm := kvevent.Event{Kind: kvevent.Removed, ID: rk.next, Rank: s.rank, Hashes: append([]uint64(nil), rk.fifo[:over]...)}
			rk.next++
			for _, h := range rm.Hashes {
				delete(rk.held, h)
			}
			rk.fifo = append(rk.fifo[:0], rk.fifo[over:]...)
			f.batch.Events = append(f.batch.Events, rm)
		}
	}
	switch {
	case w.nats:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := f.pub.Batch(ctx, &f.batch)
		cancel()
		f.n.count(&f.n.natsBatches, err)
	case w.jsonTurn:
		w.jsonTurn = false
		f.n.count(&f.n.jsonBatches, f.postJSON(&f.batch))
	default:
		w.jsonTurn = true
		res, err := f.c.Events(&f.batch)
		if err == nil && res.OK != res.Events {
			err = fmt.Errorf("events of worker %d: %d of %d applied: %+v", w.id, res.OK, res.Events, res.Outcomes)
		}
		f.n.count(&f.n.binaryBatches, err)
	}
}

// postJSON posts b to /v1/events as JSON.
func (f *fleet) postJSON(b *wire.EventBatch) error {
	type ev struct {
		Type      string   `json:"type"`
		EventID   uint64   `json:"event_id"`
		Rank      uint32   `json:"dp_rank"`
		Hashes    []uint64 `json:"block_hashes,omitempty"`
		Parent    *uint64  `json:"parent_hash,omitempty"`
		Tokens    []uint32 `json:"token_ids,omitempty"`
		BlockSize int      `json:"block_size,omitempty"`
	}
	body := struct {
		Worker uint64 `json:"worker_id"`
		Model  string `json:"model"`
		Events []ev   `json:"events"`
	}{Worker: b.Worker, Model: b.Model}
	for _, e := range b.Events {
		j := ev{EventID: e.ID, Rank: e.Rank, Hashes: e.Hashes, Tokens: e.Tokens, BlockSize: e.BlockSize}
		switch e.Kind {
		case kvevent.Stored:
			j.Type = "stored"
			if e.HasParent {
				j.Parent = &e.Parent
			}
		case kvevent.Removed:
			j.Type = "removed"
		default:
			j.Type = "cleared"
		}
		body.Events = append(body.Events, j)
	}
	var err error
	if f.buf, err = json.Marshal(body); err != nil {
		return err
	}
	return post(f.hc, "/v1/events", f.buf, fasthttp.StatusOK)
}

// counters count the soak's calls by kind, and their failures.
type counters struct {
	routesBinary, routesJSON, matches           counter
	prefillDone, complete, expired, badRequests counter
	registers, unregisters, reports             counter
	natsBatches, binaryBatches, jsonBatches     counter
	firstErrs                                   atomic.Int32
	errLog                                      func(string)
}

type counter struct{ ok, failed atomic.Int64 }

// count counts err in c and logs the first failures; it returns err.
func (n *counters) count(c *counter, err error) error {
	if err == nil {
		c.ok.Add(1)
		return nil
	}
	c.failed.Add(1)
	if n.firstErrs.Add(1) <= 10 && n.errLog != nil {
		n.errLog(err.Error())
	}
	return err
}
