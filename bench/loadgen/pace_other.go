//go:build !linux

package loadgen

import (
	"errors"
	"time"
)

func newTimerfd(time.Time, time.Duration) (alarm, error) { return nil, errors.New("no timerfd") }
