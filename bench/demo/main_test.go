package main

import (
	"slices"
	"testing"
	"time"

	"github.com/kvrouterd/kvrouterd/bench/trace"
)

// TestShuffleTies: requests keep their arrival time's group, in another order within it, and
// arrive in the order they are given.
func TestShuffleTies(t *testing.T) {
	var reqs []trace.Request
	for i := range 40 {
		reqs = append(reqs, trace.Request{At: time.Duration(i/10) * time.Second, Output: i})
	}
	got := shuffleTies(reqs, 1)
	moved := false
	for i, r := range got {
		if r.At/time.Second != time.Duration(r.Output/10) {
			t.Fatalf("request %d left its arrival group: at %v", r.Output, r.At)
		}
		if i > 0 && r.At <= got[i-1].At {
			t.Fatalf("arrivals out of order at %d", i)
		}
		moved = moved || r.Output != i
	}
	if !moved {
		t.Fatal("no request changed place")
	}
	if again := shuffleTies(reqs, 1); !slices.EqualFunc(got, again, func(a, b trace.Request) bool { return a.Output == b.Output && a.At == b.At }) {
		t.Fatal("not deterministic for a seed")
	}
}
