//go:build race

package mocker

// raceEnabled: the race detector makes sync.Pool (behind internal/freelist) drop items at
// random, so allocation counts are only meaningful without it.
const raceEnabled = true
