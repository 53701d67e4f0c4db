package server

import (
	"encoding/json"
	"testing"
)

// TestAppendErrorIsJSON: an error quoting what a client sent is valid JSON whatever the bytes.
func TestAppendErrorIsJSON(t *testing.T) {
	f := func(msg, field string) {
		t.Helper()
		var e struct{ Error, Field string }
		if err := json.Unmarshal(appendError(nil, msg, field, 3), &e); err != nil {
			t.Fatalf("appendError(%q, %q): %v", msg, field, err)
		}
	}
	f("cannot parse `\xec`", "id")
	f("bell \a, tab \t, nul \x00", "\xff")
	f(`"quoted" <html>`, "")
}
