// Package pause waits a while unless a context ends first. Its function is safe for concurrent
// use.
package pause

import (
	"context"
	"time"
)

// For waits d unless ctx ends first, and reports whether it waited the whole d.
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
