// Package scoring decides which worker serves a request: the cost function, selection with
// temperature and tie-breaks, the routing modes, and the active load each worker carries from the
// router's own decisions. It does no I/O.
//
// # Cost
//
// The default cost is NVIDIA Dynamo's, so a fleet can switch routers without surprises. For a
// request of isl tokens whose first Cached blocks a worker already holds:
//
//	prefill_tokens(w) = active_prefill_tokens(w) + isl − cached(w) × block_size
//	prefill_blocks(w) = prefill_tokens(w) / block_size            (a real number)
//	decode_blocks(w)  = active_blocks(w) + blocks of this request not active on w
//	logit(w)          = overlap_score_weight × prefill_blocks(w) + decode_blocks(w)
//
// Lower is better. As in Dynamo, a request's blocks are its full blocks, which concurrent
// requests with the same prefix share; a partial last block is not counted.
//
// Blocks a worker holds in a lower storage tier (host, disk, external) right after its cached
// prefix are credited as a share of a cached block (TierCredit, Candidate.Ext, CostExt): CostV1
// counts cached(w) + host_weight × host(w) + disk_weight × (disk(w) + external(w)) blocks in
// prefill_tokens' place of cached(w); CostMain adds the same weighted blocks to its credit.
// What the router books stays the device prefix's.
//
// # Selection
//
// Temperature 0 takes the lowest logit; among equal logits the worker holding the fewest blocks
// overall (its tree size), and among those one at random. A positive temperature samples a
// softmax over the logits normalised by their range: p(w) ∝ exp(−logit(w) / (range × T)), uniform
// when all logits are equal.
//
// # Load
//
// A Tracker books every routed request on its worker: its blocks (a block shared by concurrent
// requests on one worker counts once) and its uncached prefill tokens. PrefillDone removes the
// prefill tokens, Complete frees the blocks, and Expire frees requests whose completion never came.
package scoring
