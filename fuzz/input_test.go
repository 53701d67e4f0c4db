package fuzz

import (
	"io"
	"log/slog"
)

// input hands out the fuzzer's bytes as small choices; once they run out every choice is 0, so
// any input, even an empty one, drives a complete run.
type input struct{ b []byte }

func (in *input) byte() byte {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return c
}

// n returns a choice in [0, n).
func (in *input) n(n int) int { return int(in.byte()) % n }

func (in *input) done() bool { return len(in.b) == 0 }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
