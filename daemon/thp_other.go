//go:build !linux

package daemon

// Transparent huge pages are Linux's: elsewhere --transparent-huge-pages does nothing.

func setTHPOff(bool) error { return nil }

func hostTHP() string { return "" }
