package server

import (
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"
)

// Dynamo's standalone indexer mounts two test endpoints when DYN_KV_INDEXER_TEST_ENDPOINTS is
// set: POST /test/pause_listener and /test/resume_listener, with {instance_id, dp_rank}, stop
// and restart the subscription to one registered rank's KV-event socket, so that an end-to-end
// test can open a gap in the rank's sequence and watch it being repaired. kvrouterd serves them
// when Config.Listeners is set (the daemon's --kv-indexer-test-endpoints, or Dynamo's variable);
// otherwise they are unknown paths, as they are on a Dynamo indexer started without the switch.

// ListenerControl stops and restarts the KV-event subscription of one worker rank. Its methods
// are safe for concurrent use. A refusal is a *ListenerError; any other error is the server's.
type ListenerControl interface {
	// PauseListener stops reading the rank's socket; the rank's blocks stay in the index.
	PauseListener(worker uint64, rank uint32) error
	// ResumeListener subscribes to the rank's socket again; what the rank published meanwhile
	// is replayed from its replay socket, or the rank is cleared, as after any gap.
	ResumeListener(worker uint64, rank uint32) error
}

// ListenerError is a ListenerControl's refusal, in Dynamo's words: no such listener (404), or a
// listener whose state forbids the change (409).
type ListenerError struct {
	Conflict bool   // the listener's state forbids the change: 409; else none such: 404
	Field    string // the request's field at fault: instance_id or dp_rank
	Msg      string // Dynamo's message, such as "instance 7 dp_rank 0 cannot be paused from status paused"
}

func (e *ListenerError) Error() string { return e.Msg }

// dynListenerControl is the body of both endpoints; dp_rank defaults to 0, as Dynamo's does.
type dynListenerControl struct {
	Instance *uint64 `json:"instance_id"`
	Rank     *uint32 `json:"dp_rank"`
}

// testListener answers /test/pause_listener and /test/resume_listener (path): 200
// {"status":"ok"}, or Dynamo's refusal with its status and {"error": msg}.
func (s *Server) testListener(ctx *fasthttp.RequestCtx, path string) {
	lc := s.cfg.Listeners
	if lc == nil {
		s.reject(ctx, epOther, fasthttp.StatusNotFound, "not_found", "path", -1,
			"no endpoint "+strconv.Quote(path)+" (Dynamo's test endpoints are mounted by --kv-indexer-test-endpoints)")
		return
	}
	if !s.method(ctx, epDynamo, ctx.Method(), mPost) || !s.control(ctx) {
		return
	}
	var j dynListenerControl
	if !s.dynamoJSON(ctx, path, &j, "instance_id") {
		return
	}
	rank := uint32(0)
	if j.Rank != nil {
		rank = *j.Rank
	}
	var err error
	if path == "/test/pause_listener" {
		err = lc.PauseListener(*j.Instance, rank)
	} else {
		err = lc.ResumeListener(*j.Instance, rank)
	}
	var le *ListenerError
	switch {
	case err == nil:
		s.writeJSON(ctx, map[string]string{"status": "ok"})
	case errors.As(err, &le) && le.Conflict:
		s.dynamoError(ctx, fasthttp.StatusConflict, "conflict", le.Field, le.Msg)
	case errors.As(err, &le):
		s.dynamoError(ctx, fasthttp.StatusNotFound, "unknown_worker", le.Field, le.Msg)
	default:
		s.fail(ctx, epDynamo, err)
	}
}
