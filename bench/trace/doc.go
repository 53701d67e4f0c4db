// Package trace turns request traces into workloads for the fleet simulator: a []Request of
// arrival times, prompt token ids and output lengths, sorted by arrival.
//
// # Sources
//
// LoadMooncake and ReadMooncake read the Mooncake FAST'25 JSON-lines traces. A Mooncake row does
// not carry tokens; it carries one hash id per 512-token block, and an id stands for the whole
// prefix up to and including its block. The loader turns every id into 512 pseudo-random token ids
// drawn from a splitmix64 stream whose start depends only on the id and MooncakeOptions.Seed,
// concatenates them and cuts the result to the row's input_length. Hence:
//
//   - equal ids give equal tokens, so two rows whose hash_ids agree on their first k entries
//     have prompts that agree on their first min(512·k, input_length) tokens;
//   - different ids give different blocks (two 512-token blocks of ids drawn from 128,000 values
//     agree by chance with probability about 128000^-512), so prompts diverge where ids diverge;
//   - the real hashing path is exercised at any engine block size, not only 512.
//
// The same reader takes the Mooncake form's relatives that public traces use
// (ReadMooncakeRows lists them): hash ids of another block size (16 in Alibaba's Qwen traces;
// MooncakeOptions.BlockSize, a row's "block_size" or a header line's), timestamps in seconds
// (MooncakeOptions.TimeUnit or a header's "time_unit") or as ISO-8601 strings, prompts given as
// token ids, kept as they are, and session ids ("session_id", "conversation_id", or Qwen's
// "chat_id" chained by "parent_chat_id").
//
// Synthetic builds a shared-prefix workload without a trace file: Poisson arrivals, a few system
// prompts, multi-turn sessions whose next prompt extends the previous prompt and answer, and
// fan-out groups of requests over one long document. It is deterministic for a seed.
//
// # Hit bound
//
// HitBound is the fraction of prompt blocks that one infinite prefix cache shared by the whole
// fleet would serve, replaying the workload in arrival order; no router can do better. It counts
// every block of a prompt, the partial tail block too, because an engine caches only full blocks
// and so always computes the tail; only full blocks can be hits. At block size 512 this gives the
// published bounds of the Mooncake traces (36.6 % conversation, 64 % synthetic), which were counted
// over hash ids, one per started block. Counting full blocks only in the denominator gives
// 38.2 % and 65.9 %; HitCounts reports both counts so a caller can choose.
//
// # Memory
//
// The token slices are the bulk of a workload: the conversation trace holds 145 million prompt
// tokens, 580 MB as uint32. ReadMooncake allocates them as one pointer-free array that the
// Requests slice into, so the garbage collector never scans them. Mooncake prompts do not share
// tokens: reusing an earlier prompt's array for a prompt that is its prefix, or appending to it
// in place, would save 0.7 % of the conversation trace and 5 % of the synthetic one, because
// equal blocks mostly sit in prompts that diverge later. Synthetic sessions do share: every turn
// of a session is a prefix of one growing array.
//
// A workload too long to hold is read as a Source, one request at a time: MooncakeSource streams
// a trace file (its rows in time order), making each prompt's tokens as its row is read, and
// SyntheticSource generates the synthetic workload so, holding only its open sessions and
// current document; bench/fleet's RunSource replays a Source keeping only the requests in
// flight. ReadMooncakeRows gives the rows without tokens, for a caller that makes prompts on
// demand with AppendTokens.
//
// Every returned slice is capped at its length, so appending to a Request's Tokens copies rather
// than overwrites a neighbour's. Requests are plain data: after a function returns, any number of
// goroutines may read them; nobody may write to shared Tokens.
//
// The package has no global state; every function may be called from any goroutine.
package trace
