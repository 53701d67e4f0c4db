package loadgen

import "time"

// cpuSample is the CPU time used so far by the whole machine (busy of total, all CPUs; steal
// counts as busy, interrupts do not) and by this process; ok is false where the platform does not tell.
type cpuSample struct {
	ok                bool
	busy, total, self time.Duration
}

// cpuUse is what happened between samples a and b: this process's CPU time, and the share of the
// machine's capacity that other processes (or the hypervisor, as steal) used, -1 when unknown.
func cpuUse(a, b cpuSample) (self time.Duration, others float64) {
	if !a.ok || !b.ok || b.total <= a.total {
		return b.self - a.self, -1
	}
	busy := (b.busy - a.busy) - (b.self - a.self)
	return b.self - a.self, max(float64(busy)/float64(b.total-a.total), 0)
}
