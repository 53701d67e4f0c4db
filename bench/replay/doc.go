// Package replay measures the prefix index (radix.Index fed by shard.Set, the daemon's own event
// path) on a trace's own KV events, at fleet sizes far beyond what the fleet simulator runs.
//
// # The stream
//
// Record runs a trace on a small simulated fleet (package bench/fleet, usually 8 workers) and
// keeps every KV event batch the workers published, in delivery order, together with the
// queries a gateway would send for the trace's requests: the sequence hashes of each prompt's
// full blocks at the engine block size, hashed as the router hashes them. A stored event's
// tokens are not copied when a request's prompt holds them (bench/sim's always do): the stream
// points into the requests, so that it costs little beside the trace itself.
//
// # Scaling
//
// N workers are N/8 groups (8 being the recorded fleet's size): group g replays the same stream
// as workers g·8+1 … g·8+8. The groups are interleaved batch by batch, and their starts are
// spread evenly over the replayed part of the stream (group g starts g/groups of the way in),
// so that, as in a fleet whose replicas serve the same traffic at different times, consecutive
// writes touch different blocks. Every group ends holding the same blocks: the index sees each
// block held by up to N/8 workers.
//
// The work is capped by Config.MaxResidencies, counted in stored blocks applied over all
// groups, which bounds the residencies the index can reach. When the whole stream times the
// groups exceeds it, every group replays the same prefix of the stream, the longest whose
// stored blocks fit in its share; Result.Prefix says how much of the stream that was.
//
// # Measurements
//
// Run makes four measurements, in this order, on one index:
//
//  1. Apply rate. The groups' batches are copied into shard batches and enqueued on the shards
//     exactly as router.Ingest does, the clock running from the first enqueue until a barrier
//     returns, i.e. until every queue is drained and applied. The rate counts blocks stored and
//     removed as the shards' counters report them, not as sent. Nothing reads meanwhile. The
//     fill stops at a few checkpoints (geometric in stored blocks) with the clock stopped.
//  2. Match latency against index size: at each checkpoint, with no writes, Index.Match of
//     random queries for a short while (Config.MatchFor/10); Result.Sizes. A full collection
//     runs first, as before the match phase, so that the garbage the filling left is not
//     collected during the measurement: matching allocates nothing, and neither does a
//     daemon's steady state much.
//  3. Bytes per residency: the heap in use (after full collections) once filled, minus before
//     the index and the shards existed, over the residencies the index holds. The shards' pool
//     of recycled batches is emptied first: it is queue memory, reported apart (PoolBytes).
//  4. Match under writes: one goroutine keeps enqueueing churn — a removal of a stored event's
//     blocks followed by their re-store, as an engine evicting and recomputing a prefix — over
//     all workers in turn, so that the index's size stays constant, while another goroutine
//     matches random queries for Config.MatchFor. The writer aims at Config.WriteRate: by
//     default the recorded fleet's own event rate times the groups, the load such a fleet
//     would put on the index; the rate it achieved is reported beside. Latency is that of
//     Index.Match alone (the query is hashed beforehand, as the router hashes it before
//     matching), measured with two clock reads around each call, which it includes.
//
// Queries are the requests of the trace that had arrived by the end of the replayed prefix (at
// a checkpoint: by group 0's position), picked uniformly at random with Config.Seed; a short
// prefix leaves few of them (Result.Queries), whose blocks the index mostly holds.
//
// The producers (the filler, the churn writer) and the reader run on the same cores as the
// shards: on a small machine they compete, which lowers rates and lengthens the latency tail,
// the more so with a writer unpaced (Config.WriteRate < 0).
//
// # Concurrency
//
// A Stream is read-only once Record returns: any number of Runs may read it at once. Run uses
// the whole machine and is meant to run alone; it starts goroutines and stops them before it
// returns.
package replay
