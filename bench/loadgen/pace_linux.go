package loadgen

import (
	"encoding/binary"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// timerfd is a periodic Linux timer file, read through the runtime's poller: a read blocks the
// goroutine, not its thread, and returns as soon as the timer fires.
type timerfd struct {
	f   *os.File
	buf [8]byte
}

// newPeriodic returns a timerfd that first fires at start (at once if start is past) and then
// every period.
func newPeriodic(start time.Time, period time.Duration) (periodic, error) {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, 1 /* CLOCK_MONOTONIC */, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil, errno
	}
	first := max(time.Until(start), time.Nanosecond)
	spec := struct{ interval, value syscall.Timespec }{
		syscall.NsecToTimespec(int64(period)), syscall.NsecToTimespec(int64(first)),
	}
	if _, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); errno != 0 {
		syscall.Close(int(fd))
		return nil, errno
	}
	return &timerfd{f: os.NewFile(fd, "timerfd")}, nil
}

func (t *timerfd) wait() (int64, error) {
	if _, err := t.f.Read(t.buf[:]); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(t.buf[:])), nil
}

func (t *timerfd) stop() { t.f.Close() }
