// Package sim simulates an LLM inference worker for discrete-event fleet simulations: a
// vLLM-style scheduler over a fixed-capacity KV block cache with prefix caching, timed by
// Dynamo's mocker step-time model, publishing the KV events a real engine would.
//
// # Model
//
// A Worker holds Blocks KV blocks of BlockSize tokens. Each Step is one engine forward pass
// (one scheduler iteration), following Dynamo's mocker (lib/mocker, vLLM scheduler):
//
//  1. Running sequences are served first, within a token budget of MaxBatchedTokens: every
//     decoding sequence gets one token, then each sequence still in prefill, in admission
//     order, gets the next chunk of its prompt (chunked prefill). When the budget runs out the
//     remaining running sequences wait for the next step. (Dynamo's mocker serves running
//     sequences in admission order. The orders coincide: a chunk cut short by the budget ends
//     the step's scheduling, so only the last admitted sequence can be mid-prefill.)
//  2. Waiting requests are admitted in FIFO order while fewer than MaxSeqs run, budget remains
//     and the KV cache can hold them (see Admission); each admitted request gets a first prefill
//     chunk from the remaining budget. The first request that cannot be admitted blocks the
//     ones behind it (head-of-line, as in vLLM).
//  3. The step lasts Timing.StepTime(T, u, decoding): T is the number of prompt tokens computed
//     in the step, u the fraction of blocks held by running sequences, and decoding tells
//     whether any sequence emitted a token. A sequence whose last prefill chunk ran in the step
//     emits its first token at the step's end (PrefillDone) — that token costs the decode part
//     of the step, as in the mocker; every scheduled decoding sequence emits one token.
//  4. Sequences that emitted their last token complete (Completed) and release their blocks.
//
// StepOutput.Emitted lists every sequence that emitted a token in the step, with the count of
// its output tokens so far, so that a live engine (bench/mocker) can stream them one by one.
//
// Worker.Abort removes a request between steps, as an engine does when its client goes away:
// a waiting request leaves the queue; a running one releases its blocks exactly as if it had
// completed (its stored prompt blocks stay cached, so an abort publishes no event).
//
// # Disaggregated serving
//
// Two request flags model vLLM's KV connectors (NixlConnector and the like), for a worker in a
// prefill/decode split. A Hold request (the prefill side) keeps its blocks pinned when it
// completes, counted as in use, until Worker.Release — the decode worker has read them, or the
// transfer was given up; Worker.AppendHeldBlocks names them (the remote_block_ids a prefill
// answer carries). A Remote request (the decode side) arrives with its prompt's KV computed
// elsewhere: at admission the prompt blocks the cache lacks are filled as if computed (the full
// ones stored and published, as vLLM caches received blocks), the prompt's local cache hit is
// counted as usual, and the rest, up to the last prompt token, is counted in
// Stats.RemoteTokens; the last token is computed in the request's first step, for the first
// output token, as vLLM's decode side recomputes it. How long the transfer takes is the
// caller's to model: the worker sees the request once its blocks have arrived.
//
// # Cache and prefix caching
//
// A full prompt block is identified by its engine hash, which is the router's sequence hash of
// the prompt prefix ending with that block (radix.Hasher.AppendSequence, base-model seed), so
// the router's re-hash of the published tokens lands on the same value. A block becomes cached
// (and a Stored event is published) as soon as the prefill chunk that fills it is scheduled, so
// requests admitted later in the same step can hit it, as vLLM's allocate_slots does. A prompt
// block whose hash is already cached — computed concurrently by another sequence — is not
// stored twice: the sequence switches to the cached copy and frees its own.
//
// Only prompt blocks are stored. Blocks that hold the partial prompt tail or generated tokens
// are private to their sequence, never published, and go straight back to the free pool when the
// sequence completes: output token ids are not simulated, so such blocks could never be hit.
//
// A request's cache hit is the longest prefix of its full prompt blocks that is cached, capped
// so that at least one prompt token is computed (vLLM recomputes the last token of a fully
// cached prompt). The hit blocks are pinned until the request completes. Blocks nobody pins stay
// cached in an LRU list; a sequence releases its blocks tail first, so a chain's later blocks
// are evicted before its earlier ones. Allocation takes a free block, else evicts the least
// recently used unpinned cached block and publishes a Removed event. Pinned blocks are never
// evicted; a cached block's parent is always cached (it is pinned by everyone pinning the
// child, and it is released after the child, so it is never the older of the two in the LRU).
//
// # Host tier
//
// With WorkerConfig.HostBlocks a worker has a host-memory tier, as KVBM or LMCache give vLLM:
// a block evicted from the device cache is copied into a host LRU of that many blocks (a block
// the tier holds already only becomes its most recently used), and the tier's least recently
// used block makes room, leaving it. A request's cached prefix is its device prefix continued
// by host blocks; those are reloaded into device blocks at admission — stored again on the
// device, not computed — and the step that admits it lasts HostReload longer per block (the
// load precedes the forward pass, as vLLM's connectors load synchronously). A reload costs
// between a device hit (nothing) and a recompute: HostReloadTime derives it from the KV bytes
// of a block and the host link's bandwidth. Done.Host reports the tokens reloaded, apart from
// the device hit (Done.Cached).
//
// The tier publishes its own events (Tier kvevent.Host), as Dynamo's KVBM does: Stored when a
// block enters it, carrying the blocks' local hashes (Locals) instead of tokens, the device
// copy's tokens being gone, and Removed when it leaves. A block's host Stored event comes
// before its device Removed event, and a device eviction takes a child before its parent, so
// the parent of a block entering the host tier is always on the device or in the tier.
//
// # Admission
//
// There is no preemption. A request is admitted only if the blocks it can still need —
// ceil((len(prompt)+Output−1)/BlockSize) minus its hit — fit in the free and evictable blocks
// left after the future needs of every running sequence are set aside. Running sequences can
// therefore always grow. This is more conservative than vLLM, which admits on the prompt alone
// and preempts under pressure; at the default capacity (about a million tokens) the difference
// shows only under extreme load. A request that could not fit even in an empty cache is refused
// by Submit with ErrTooLarge.
//
// # Events
//
// Events carry IDs from 1 upwards (one sequence for both tiers), Rank 0 and the device tier
// unless they are the host tier's. Consecutive blocks stored in one chain are published in one
// Stored event (Parent = the engine hash of the block before the first, HasParent false at the
// root, Tokens = the blocks' prompt tokens, BlockSize set);
// consecutive evictions are published in one Removed event. Applied in order, the events of
// all steps describe exactly the worker's cached block set (tests check this against a
// reference model). A worker never publishes Cleared.
//
// # Concurrency and determinism
//
// A Worker belongs to one goroutine at a time; it has no locks and starts no goroutines.
// Its behaviour is a function of its configuration and the sequence of Submit and Step calls:
// nothing depends on wall-clock time, map iteration order or randomness.
package sim
