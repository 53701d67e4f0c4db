package scoring

import (
	"fmt"
	"sync"
	"testing"
)

// TestTrackerGenerated follows one request through generation: an output block at each block
// boundary its prompt and output cross, the decay toward its expected length, and nothing left
// once it completes.
func TestTrackerGenerated(t *testing.T) {
	tr := NewTracker()
	w := mustRegister(t, tr, 1)
	blocks := func(want int64) {
		t.Helper()
		if got := w.ActiveBlocks(); got != want {
			t.Fatalf("active blocks %d, want %d", got, want)
		}
	}
	gen := func(id string, n int64, want int) {
		t.Helper()
		got, err := tr.Generated(id, n)
		if err != nil || got != want {
			t.Fatalf("Generated(%q, %d) = %d, %v; want %d blocks", id, n, got, err, want)
		}
	}
	// 40 prompt tokens in blocks of 16: 2 full blocks booked, ⌈40/16⌉ = 3 counted.
	if err := tr.BookOutput("a", w, []uint64{10, 20}, 40, 100, Output{ISL: 40, BlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	blocks(2)
	gen("a", 8, 0)  // ⌈48/16⌉ = 3: no boundary crossed
	gen("a", 9, 1)  // ⌈49/16⌉ = 4
	gen("a", 9, 0)  // the same count again
	gen("a", 41, 2) // ⌈81/16⌉ = 6: two boundaries in one report, two blocks
	blocks(5)
	if err := tr.Complete("a"); err != nil {
		t.Fatal(err)
	}
	blocks(0)

	// Without output tracking nothing is counted.
	if err := tr.Book("b", w, []uint64{10, 20}, 40, 100); err != nil {
		t.Fatal(err)
	}
	gen("b", 1000, 0)
	blocks(2)

	// With an expected length of 100 tokens: c shares block 10 with b and owns 30.
	if err := tr.BookOutput("c", w, []uint64{10, 30}, 40, 100, Output{ISL: 40, BlockSize: 16, Expected: 100}); err != nil {
		t.Fatal(err)
	}
	blocks(3)
	// n = 9: one output block; weight 1 − 9/100 = 0.91 on c's own blocks (30 and the output
	// block): 3 + 1 − 2 × 0.09 = 3.82, rounded 4.
	gen("c", 9, 1)
	blocks(4)
	// n = 60: ⌈100/16⌉ = 7, three more output blocks; weight 0.4 on 30 and 4 output blocks:
	// 3 + 4 − 5 × 0.6 = 4.
	gen("c", 60, 3)
	blocks(4)
	// n = 100 and beyond: weight 0; ⌈150/16⌉ = 10, three more: 3 + 7 − 8 = 2, b's two blocks.
	gen("c", 110, 3)
	blocks(2)
	if err := tr.Complete("c"); err != nil {
		t.Fatal(err)
	}
	blocks(2)
	if err := tr.Complete("b"); err != nil {
		t.Fatal(err)
	}
	blocks(0)
	if _, err := tr.Generated("c", 5); err != ErrUnknownRequest {
		t.Fatalf("Generated after completion: %v", err)
	}
}

// TestTrackerOutputBlock is the selection service's form: one block per call, the caller's
// decay fraction.
func TestTrackerOutputBlock(t *testing.T) {
	tr := NewTracker()
	w := mustRegister(t, tr, 1)
	if err := tr.Book("a", w, []uint64{10, 20, 30}, 0, 100); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := tr.OutputBlock("a", 0, false); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.ActiveBlocks(); got != 6 {
		t.Fatalf("active blocks %d, want 6", got)
	}
	// Decay 0.25 on all 7 blocks, the request's own: 7 × 0.25 = 1.75, rounded 2.
	if err := tr.OutputBlock("a", 0.25, true); err != nil {
		t.Fatal(err)
	}
	if got := w.ActiveBlocks(); got != 2 {
		t.Fatalf("active blocks %d, want 2", got)
	}
	if err := tr.OutputBlock("a", 1.5, true); err == nil {
		t.Fatal("decay 1.5 taken")
	}
	if err := tr.OutputBlock("zz", 0, false); err != ErrUnknownRequest {
		t.Fatalf("unknown id: %v", err)
	}
	if err := tr.Complete("a"); err != nil {
		t.Fatal(err)
	}
	if got := w.ActiveBlocks(); got != 0 {
		t.Fatalf("active blocks %d after completion", got)
	}
}

// TestTrackerOutputMapped: a worker with enough requests to keep a block map counts a request's
// own blocks from the map, and restates output blocks when it switches.
func TestTrackerOutputMapped(t *testing.T) {
	tr := NewTracker()
	w := mustRegister(t, tr, 1)
	n := scanRequests + 4
	for i := range n {
		// every request shares block 1 and owns one block
		id := fmt.Sprint("r", i)
		if err := tr.BookOutput(id, w, []uint64{1, uint64(100 + i)}, 0, 100, Output{ISL: 32, BlockSize: 16, Expected: 10}); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Generated(id, 1); err != nil {
			t.Fatal(err)
		}
	}
	// 1 + n own blocks + n output blocks, each request's own two weighted 0.9: 1 + 2n × 0.9.
	want := int64(1 + float64(2*n)*0.9 + 0.5)
	if got := w.ActiveBlocks(); got != want {
		t.Fatalf("mapped: active blocks %d, want %d", got, want)
	}
	for i := range n {
		if err := tr.Complete(fmt.Sprint("r", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.ActiveBlocks(); got != 0 {
		t.Fatalf("active blocks %d after completion", got)
	}
}

// TestTrackerOutputConcurrent races output reports with completions and new bookings of the
// same ids; run under -race. Nothing may stay counted.
func TestTrackerOutputConcurrent(t *testing.T) {
	tr := NewTracker()
	w := mustRegister(t, tr, 1)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				id := fmt.Sprint("g", g, "-", i%7)
				_ = tr.BookOutput(id, w, []uint64{1, uint64(g*1000 + i)}, 16, 1<<62, Output{ISL: 32, BlockSize: 16, Expected: 64})
				_, _ = tr.Generated(id, int64(i%50))
				_ = tr.OutputBlock(id, 0.5, i%2 == 0)
				if i%3 == 0 {
					_ = tr.Complete(id)
				}
			}
		}()
	}
	wg.Wait()
	tr.Expire(1<<63 - 1)
	if w.ActiveBlocks() != 0 || w.Requests() != 0 {
		t.Fatalf("left: %d blocks, %d requests", w.ActiveBlocks(), w.Requests())
	}
}
