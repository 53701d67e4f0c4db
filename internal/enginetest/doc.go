// Package enginetest is a fake inference engine for tests: per data-parallel rank, the two
// KV-event sockets of vLLM's and SGLang's ZmqEventPublisher, speaking what those publishers
// send. Only tests import it; it binds loopback ports only.
//
// # What the publishers do
//
// Read in vllm/distributed/kv_events.py (vLLM) and python/sglang/srt/disaggregation/kv_events.py
// (SGLang), whose ZmqEventPublisher classes are the same code:
//
//   - Ports. Rank r binds its PUB socket at the configured endpoint's port + r, and its replay
//     ROUTER socket at the replay endpoint's port + r (offset_endpoint_port). Engine.Start
//     binds ranks on consecutive ports in the same way.
//   - Live stream. Each batch is one message of three frames: the topic (the configured one,
//     "" by default), the batch's sequence as 8 bytes big-endian, and the msgpack payload. The
//     sequence counts the publisher's batches from 0 (itertools.count) and starts from 0 again
//     in a new process. A PUB socket drops what it sends while no subscriber is connected, so a
//     SUB socket misses the batches published before its subscription arrives: Rank.Probe and
//     Rank.PublishUntil repeat a batch until the subscriber has it.
//   - Replay. The ROUTER socket receives [identity, "", start] (a DEALER sends ["", start]),
//     start being a sequence as 8 bytes big-endian; a request of another number of frames is
//     ignored. For each kept batch whose sequence is at least start, in order, it sends
//     [identity, "", seq, payload] (the DEALER receives ["", seq, payload]), then the end
//     marker [identity, "", ff ff ff ff ff ff ff ff, ""]: sequence -1 as a signed 64-bit
//     integer, and an empty payload. The publisher keeps the last buffer_steps batches (10,000
//     by default), each recorded once sent: a batch the PUB socket dropped is still replayed.
//     Neither source read sends the topic in a reply; Options.ReplyTopic adds it, for readers
//     that must accept both shapes.
//
// A Rank does all of this; Rank.Drop numbers and keeps a batch without sending it (a batch the
// PUB socket dropped), Rank.Forget ends the replay buffer's reach, Rank.Restart is a new engine
// process on the same port.
//
// # Payload forms
//
// wire.AppendEngineBatch writes the payload; the Form values name its wire.EngineForm per
// engine release:
//
//	Form           batch                                  events      hashes   engine
//	VLLMArray      [ts, events, data_parallel_rank]       positional  uint     vLLM up to v0.23, before vllm-project/vllm#42892
//	VLLMMapEvents  [ts, events, data_parallel_rank]       tagged map  uint     vLLM after #42892 (captured from v0.26.0)
//	VLLMMap        {ts, events, data_parallel_rank}       tagged map  uint     vLLM main (read at 0181ea31): EventBatch lost array_like too
//	SGLang         [ts, events, attn_dp_rank]             positional  int64    SGLang
//
// vLLM's positional BlockStored is [tag, block_hashes, parent_block_hash, token_ids,
// block_size, lora_id, medium, lora_name], later releases adding extra_keys, group_idx and the
// spec fields after it while they are set; its map form has the same names as keys, "type"
// holding the tag. Since the rank field exists, the publisher fills data_parallel_rank with its
// own rank when the batch has none, so it is always written. Block hashes are the low 64 bits
// of the engine's digest as an unsigned integer (maybe_convert_block_hash with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES), raw digest bytes without it (wire.HashBytes32).
//
// SGLang's batch is an array without omit_defaults: attn_dp_rank, which the publisher fills
// with its rank, is always written. Its radix cache records one BlockStored per page, chained
// through parent_block_hash, with hashes the signed int64 of a SHA-256 chain (hash_str_to_int64)
// and medium "GPU", and an AllBlocksCleared whenever the cache is reset: when it is built (at
// start), on /flush_cache and on a weight update. Rank.Batch makes a batch of a rank's events
// as both engines send them, with the rank set. SGLang is reported (llm-d/llm-d-router#2944) to
// have moved its events to tagged maps inside the same array batch (sgl-project/sglang#37482),
// as vLLM did; the SGLang source read here predates that, and the form would be
// wire.EngineForm{MapEvents: true, Hashes: wire.HashInt64}.
//
// Where AppendEngineBatch differs from the engines' bytes, the decoder reads both the same:
// SGLang's positional BlockStored stops after medium (its position 7 holds a metadata map only
// when a cache salt is set), while the encoder writes lora_name there as nil; the encoder writes
// the host tier as "CPU" (vLLM's) where SGLang writes "CPU_PINNED"; the earliest vLLM and SGLang
// releases, whose batch has no rank and whose BlockStored stops after lora_id, are not written.
//
// # Concurrency
//
// An Engine and its Ranks are driven by one goroutine, the test's; each replay socket is served
// by a goroutine of its own, which shares only the replay buffer with it, under a mutex.
package enginetest
