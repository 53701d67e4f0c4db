//go:build !invariants

package radix

// readerPause marks the point in a lookup between matching a slot's key and loading its holder
// word. It compiles to nothing; under the invariants build tag tests use it to run a writer
// exactly there.
func readerPause() {}
