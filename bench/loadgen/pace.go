package loadgen

import "time"

// An alarm wakes its caller at the times of a schedule: first, then every period. The open loop's
// connections each wait on one. Go's timers would wake a sleeping goroutine up to a millisecond
// late when the process has nothing else to run (the runtime's poller waits in whole
// milliseconds): the connections woke together and sent in bursts, and the latencies measured
// below saturation were the bursts'. The Linux alarm is a periodic timerfd read through the
// runtime's poller, which wakes within microseconds and costs one read per wake-up; elsewhere it
// sleeps on Go's timers, with their lateness.
type alarm interface {
	// waitUntil returns once t, a time of the schedule, has come. Wake-ups a caller missed
	// while busy do not make it return early.
	waitUntil(t time.Time) error
	stop()
}

// newAlarm returns the alarm of this system, or a sleeper if it cannot be made.
func newAlarm(first time.Time, period time.Duration) alarm {
	if a, err := newTimerfd(first, period); err == nil {
		return a
	}
	return sleeper{}
}

// sleeper is the alarm of systems without timerfd: Go's timers, with their lateness.
type sleeper struct{}

func (sleeper) waitUntil(t time.Time) error {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
	return nil
}

func (sleeper) stop() {}
