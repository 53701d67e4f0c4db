package main

import "syscall"

// daemonAttr makes the kernel send the daemon SIGTERM should the soak die without stopping it.
func daemonAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
