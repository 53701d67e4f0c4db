//go:build !linux

package daemon

// Transparent huge pages are Linux's: elsewhere --transparent-huge-pages does nothing.

func setTHPOff(bool) error { return nil }

func thpOff() (off, known bool) { return false, false }

func hostTHP() string { return "" }
