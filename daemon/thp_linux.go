//go:build linux

package daemon

import (
	"bytes"
	"os"
	"syscall"
)

// prSetTHPDisable is prctl(2)'s option that sets the process's transparent huge page flag
// (linux/prctl.h, Linux 3.15).
const prSetTHPDisable = 41

// setTHPOff sets (true) or clears (false) the flag that keeps transparent huge pages out of the
// whole process's memory, every thread's, whatever the host's mode.
func setTHPOff(off bool) error {
	var v uintptr
	if off {
		v = 1
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetTHPDisable, v, 0); e != 0 {
		return e
	}
	return nil
}

// hostTHP is the host's transparent huge page mode, the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled ("always", "madvise" or "never"); "" if unknown.
func hostTHP() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return ""
	}
	return thpMode(b)
}

// thpMode is the bracketed word of the sysfs file's text b ("always [madvise] never\n").
func thpMode(b []byte) string {
	i, j := bytes.IndexByte(b, '['), bytes.IndexByte(b, ']')
	if i < 0 || j < i {
		return ""
	}
	return string(b[i+1 : j])
}
