//go:build race

package replay

// raceEnabled: the race detector slows the fleet simulation down tenfold.
const raceEnabled = true
