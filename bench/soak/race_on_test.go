//go:build race

package main

// raceEnabled: see TestSoak.
const raceEnabled = true
