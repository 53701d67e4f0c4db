package daemon

import (
	"fmt"

	"github.com/kvrouterd/kvrouterd/ingest"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/server"
)

// statePaused is the state /workers reports for a rank whose subscription a test paused.
const statePaused = server.StatePaused

// rankKey is one rank of one worker.
type rankKey struct {
	worker uint64
	rank   uint32
}

// listenerControl serves Dynamo's listener-control test endpoints (--kv-indexer-test-endpoints)
// over the engine subscriptions of w: a pause ends a registered rank's subscription and keeps
// its blocks; a resume subscribes again, and the new subscription takes the rank's stream up
// after the last batch the index holds, as after a restart: the gap is replayed from the
// rank's replay socket, or the rank cleared. Its methods are safe for concurrent use.
type listenerControl struct {
	r *router.Router
	w *engineWatcher
}

var _ server.ListenerControl = (*listenerControl)(nil)

// rank finds worker's rank among the registered ones and names, in Dynamo's words, what is
// missing: the instance, the rank, or a socket of the rank's own.
func (lc *listenerControl) rank(worker uint64, rank uint32) (router.WorkerInfo, *ingest.Engines, error) {
	found := false
	for _, wi := range lc.r.Workers() {
		if wi.ID != worker {
			continue
		}
		found = true
		if wi.Rank != rank {
			continue
		}
		e := lc.w.engines()
		if wi.Endpoint == "" || e == nil {
			return wi, nil, &server.ListenerError{Field: "dp_rank",
				Msg: fmt.Sprintf("instance %d dp_rank %d has no ZMQ listener to control: its events come through the event stream or HTTP", worker, rank)}
		}
		return wi, e, nil
	}
	if !found {
		return router.WorkerInfo{}, nil, &server.ListenerError{Field: "instance_id", Msg: fmt.Sprintf("instance %d not found", worker)}
	}
	return router.WorkerInfo{}, nil, &server.ListenerError{Field: "dp_rank", Msg: fmt.Sprintf("instance %d dp_rank %d not found", worker, rank)}
}

// dynStatus is a rank's state in Dynamo's listener vocabulary, for refusals.
func dynStatus(st router.SourceState) string {
	switch st {
	case router.StateConnecting:
		return "pending"
	case router.StateGone:
		return "failed"
	case statePaused:
		return "paused"
	}
	return "active"
}

func (lc *listenerControl) PauseListener(worker uint64, rank uint32) error {
	wi, e, err := lc.rank(worker, rank)
	if err != nil {
		return err
	}
	if st := wi.State; st == statePaused || st == router.StateGone {
		return &server.ListenerError{Conflict: true, Field: "dp_rank",
			Msg: fmt.Sprintf("instance %d dp_rank %d cannot be paused from status %s", worker, rank, dynStatus(st))}
	}
	lc.w.pause(rankKey{worker, rank})
	e.RemoveRank(worker, rank)
	if _, _, ok := e.RankState(worker, rank); ok {
		lc.w.unpause(rankKey{worker, rank})
		return &server.ListenerError{Conflict: true, Field: "dp_rank",
			Msg: fmt.Sprintf("instance %d dp_rank %d is read by a --zmq source of several ranks; it cannot be paused alone", worker, rank)}
	}
	return nil
}

func (lc *listenerControl) ResumeListener(worker uint64, rank uint32) error {
	wi, e, err := lc.rank(worker, rank)
	if err != nil {
		return err
	}
	if st := wi.State; st != statePaused && st != router.StateGone {
		return &server.ListenerError{Conflict: true, Field: "dp_rank",
			Msg: fmt.Sprintf("instance %d dp_rank %d cannot be resumed from status %s", worker, rank, dynStatus(st))}
	}
	lc.w.unpause(rankKey{worker, rank})
	return e.Add(engineSource(worker, wi.Model, router.RankEndpoint{Rank: rank, Endpoint: wi.Endpoint, Replay: wi.Replay}))
}
