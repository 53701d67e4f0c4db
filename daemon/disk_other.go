//go:build !unix

package daemon

import "errors"

// diskFree is unknown here: the daemon does not check the disk before it writes.
func diskFree(string) (uint64, error) {
	return 0, errors.New("free disk space: not known on this system")
}
