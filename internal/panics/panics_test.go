package panics

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestLog: the record holds the message, the caller's attributes, the panic value and the
// stack of the goroutine that recovered it.
func TestLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	func() {
		defer func() {
			if p := recover(); p != nil {
				Log(log, "recovered", p, "subject", "kvr.x")
			}
		}()
		panic("boom")
	}()
	out := buf.String()
	for _, want := range []string{"level=ERROR", "msg=recovered", "subject=kvr.x", "panic=boom", "TestLog"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
}
