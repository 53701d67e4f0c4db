// Package panics logs a panic recovered on a goroutine that handles what peers send (NATS
// message handlers, engine socket readers): those goroutines recover rather than let one bad
// message end the process, and log the panic with its stack so that the bug can be found. Log is
// safe for concurrent use.
package panics

import (
	"log/slog"
	"runtime/debug"
)

// Log logs p, recovered by the caller, at error level with msg, args and the stack of the
// calling goroutine. The caller counts it and restarts or skips what it ran.
func Log(log *slog.Logger, msg string, p any, args ...any) {
	log.Error(msg, append(args, "panic", p, "stack", string(debug.Stack()))...)
}
