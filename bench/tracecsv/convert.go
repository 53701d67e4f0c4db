package tracecsv

import (
	"fmt"
	"strconv"
)

// MaxTokens bounds a request's token counts, far above any context window.
const MaxTokens = 1 << 24

// Convert reads r's header, writes w's, and then calls row once for each of r's rows, which it
// reads from r.Field and writes with w.WriteRequest, or drops. It stops at the first error,
// having written the rows before it.
func Convert(r *Reader, w *Writer, row func() error) error {
	if err := r.ReadHeader(); err != nil {
		return err
	}
	if err := w.WriteHeader(); err != nil {
		return err
	}
	for r.Next() {
		if err := row(); err != nil {
			return err
		}
	}
	return r.Err()
}

// ParseTokens reads a token count, 0 to MaxTokens.
func ParseTokens(s string) (int, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q: want a whole number of tokens", s)
	case v < 0 || v > MaxTokens:
		return 0, fmt.Errorf("%d: want 0 to %d tokens", v, MaxTokens)
	}
	return int(v), nil
}
