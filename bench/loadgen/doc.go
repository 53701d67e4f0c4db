// Package loadgen measures kvrouterd's HTTP route throughput and latency, and the same client
// against a no-op fasthttp handler on the same machine, so that the router's own cost can be read
// off as the difference between the two. Run does one run; RunSuite does the reported matrix.
// Command bench/kvrload is the command line on top of it; other programs, such as a report
// generator, run the same suite in process.
//
// Both targets see identical client work: the route request goes through package client (binary
// format, one reused fasthttp HostClient) and is followed on the same goroutine by the complete
// call, so that active load does not pile up; only the route call is timed. The no-op handler
// answers /v1/route with a fixed 130-byte route response that the client decodes like a real one,
// and the complete call with 204, as kvrouterd does.
//
// For Target "kvrouterd" the index is given realistic content first: every worker holds a shared
// system prefix of Blocks/8 blocks; each of Prompts families is a prompt of Blocks blocks that
// starts with that prefix and is held whole by two workers; a worker without a whole family holds
// the first half of one. Each request picks a family at random and replaces a random tail of it,
// so that its cached depth is uniform between 3/4 of the prompt and all of it.
//
// Config.Residencies pads that index with filler prompts, each the system prefix and a family's
// length of its own blocks held by two workers, until it holds that many (block, worker) pairs;
// requests never match them, but walk an index of that size. Config.EventRate streams KV events
// into the in-process Router while it is loaded, through Router.Ingest as the daemon applies an
// engine's event stream: evenly spaced batches, each one worker's removal of a filler prompt's
// tail and its store again (an eviction and a recompute), so the index keeps its size. The stream
// waits on the same alarm as the open loop; one more than a couple of milliseconds behind gives
// up the batches it missed rather than bursting, and each run reports the rate the shards
// applied in its window.
//
// Rate 0 runs a closed loop at saturation: Conns goroutines each send the next request as soon as
// the previous one is answered. Rate R > 0 runs an open loop at R requests per second in total,
// each goroutine on a fixed schedule of R/Conns (as wrk2 does); a request that could not be sent
// at its scheduled time because its goroutine was still waiting for an earlier answer is timed
// from the scheduled time, so that queueing is not hidden (coordinated omission). The goroutines
// wake on a timerfd read through the runtime's poller (on Linux), within microseconds of their
// schedule: Go's timers wake an idle process up to a millisecond late, which sent the requests in
// bursts and measured the bursts. A request whose goroutine was idle is timed from the moment it
// woke: the wake-up's lateness is the load generator's, not the target's.
//
// The suite runs, per worker count, the no-op target and kvrouterd at saturation, then both in an
// open loop at half kvrouterd's saturated rate: the ratio of the saturated rates is the router's
// throughput cost, and the half-rate latencies compare the two below saturation; so do runs at a
// quarter of it, where client and server no longer compete for a small machine's cores. It also runs the
// no-op target at saturation answering as many candidates as kvrouterd does (Config.NoopCandidates):
// an answer listing 1,000 workers is about 40 KB, which the server writes and the client reads
// and decodes whoever computed it, so that ratio is the router's cost without the answer's size.
//
// RunAdded measures the latency kvrouterd adds to a route over the no-op handler, the figure a
// gateway cares about: per worker count, the no-op handler's saturated rate, then pairs of
// open-loop runs of both targets at fixed percentages of it (10 and 50 by default), kvrouterd's
// index padded and fed events, each answer carrying the same few candidates. The added latency of
// a percentile is the median over the pairs of kvrouterd's minus the no-op's.
//
// Each run reports achieved routes per second, route latency percentiles, errors, this process's
// CPU time per request (client and in-process target), and the share of the machine other
// processes used meanwhile: on a shared machine, a run with a high share measured them too. A run
// fails its error budget if more than 0.1% of its requests fail.
//
// Runs are safe to start from several goroutines, but concurrent runs share the machine and so
// measure one another, and the CPU figures are the whole process's.
package loadgen
