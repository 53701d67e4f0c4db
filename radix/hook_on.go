//go:build invariants

package radix

// pauseHook, if set, runs at readerPause. Tests only; not synchronized.
var pauseHook func()

func readerPause() {
	if f := pauseHook; f != nil {
		pauseHook = nil // once
		f()
	}
}
