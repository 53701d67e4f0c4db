//go:build !linux

package loadgen

// sampleCPU knows only Linux's accounting; elsewhere runs report no CPU figures.
func sampleCPU() cpuSample { return cpuSample{} }
