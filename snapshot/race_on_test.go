//go:build race

package snapshot

// raceEnabled: under the race detector sync.Pool drops items at random and Pebble turns on its
// invariant checks, so allocation counts are only meaningful without it.
const raceEnabled = true
