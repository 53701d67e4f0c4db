package fleet

import (
	"container/heap"

	"github.com/kvrouterd/kvrouterd/bench/trace"
)

// sessions is the closed loop of Config.ClosedLoop: for each request, the next turn of its
// session and the think time before it, and the later turns released so far, by arrival. Owned
// by Run's goroutine.
type sessions struct {
	succ  []int32 // the session's next request, -1 for none
	think []int64 // a later turn's gap after its previous turn, in the trace
	later int     // requests that are a later turn
	isSec []bool  // request i is a later turn
	ready arrivals
}

func newSessions(reqs []trace.Request) *sessions {
	s := &sessions{succ: make([]int32, len(reqs)), think: make([]int64, len(reqs)), isSec: make([]bool, len(reqs))}
	last := map[uint64]int32{}
	for i := range reqs {
		s.succ[i] = -1
		sid := reqs[i].Session
		if sid == 0 {
			continue
		}
		if p, ok := last[sid]; ok {
			s.succ[p] = int32(i)
			s.think[i] = int64(reqs[i].At - reqs[p].At)
			s.isSec[i] = true
			s.later++
		}
		last[sid] = int32(i)
	}
	return s
}

// isLater reports whether request i arrives closed-loop.
func (s *sessions) isLater(i int) bool { return s.isSec[i] }

// ended releases the turn after request i, which ended at now.
func (s *sessions) ended(i int, now int64) {
	if n := s.succ[i]; n >= 0 {
		s.succ[i] = -1 // a request ends once; guard all the same
		heap.Push(&s.ready, arrivalAt{at: now + s.think[n], i: int(n)})
	}
}

// peek is the released turn that arrives first.
func (s *sessions) peek() (i int, at int64, ok bool) {
	if len(s.ready) == 0 {
		return 0, 0, false
	}
	return s.ready[0].i, s.ready[0].at, true
}

// pop takes the turn peek returned.
func (s *sessions) pop() { heap.Pop(&s.ready) }

type arrivalAt struct {
	at int64
	i  int
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
	*h = old[:len(old)-1]
	return a
}
