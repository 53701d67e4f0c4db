package loadgen

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// userHZ is the unit of /proc/stat's counters; Linux fixes it at 100 for user space.
const userHZ = 100

// sampleCPU reads the machine's CPU time from /proc/stat and this process's from getrusage. On a
// shared machine the difference tells how much of it other processes took during a run, which
// decides whether the run's numbers mean anything.
func sampleCPU() cpuSample {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return cpuSample{}
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	// cpu user nice system idle iowait irq softirq steal [guest guest_nice, already in user]
	if len(f) < 9 || string(f[0]) != "cpu" {
		return cpuSample{}
	}
	var v [8]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(string(f[i+1]), 10, 64); err != nil {
			return cpuSample{}
		}
	}
	tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }
	total := v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]
	// Interrupt and softirq time is left out of busy: loopback TCP does most of its work there,
	// for this process, but charges it to no process.
	busy := v[0] + v[1] + v[2] + v[7]
	self := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpuSample{ok: true, total: tick(total), busy: tick(busy), self: self}
}
