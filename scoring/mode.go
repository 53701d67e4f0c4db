package scoring

import (
	"errors"
	"fmt"
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
	numModes
)

var modeNames = [numModes]string{"default", "kv", "round_robin", "random", "least_loaded", "direct"}

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

// ParseMode parses a mode name as the flags and JSON requests spell it. "round-robin" and
// "least-loaded" are accepted too.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "round-robin":
		return RoundRobin, nil
	case "least-loaded":
		return LeastLoaded, nil
	}
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w %q (want kv, round_robin, random, least_loaded or direct)", ErrMode, s)
}
