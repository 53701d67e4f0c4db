//go:build linux

package daemon

import (
	"bytes"
	"os"
	"syscall"
)

// The prctl(2) options of the process's transparent huge page flag (linux/prctl.h, Linux 3.15).
const (
	prSetTHPDisable = 41
	prGetTHPDisable = 42
)

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

// thpOff reports whether the process's flag is set; known is false where there is none.
func thpOff() (off, known bool) {
	r, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prGetTHPDisable, 0, 0)
	return e == 0 && r != 0, e == 0
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
