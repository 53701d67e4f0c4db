// Package radix holds kvrouterd's prefix index: Dynamo-compatible block hashing, and for each model
// an Index from block to the workers holding it, with the match walk that scores a request.
//
// # Hashing
//
// A block is BlockSize token ids. Its local hash is XXH3-64, seed 1337, over the token ids as
// little-endian u32; a LoRA adapter changes the seed to 1337 + XXH3-64(name); multimodal object
// hashes of the block, sorted ascending, are appended to the bytes as little-endian u64. The
// sequence hash chains local hashes: seq[0] = local[0], seq[i] = XXH3-64 seed 1337 over
// LE64(seq[i-1]) ‖ LE64(local[i]). A sequence hash names a whole prefix, so the index needs no
// tree. Only full blocks are hashed. These rules match NVIDIA Dynamo's router byte for byte.
//
// With 64-bit hashes two different prefixes share a hash by chance: at 10^8 distinct blocks in
// one index the probability that any pair collides is about 3·10^-4 (n²/2^65). A collision makes
// one prefix look cached where the other is: a routing mistake, never a crash.
//
// # Index
//
// The index is keyed by sequence hash. An entry holds the set of worker slots with the block:
// up to three inline in one 64-bit word, a sorted list up to 64, a bitset beyond (see holders.go).
// A match walks a request's sequence hashes and intersects the still-walking slots with each
// entry's holders; a slot leaves at its first missing block, so its depth is its contiguous cached
// prefix, never more, also after removals in the middle of a chain. The walk stops when no slot
// is left.
//
// Workers are (worker id, data-parallel rank) pairs given dense slot numbers by Acquire. The
// table is split into 256 segments, each an open-addressing table with its own writer lock;
// readers take no lock (table.go states the rules that make this safe). Memory is a few large
// arrays without pointers, so the garbage collector does not scan them.
//
// A model's device index may have one index per lower storage tier beside it (host, disk,
// external; EnsureTier), sharing its slots; a match then extends each slot's device depth
// through them (Match.Tiers, tiers.go).
//
// The index itself enforces no budget: it holds what its writers add. Package shard, the only
// writer in kvrouterd, bounds the number of residencies.
package radix
