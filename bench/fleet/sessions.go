package fleet

import (
	"container/heap"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/trace"
)

// sessions is the closed loop of Config.ClosedLoop, learnt as the workload is read: for each
// session, when its last turn read arrives in the trace and whether a turn of it is under way;
// the later turns read while one is (parked, in order); and the later turns released, by
// arrival. A later turn is released when its session's previous turn ends, after the gap
// between the two in the trace. Owned by the run's goroutine.
type sessions struct {
	byID    map[uint64]*sessionState
	ready   arrivals
	later   int // requests that were a later turn
	waiting int // later turns read and not yet arrived (parked or released)
}

type sessionState struct {
	lastAt  time.Duration // the trace arrival of its last turn read
	busy    bool          // a turn of it is read and not over
	endedAt int64         // when its last turn ended (busy false)
	parked  []arrivalAt   // later turns read while busy, in trace order; at is the think time
}

func newSessions() *sessions { return &sessions{byID: map[uint64]*sessionState{}} }

// add takes request i, just read, of session r.Session: a first turn, which arrives on its own
// (false), or a later turn (true), which add parks until its session's previous turn ends or,
// when that has ended, releases at once.
func (s *sessions) add(i int, r trace.Request) bool {
	st := s.byID[r.Session]
	if st == nil {
		s.byID[r.Session] = &sessionState{lastAt: r.At, busy: true}
		return false
	}
	think := int64(r.At - st.lastAt)
	st.lastAt = r.At
	s.later++
	s.waiting++
	turn := arrivalAt{at: think, i: i, req: r}
	if st.busy {
		st.parked = append(st.parked, turn)
		return true
	}
	st.busy = true
	turn.at += st.endedAt
	heap.Push(&s.ready, turn)
	return true
}

// ended releases the turn of session sid after the one that ended at now.
func (s *sessions) ended(sid uint64, now int64) {
	st := s.byID[sid]
	if len(st.parked) == 0 {
		st.busy, st.endedAt, st.parked = false, now, nil
		return
	}
	turn := st.parked[0]
	st.parked[0] = arrivalAt{}
	st.parked = st.parked[1:]
	turn.at += now
	heap.Push(&s.ready, turn)
}

// peek is the released turn that arrives first.
func (s *sessions) peek() (i int, at int64, ok bool) {
	if len(s.ready) == 0 {
		return 0, 0, false
	}
	return s.ready[0].i, s.ready[0].at, true
}

// pop takes the turn peek returned.
func (s *sessions) pop() trace.Request {
	s.waiting--
	return heap.Pop(&s.ready).(arrivalAt).req
}

// pending is the later turns read and not yet arrived; 0 for a nil s (open loop).
func (s *sessions) pending() int {
	if s == nil {
		return 0
	}
	return s.waiting
}

type arrivalAt struct {
	at  int64
	i   int
	req trace.Request
}

// arrivals is a min-heap by time, then trace order.
type arrivals []arrivalAt

func (h arrivals) Len() int { return len(h) }
func (h arrivals) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].i < h[j].i
}
func (h arrivals) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *arrivals) Push(x any)   { *h = append(*h, x.(arrivalAt)) }
func (h *arrivals) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = arrivalAt{}
	*h = old[:len(old)-1]
	return a
}
