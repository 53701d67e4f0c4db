package server

import (
	"time"

	"github.com/kvrouterd/kvrouterd/router"
)

// Dynamo's standalone indexer reports each registered rank's listener as pending (not
// connected yet), active, paused or failed, and each instance by its worst rank: failed, then
// pending, then active. kvrouterd's /workers keeps those values in "status" and adds its own
// per rank, so that Dynamo's clients read what they know and ignore the rest.
const (
	dynPending = "pending"
	dynActive  = "active"
	dynFailed  = "failed"
)

// dynListener is one rank in /workers: Dynamo's listener fields, then kvrouterd's state and
// the time of the rank's last event batch.
type dynListener struct {
	Endpoint  string             `json:"endpoint"`
	Status    string             `json:"status"`
	State     router.SourceState `json:"state,omitempty"`
	LastEvent time.Time          `json:"last_event,omitzero"`
}

func newDynListener(w *router.WorkerInfo) *dynListener {
	l := &dynListener{Endpoint: w.Endpoint, Status: dynActive, State: w.State, LastEvent: w.LastEventAt}
	switch w.State {
	case router.StateConnecting:
		l.Status = dynPending
	case router.StateGone:
		l.Status = dynFailed // no subscription reads the endpoint it registered
	}
	return l
}

// dynWorse returns the status of an instance whose ranks so far are a and one more is b.
func dynWorse(a, b string) string {
	rank := func(s string) int {
		switch s {
		case dynFailed:
			return 2
		case dynPending:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}
