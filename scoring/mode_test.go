package scoring

import (
	"math/rand/v2"
	"testing"
)

func TestParseModeSpellings(t *testing.T) {
	f := func(s string, want Mode) {
		t.Helper()
		if got, err := ParseMode(s); err != nil || got != want {
			t.Fatalf("ParseMode(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	f("power_of_two", PowerOfTwo)
	f("power-of-two", PowerOfTwo)
	f("power-of-two-choices", PowerOfTwo)
	f("power_of_two_choices", PowerOfTwo)
	f("device_aware_weighted", DeviceAwareWeighted)
	f("device-aware-weighted", DeviceAwareWeighted)
	f("round-robin", RoundRobin)
	if PowerOfTwo != 6 || DeviceAwareWeighted != 7 {
		t.Fatal("the wire format numbers the new modes 6 and 7")
	}
	if PowerOfTwo.String() != "power_of_two" || DeviceAwareWeighted.String() != "device_aware_weighted" {
		t.Fatal("names")
	}
	if _, err := ParseMode("power"); err == nil {
		t.Fatal("an unknown name parsed")
	}
}

// TestPowerOfTwo: the choice is the less loaded of the two candidates the random source draws
// (Dynamo's draw: a first index, then a distinct second one), the first on a tie; never a third.
func TestPowerOfTwo(t *testing.T) {
	loads := []int64{5, 1, 9, 1, 3}
	c := make([]Candidate, len(loads))
	for i, l := range loads {
		c[i].ActiveRequests = l
	}
	seen := map[int]bool{}
	for seed := range uint64(200) {
		got := powerOfTwo(c, rand.New(rand.NewPCG(seed, 1)))
		d := rand.New(rand.NewPCG(seed, 1))
		a := d.IntN(len(c))
		b := (a + 1 + d.IntN(len(c)-1)) % len(c)
		want := a
		if loads[b] < loads[a] {
			want = b
		}
		if a == b || got != want {
			t.Fatalf("seed %d: drew %d and %d, chose %d, want %d", seed, a, b, got, want)
		}
		seen[got] = true
	}
	if seen[2] {
		t.Fatal("the most loaded candidate was chosen: it never is the less loaded of two")
	}
	if !seen[0] || !seen[1] || !seen[3] || !seen[4] {
		t.Fatalf("chosen: %v; every other candidate should win some draw", seen)
	}
	if got := powerOfTwo(c[:1], nil); got != 0 {
		t.Fatal("one candidate")
	}
	var ch Chooser
	p := Params{Mode: PowerOfTwo, BlockSize: 16, ISL: 16, Blocks: 1, Weight: 1}
	if i, err := ch.Choose(c, &p, rand.New(rand.NewPCG(1, 2))); err != nil || i == 2 {
		t.Fatalf("Choose: %d, %v", i, err)
	}
}

// TestDeviceAware: the lowest requests per unit of weight wins; among equals, the first met
// from a start that advances by one each call.
func TestDeviceAware(t *testing.T) {
	mk := func(reqs []int64, weights []float64) []Candidate {
		c := make([]Candidate, len(reqs))
		for i := range c {
			c[i].ActiveRequests, c[i].DeviceWeight = reqs[i], weights[i]
		}
		return c
	}
	var ch Chooser
	// Per weight: 8/8 = 1, 1/1 = 1, 3/4 = 0.75, 0/0.5 = 0 → position 3 whatever the start.
	c := mk([]int64{8, 1, 3, 0}, []float64{8, 1, 4, 0.5})
	for range 4 {
		if got := ch.deviceAware(c); got != 3 {
			t.Fatalf("got %d, want 3 (idle)", got)
		}
	}
	// Loads 2/4 = 0.5, 1/1 = 1, 1/2 = 0.5, 0 weight counts as 1: 1/1 = 1. Ties at 0.5 between
	// 0 and 2: the start is 4 mod 4 = 0 → 0, then 1 → 2 (scan 1, 2, …), 2 → 2, 3 → 0.
	c = mk([]int64{2, 1, 1, 1}, []float64{4, 1, 2, 0})
	for _, want := range []int{0, 2, 2, 0, 0, 2} {
		if got := ch.deviceAware(c); got != want {
			t.Fatalf("got %d, want %d", got, want)
		}
	}
	// Every candidate equal: they take turns.
	var turns Chooser
	c = mk([]int64{1, 1, 1}, []float64{1, 1, 1})
	for i := range 6 {
		if got := turns.deviceAware(c); got != i%3 {
			t.Fatalf("call %d: got %d, want %d", i, got, i%3)
		}
	}
}
