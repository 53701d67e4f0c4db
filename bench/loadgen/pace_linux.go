package loadgen

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// timerfd is a periodic Linux timer file, read through the runtime's poller: a read blocks the
// goroutine, not its thread, and returns as soon as the timer has fired.
type timerfd struct {
	f   *os.File
	buf [8]byte
}

// newTimerfd returns a timer that fires at first and then every period. It is armed relative to
// now, so it fires a moment after each scheduled time, never before.
func newTimerfd(first time.Time, period time.Duration) (alarm, error) {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, 1 /* CLOCK_MONOTONIC */, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil, errno
	}
	spec := struct{ interval, value syscall.Timespec }{
		syscall.NsecToTimespec(int64(max(period, time.Microsecond))),
		syscall.NsecToTimespec(int64(max(time.Until(first), time.Nanosecond))), // zero would disarm it
	}
	if _, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); errno != 0 {
		syscall.Close(int(fd))
		return nil, errno
	}
	return &timerfd{f: os.NewFile(fd, "timerfd")}, nil
}

// waitUntil reads the timer until t has come: a read returns at once for expirations that passed
// while the caller was busy, so one read may not be enough.
func (a *timerfd) waitUntil(t time.Time) error {
	for time.Now().Before(t) {
		if _, err := a.f.Read(a.buf[:]); err != nil {
			return err
		}
	}
	return nil
}

func (a *timerfd) stop() { a.f.Close() }
