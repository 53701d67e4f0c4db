package scoring

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// Mode is a routing mode. The numbering is part of the binary wire format (package wire).
type Mode uint8

const (
	// Default means "the server's configured mode" in a request; it is never a server's mode.
	Default Mode = iota
	// KV scores every worker with the cost function and its cached prefix.
	KV
	// RoundRobin cycles through the workers in order.
	RoundRobin
	// Random picks a worker uniformly.
	Random
	// LeastLoaded picks the worker with the fewest active requests, ignoring the cache; ties at
	// random (Dynamo's measure: requests in flight).
	LeastLoaded
	// Direct sends the request to the worker the caller names.
	Direct
	// PowerOfTwo draws two distinct candidates at random and picks the one with fewer active
	// requests, the first drawn on a tie (Dynamo's power-of-two-choices).
	PowerOfTwo
	// DeviceAwareWeighted picks the candidate with the fewest active requests per unit of its
	// DeviceWeight, scanning from a start that advances by one each request, so that equal
	// candidates take turns.
	DeviceAwareWeighted
	numModes
)

var modeNames = [numModes]string{"default", "kv", "round_robin", "random", "least_loaded", "direct", "power_of_two", "device_aware_weighted"}

// ErrMode reports an unknown routing mode.
var ErrMode = errors.New("scoring: unknown router mode")

func (m Mode) String() string {
	if m < numModes {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// Valid reports whether m is a known mode (Default included).
func (m Mode) Valid() bool { return m < numModes }

// ParseMode parses a mode name as the flags and JSON requests spell it. Dynamo's spellings are
// accepted too: "round-robin", "least-loaded", "power-of-two", "power-of-two-choices" (and
// "power_of_two_choices", its serialized form), "device-aware-weighted".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "round-robin":
		return RoundRobin, nil
	case "least-loaded":
		return LeastLoaded, nil
	case "power-of-two", "power-of-two-choices", "power_of_two_choices":
		return PowerOfTwo, nil
	case "device-aware-weighted":
		return DeviceAwareWeighted, nil
	}
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w %q (want %s)", ErrMode, s, ModeNames)
}

// ModeNames lists the modes a server may be configured with, for messages.
const ModeNames = "kv, round_robin, random, least_loaded, direct, power_of_two or device_aware_weighted"

// powerOfTwo returns the position of the less loaded (active requests) of two distinct
// candidates drawn at random, the first drawn on a tie; the only one if there is one.
func powerOfTwo(c []Candidate, rng *rand.Rand) int {
	n := len(c)
	if n == 1 {
		return 0
	}
	a := intn(rng, n)
	b := (a + 1 + intn(rng, n-1)) % n
	if c[a].ActiveRequests <= c[b].ActiveRequests {
		return a
	}
	return b
}

// deviceAware returns the position of the candidate with the fewest active requests per unit
// of weight, scanning from the next round-robin start: the first met wins a tie.
func (ch *Chooser) deviceAware(c []Candidate) int {
	n := len(c)
	start := int((ch.weighted.Add(1) - 1) % uint64(n))
	best, bestLoad := start, perWeight(&c[start])
	for k := 1; k < n; k++ {
		i := (start + k) % n
		if l := perWeight(&c[i]); l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best
}

// perWeight is a candidate's active requests per unit of its weight (0 counts as 1).
func perWeight(c *Candidate) float64 {
	w := c.DeviceWeight
	if !(w > 0) {
		w = 1
	}
	return float64(c.ActiveRequests) / w
}
