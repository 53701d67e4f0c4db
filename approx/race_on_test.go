//go:build race

package approx

// raceEnabled: allocation counts are asserted only without the race detector, whose
// instrumentation is not the build that ships.
const raceEnabled = true
