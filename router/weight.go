package router

import (
	"math"
	"strings"
)

// A worker's weight is its capacity relative to the others' for mode device_aware_weighted
// (scoring.DeviceAwareWeighted): the worker with the fewest requests in flight per unit of
// weight wins. Dynamo derives it from a worker's device class (an accelerator counts as
// DYN_ENCODER_CUDA_TO_CPU_RATIO, 8, CPU workers); kvrouterd takes it per worker, at
// registration, so that a fleet of mixed accelerators can say so too.

// CPUWeight is the weight of a worker registered with device_type "cpu" and no weight of its
// own: an eighth of an accelerator's (1), Dynamo's default DYN_ENCODER_CUDA_TO_CPU_RATIO.
const CPUWeight = 1.0 / 8

// DeviceWeight is the weight a registration states: weight if given (not 0), else CPUWeight for
// device_type "cpu" (any case), else 0 (unset: the worker's own, or 1).
func DeviceWeight(deviceType string, weight float64) float64 {
	if weight != 0 {
		return weight
	}
	if strings.EqualFold(deviceType, "cpu") {
		return CPUWeight
	}
	return 0
}

// maxWeight bounds a weight, so that requests × weight products stay exact enough.
const maxWeight = 1e6

// minWeight bounds a weight from below, for the same reason.
const minWeight = 1e-6

func checkWeight(w float64) error {
	if w != 0 && !(w >= minWeight && w <= maxWeight) {
		return fieldErr(ErrInvalid, "weight", "%v: want a number from %g to %g", w, float64(minWeight), float64(maxWeight))
	}
	return nil
}

// setWeight sets the worker's weight. REQUIRES Router.mu (readers are lock-free).
func (g *registration) setWeight(w float64) { g.weight.Store(math.Float64bits(w)) }

// getWeight returns the worker's weight, 0 when never set (the scoring counts it as 1).
func (g *registration) getWeight() float64 { return math.Float64frombits(g.weight.Load()) }
