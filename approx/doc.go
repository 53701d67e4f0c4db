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
// added, held ones are refreshed. A residency expires TTL after its last use; Expire removes
// the expired ones. The number of residencies over all workers is capped at MaxBlocks: when a
// Record takes it above, the Cache prunes down to PruneTarget × MaxBlocks. Expired residencies
// go first, then the least recently used; among residencies last used by the same Record, the
// deepest block of the chain first. This is Dynamo's order: its heap pops the earliest expiry
// first, and among the blocks of one insertion, which share an expiry, the highest sequence
// position first.
//
// Unlike Dynamo, which prunes in one go, the Cache spreads a prune over Records: from the one
// that passes the cap until the target is reached, each Record evicts as many residencies as it
// has blocks, plus pruneStep (256), oldest first. The cap is never exceeded once a call
// returns, each prune step brings the Cache 256 closer to the target, no Record does more than
// O(its blocks + 256) work, and blocks that those Records use again in the meantime are kept,
// as a true LRU would keep them. At the defaults a prune in one go is 210,000 evictions, 20 ms
// during which no request can be routed.
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
// Record costs one map probe and one list move per block, prefetched a window ahead so that the
// cache misses overlap, and allocates nothing once the slab and maps have grown; Expire and
// pruning cost one list step and one map deletion per residency they remove. A worker's map
// shrinks when the worker holds an eighth of its peak (of 4,096 or more), so memory follows
// what is held.
//
// # Concurrency
//
// A Cache is safe for concurrent use: every method takes one mutex. The caller must apply the
// reported residencies to its index in the order the calls returned them (one caller that holds
// its own lock around Record and the index update does this naturally).
package approx
