package daemon

import (
	"time"

	"github.com/kvrouterd/kvrouterd/router"
)

// RankState tells the router the state of a rank an engine subscription reads (see
// router.SourceStates): none before the subscriptions are set up, and none in approximate mode;
// paused for a rank whose subscription a test paused (listeners.go).
func (w *engineWatcher) RankState(worker uint64, rank uint32) (router.SourceState, time.Time, bool) {
	if w.isPaused(rankKey{worker, rank}) {
		return statePaused, time.Time{}, true
	}
	if e := w.engines(); e != nil {
		return e.RankState(worker, rank)
	}
	return "", time.Time{}, false
}
