package daemon

import (
	"syscall"
	"testing"
)

// TestTHPFlag sets and clears the process's transparent huge page flag, and reads the host's
// mode from the sysfs file's text.
func TestTHPFlag(t *testing.T) {
	was, known := thpOff()
	if !known {
		t.Skip("this kernel has no transparent huge page flag")
	}
	t.Cleanup(func() { setTHPOff(was) })
	for _, off := range []bool{true, false, true} {
		if err := setTHPOff(off); err != nil {
			t.Fatal(err)
		}
		if got, _ := thpOff(); got != off {
			t.Fatalf("set %v, read %v", off, got)
		}
	}
	for text, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never\n": "always",
		"always madvise [never]":   "never",
		"always madvise never":     "",
		"] [":                      "",
		"":                         "",
	} {
		if got := thpMode([]byte(text)); got != want {
			t.Errorf("%q: %q, want %q", text, got, want)
		}
	}
	switch m := hostTHP(); m {
	case "", "always", "madvise", "never":
	default:
		t.Errorf("host mode %q", m)
	}
}

// prGetTHPDisable is prctl(2)'s option that reads the process's transparent huge page flag.
const prGetTHPDisable = 42

// thpOff reports whether the process's flag is set; known is false where there is none.
func thpOff() (off, known bool) {
	r, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prGetTHPDisable, 0, 0)
	return e == 0 && r != 0, e == 0
}
