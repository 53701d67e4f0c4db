package server

import (
	"time"

	"github.com/kvrouterd/kvrouterd/router"
)

// Dynamo's standalone indexer reports each registered rank's listener as pending (not
// connected yet), active, paused (its test endpoint stopped it) or failed, and each instance by
// its worst rank: failed, then pending, then active, paused only when every rank is.
// kvrouterd's /workers keeps those values in "status" and adds its own per rank, so that
// Dynamo's clients read what they know and ignore the rest.
const (
	dynPending = "pending"
	dynActive  = "active"
	dynPaused  = "paused"
	dynFailed  = "failed"
)

// StatePaused is the state of a rank whose subscription Dynamo's listener-control test
// endpoint paused; whoever pauses it reports it through router.SourceStates.
const StatePaused router.SourceState = dynPaused

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
	case StatePaused:
		l.Status = dynPaused
	}
	return l
}

// dynWorse returns the status of an instance whose ranks so far are a ("" for none) and one
// more is b.
func dynWorse(a, b string) string {
	rank := func(s string) int {
		switch s {
		case dynFailed:
			return 3
		case dynPending:
			return 2
		case dynActive:
			return 1
		case dynPaused:
			return 0
		}
		return -1
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}
