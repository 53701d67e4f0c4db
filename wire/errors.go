package wire

import (
	"errors"
	"strconv"
	"strings"
)

// The sentinels every decode and Validate error wraps; test with errors.Is.
var (
	// ErrTruncated: the message ends before a field does, or a count announces more elements
	// than the remaining bytes can hold.
	ErrTruncated = errors.New("wire: truncated")
	// ErrMagic: the message does not start with "KVRW".
	ErrMagic = errors.New("wire: bad magic")
	// ErrVersion: the header's version is not one this package reads.
	ErrVersion = errors.New("wire: unsupported version")
	// ErrType: the header's message type is not the one the decoder reads.
	ErrType = errors.New("wire: wrong message type")
	// ErrTrailing: bytes follow the last field of the body, or the header's body length.
	ErrTrailing = errors.New("wire: trailing bytes")
	// ErrInvalid: a value out of range: unknown flag bits, mode, kind or tier; a nonzero
	// reserved byte; a value present although its flag is clear; inconsistent counts.
	ErrInvalid = errors.New("wire: invalid value")
	// ErrTooLong: a string over MaxString bytes, or more than MaxEvents events.
	ErrTooLong = errors.New("wire: too long")
)

// Error is what every decode and Validate error is: where the message went wrong and how. It is
// immutable once returned and safe to share between goroutines.
type Error struct {
	Msg    string // message kind: "route request", "route response", "event batch", "message"
	Field  string // snake_case field name as in SPEC.md, with the event index: "events[3].kind"
	Offset int    // byte offset of the field from the start of the message; -1 from Validate
	Err    error  // one of the sentinels
	Detail string // what was found, e.g. "need 70 bytes, have 49"
}

// Error reads like
//
//	wire: route request: field "model" at offset 59: truncated: need 70 bytes, have 49
func (e *Error) Error() string {
	var sb strings.Builder
	sb.WriteString("wire: ")
	sb.WriteString(e.Msg)
	sb.WriteString(": field ")
	sb.WriteString(strconv.Quote(e.Field))
	if e.Offset >= 0 {
		sb.WriteString(" at offset ")
		sb.WriteString(strconv.Itoa(e.Offset))
	}
	if e.Err != nil {
		sb.WriteString(": ")
		sb.WriteString(strings.TrimPrefix(e.Err.Error(), "wire: "))
	}
	if e.Detail != "" {
		sb.WriteString(": ")
		sb.WriteString(e.Detail)
	}
	return sb.String()
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

// invalid builds a Validate error: no offset, since nothing has been encoded.
func invalid(msg, field string, err error, detail string) error {
	return &Error{Msg: msg, Field: field, Offset: -1, Err: err, Detail: detail}
}
