package snapshot

import (
	"errors"
	"fmt"
	"strings"
)

// The sentinels every error about data wraps; test with errors.Is.
var (
	// ErrNone: the store holds no snapshot that verifies (Latest, Before).
	ErrNone = errors.New("snapshot: no valid snapshot")
	// ErrClosed: the Store or Snapshot was closed.
	ErrClosed = errors.New("snapshot: closed")
	// ErrReadOnly: Write or Receive on a store opened with Config.ReadOnly.
	ErrReadOnly = errors.New("snapshot: store opened read-only")
	// ErrCorrupt: stored or received bytes fail a checksum, do not decompress to the length the
	// manifest says, or a chunk is missing.
	ErrCorrupt = errors.New("snapshot: corrupt")
	// ErrFormat: a manifest, stream or store layout this package does not read: bad magic,
	// unsupported version, nonzero flags, a value out of range, inconsistent totals, trailing
	// bytes.
	ErrFormat = errors.New("snapshot: bad format")
	// ErrTruncated: a manifest or stream ends before its lengths say it does.
	ErrTruncated = errors.New("snapshot: truncated")
	// ErrTooLarge: Write was given a chunk over MaxChunk, more than MaxChunks chunks, or info
	// over MaxInfo.
	ErrTooLarge = errors.New("snapshot: too large")
)

// Error is what errors about bad data are: where the data went wrong and how. It is immutable
// once returned and safe to share between goroutines.
type Error struct {
	Where  string // e.g. `snapshot 7 chunk 3`, `stream manifest field "chunk_count" at offset 48`
	Err    error  // one of the sentinels
	Detail string // what was found, e.g. "checksum 0x…, manifest says 0x…"
}

// Error reads like
//
//	snapshot: snapshot 7 chunk 3: corrupt: checksum 0x1f…, manifest says 0x2c…
func (e *Error) Error() string {
	var sb strings.Builder
	sb.WriteString("snapshot: ")
	sb.WriteString(e.Where)
	sb.WriteString(": ")
	sb.WriteString(strings.TrimPrefix(e.Err.Error(), "snapshot: "))
	if e.Detail != "" {
		sb.WriteString(": ")
		sb.WriteString(e.Detail)
	}
	return sb.String()
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(where string, sentinel error, format string, args ...any) *Error {
	return &Error{Where: where, Err: sentinel, Detail: fmt.Sprintf(format, args...)}
}

// within puts err in context: an *Error gets prefix before its Where (it is fresh, so this is
// safe), anything else is wrapped.
func within(prefix string, err error) error {
	if e, ok := err.(*Error); ok {
		if e.Where == "" {
			e.Where = prefix
		} else {
			e.Where = prefix + " " + e.Where
		}
		return e
	}
	return fmt.Errorf("snapshot: %s: %w", prefix, err)
}
