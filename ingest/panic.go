package ingest

import (
	"log/slog"
	"runtime/debug"
)

// logPanic logs a panic recovered on an ingest goroutine, with its stack; the caller counts it
// and restarts what it ran. Ingest goroutines recover rather than let a bad message from a peer
// end the process.
func logPanic(log *slog.Logger, msg string, p any, args ...any) {
	log.Error(msg, append(args, "panic", p, "stack", string(debug.Stack()))...)
}
