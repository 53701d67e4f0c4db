//go:build !linux

package loadgen

import (
	"errors"
	"time"
)

func newPeriodic(time.Time, time.Duration) (periodic, error) {
	return nil, errors.New("no timerfd")
}
