package loadgen

import "time"

// A periodic wakes its caller once a period from a start time on, telling how many periods have
// passed since the last wake-up. The open loop's connections each wait on one for their
// schedule. Go's timers would wake a sleeping goroutine up to a millisecond late when the process
// has nothing else to run (the runtime's poller waits in whole milliseconds): the connections
// woke together and sent in bursts, and the latencies measured below saturation were the
// bursts'. The Linux periodic is a timerfd read through the runtime's poller, which wakes within
// microseconds; elsewhere it sleeps on Go's timers, with their lateness.
type periodic interface {
	wait() (int64, error)
	stop()
}

// newTicker returns the periodic of this system, or the sleeper if it cannot be made.
func newTicker(start time.Time, period time.Duration) periodic {
	period = max(period, time.Microsecond)
	if t, err := newPeriodic(start, period); err == nil {
		return t
	}
	return newSleeper(start, period)
}

// sleeper is the periodic of systems without timerfd: Go's timers, with their lateness.
type sleeper struct {
	next   time.Time
	period time.Duration
}

func newSleeper(start time.Time, period time.Duration) *sleeper {
	return &sleeper{next: start, period: period}
}

func (s *sleeper) wait() (int64, error) {
	if d := time.Until(s.next); d > 0 {
		time.Sleep(d)
	}
	n := int64(time.Since(s.next)/s.period) + 1
	s.next = s.next.Add(time.Duration(n) * s.period)
	return n, nil
}

func (s *sleeper) stop() {}
