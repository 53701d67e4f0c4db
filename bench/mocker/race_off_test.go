//go:build !race

package mocker

const raceEnabled = false
