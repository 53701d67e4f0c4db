//go:build !linux

package main

import "syscall"

// daemonAttr: without Linux's parent-death signal the soak stops the daemon itself only.
func daemonAttr() *syscall.SysProcAttr { return nil }
