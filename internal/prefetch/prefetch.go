// Package prefetch asks the CPU to start loading cache lines that code is about to use.
//
// A prefetch retires at once and never faults, unlike a load, so a loop can have the misses of
// many independent lookups in flight while it works on earlier ones. The index walk and event
// application use it for the buckets and map slots of a request's or an event's blocks, whose
// addresses are all known before the first is needed. Go has no portable way to say this, hence
// a few lines of assembly on amd64 and arm64; elsewhere it does nothing (correct, only slower).
// Safe for concurrent use; stale or dangling addresses are harmless.
package prefetch
