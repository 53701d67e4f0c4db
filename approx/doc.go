// Package approx holds the Cache behind kvrouterd's approximate mode (--no-kv-events), for fleets
// whose workers publish no KV events. The router records its own decisions as if the chosen
// worker had cached the request's full blocks; the Cache keeps those guesses fresh and bounded
// and tells the caller which blocks to add to and remove from its index. It follows NVIDIA
// Dynamo's approximate indexer (its PruneManager): the same TTL, cap and prune ratio, with the
// same defaults, and the same order of eviction.
//
// # Model
//
// A residency is one block (a sequence hash) held by one worker. Record(w, seqs, now) makes
// every block of the chain seqs resident on w, used at now: new residencies are reported as
// added, held ones are refreshed. A residency expires TTL after its last use. The number of
// residencies over all workers is capped at MaxBlocks: when a Record takes it above, the Cache
// evicts down to PruneTarget × MaxBlocks. Expired residencies go first, then the least recently
// used; among residencies last used by the same Record, the deepest block of the chain first.
// This is Dynamo's order: its heap pops the earliest expiry first, and among blocks of one
// insertion, which share an expiry, the highest sequence position first.
//
// # Prefix closure
//
// For every worker, if the Cache holds seqs[i] it holds seqs[0..i-1]: the index then never has
// a chain with a hole, whose tail could be matched by no request and would only take room.
// All residencies sit on one list ordered by last use, oldest first, and a Record moves its
// blocks to the newest end deepest first, so the root of a request ends newest. A block's parent
// in the chain is used by every Record that uses the block (a sequence hash names the whole
// prefix), and placed after it, so a parent is always newer on the list than its children.
// Expiry and pruning both take residencies from the oldest end, so they take a child before or
// together with its parent, never the parent alone; and they report it first, so a caller that
// applies removals in order never leaves a hole even for a moment. RemoveWorker reports the
// worker's blocks deepest first, for the same reason.
//
// Time is nanoseconds of any monotonic clock, given by the caller. A time earlier than one the
// Cache has already seen (two goroutines that read the clock, then race for the lock) is taken
// as the latest seen, so the list stays ordered by time.
//
// # Cost
//
// Residencies live in one slab of 32-byte nodes linked by int32 indices (no pointers for the
// garbage collector to scan); each worker has an open-addressing map from sequence hash to node.
// Record costs one map probe and one list move per block and allocates nothing once the slab
// and maps have grown; Expire and pruning cost one map deletion per residency they remove.
// Pruning removes (1 − PruneTarget) × MaxBlocks residencies in one call, as Dynamo does: at the
// defaults about 210,000, a pause of a few milliseconds every time the cap is reached.
//
// # Concurrency
//
// A Cache is safe for concurrent use: every method takes one mutex. The caller must apply the
// reported residencies to its index in the order the calls returned them (one caller that holds
// its own lock around Record and the index update does this naturally).
package approx
