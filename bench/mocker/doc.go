// Package mocker is a mock inference engine, in the spirit of NVIDIA Dynamo's mocker: one
// simulated worker that looks like a vLLM server to a client and to kvrouterd, for end-to-end
// tests, demos and users without GPUs. cmd/kvr-mocker runs one per process.
//
// # Engine
//
// The engine is bench/sim's Worker — the same scheduler, KV cache (prefix caching, LRU
// eviction) and step-time model as the fleet simulations — driven in real time by one
// goroutine: it takes the submissions and aborts handed to it, runs a Step, sleeps the step's
// simulated duration divided by Config.Speedup (on a schedule that absorbs timer lateness),
// then publishes the step's KV events and reports each request's new token to the handler
// waiting for it (sim.StepOutput.Emitted). A request whose client is gone is aborted
// (sim.Worker.Abort), as vLLM's server aborts a request on disconnect: the handler waiting for
// it looks at its connection every 20 ms (internal/peer), and a stream's write failing says so
// too. Its slot is freed and its blocks released as a finished request's are, whether it was
// running or still queued. A stream's headers are sent at once, before its first token, as
// Starlette's StreamingResponse sends them, so that a client can give up on a queued request by
// closing its connection.
//
// # Tokenizer and chat template
//
// No model files: AppendTokens turns text into ids by a fixed rule. The special tokens
// <|pad|> 0, <|bos|> 1, <|eos|> 2, <|im_start|> 3, <|im_end|> 4 are recognized anywhere in the
// text; white space separates pieces and is dropped; a run of letters, digits and underscores
// is one piece and any other character a piece of its own; a piece among 100 fixed words has
// the id 16 + its index, any other one 1024 + FNV-1a-64(piece) mod 30976 (so every id is below
// VocabSize, 32000). A completion's string prompt gets <|bos|> first unless add_special_tokens
// is false; a prompt given as token ids is used as is.
//
// Chat messages are rendered with ChatML — "<|im_start|>{role}\n{content}<|im_end|>\n" per
// message, then "<|im_start|>assistant\n" when add_generation_prompt (the default) — and the
// text tokenized by the same rule (no <|bos|> unless add_special_tokens, as for vLLM's chat
// requests). /tokenize and the chat endpoint share that code (AppendChat), so the ids /tokenize
// returns are exactly the prompt the engine caches and publishes.
//
// Output token i of a request is the fixed word (OutputSeed(prompt) + i) mod 100, the seed an
// FNV-1a hash of the prompt ids, so that equal prompts get equal answers; its text is the
// word, after a space from the second token on. There is no end-of-sequence: a request runs to
// its max_tokens (finish_reason "length") unless a stop condition ends it first.
//
// # Stop conditions
//
// stop (a string or a list), stop_token_ids and include_stop_str_in_output act as in vLLM
// (vllm/v1/engine/detokenizer.py and the scheduler's check_stop; see detokenizer): the token
// that completes a stop string, or is a stop token, ends the request with finish_reason "stop"
// and stop_reason the string (or the token id); the text ends before the stop string (after it
// with include_stop_str_in_output), a stop token's text is left out, usage counts every token
// generated, the stopping one included. A stream sends one event per token but holds back the
// last (longest stop string − 1) characters while the request runs, so some events carry an
// empty text. Since the output is known in advance, the engine is asked for exactly the tokens
// vLLM's engine would have generated before stopping: the request finishes there, freeing its
// slot, and counts as finished, not aborted.
//
// # Errors and failures
//
// Errors have vLLM's current shape, {"error":{"message","type","param","code"}} (a stream that
// fails after its headers writes it as an event, spaced as Python's json.dumps writes it, then
// [DONE]). Config.FailRate answers a random fraction of the valid generate requests 500
// InternalServerError before they reach the engine; Config.DieAfter crashes the mocker when
// the generate request past the first DieAfter arrives (Mocker.Died), for end-to-end tests of
// what stands in front of engines.
//
// # KV events
//
// Each step's events (sim's: engine hash = the router's sequence hash of the prompt prefix,
// Stored events carrying the blocks' token ids) are one message [topic "", seq 8 bytes
// big-endian from 0, msgpack payload], the payload written by wire.AppendEngineBatch in vLLM's
// form (Config.EventsForm), data_parallel_rank 0; a step without events publishes nothing. The
// optional replay ROUTER socket keeps the last 10,000 batches and answers ["", start] as vLLM's
// does (internal/enginetest documents the protocol).
//
// # Disaggregated serving
//
// Every mocker speaks vLLM's kv_transfer_params as vLLM does with NixlConnector and kv_role
// kv_both; Config.Role (prefill, decode or both) is only what it registers with kvrouterd.
//
// A prefill request sets do_remote_decode (vLLM's toy proxy and Dynamo's frontend send the
// prompt with max_tokens 1, not streamed). It runs as any request, but its blocks stay pinned
// when it finishes (sim.Request.Hold), and its answer carries what a decode worker needs to read
// them: do_remote_prefill true, remote_engine_id (this mocker's), remote_request_id (the
// answer's id), remote_block_ids (the pinned block slots, one per prompt block), remote_host
// and remote_port (this mocker's HTTP API, which stands in for NIXL's side channel) and tp_size
// 1. Blocks nobody reads are freed after Config.KVTransferTimeout (vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s), in simulated time.
//
// A decode request carries those parameters with do_remote_prefill. Before it is queued, the
// decode mocker reads from the prefill mocker the blocks past its own prefix-cache hit (the tail
// of remote_block_ids, as NixlConnector reads only the blocks it had to allocate): POST
// /kv_transfer/read names them (the prefill mocker checks it holds them), the read takes
// blocks × block size × Config.KVBytesPerToken bytes over Config.KVTransferGbps plus
// Config.KVTransferLatency (simulated time; slept divided by the speedup), and POST
// /kv_transfer/release then frees them on the prefill side, as NIXL's completion notice does.
// The request then runs with its prompt's KV in place (sim.Request.Remote): the received full
// blocks are stored and published as Stored events, as vLLM caches received blocks, and only
// the last prompt token is computed, for the first output token; usage counts the received
// tokens as cached, as vLLM does. A read that fails (the prefill mocker gone, the transfer
// unknown or expired, blocks of another size) is counted and the prompt computed here
// instead, vLLM's default kv_load_failure_policy "recompute". Unlike vLLM, the decode mocker
// does not hold its blocks during the read: the request is queued once they have arrived.
//
// Stats.Transfers and /metrics (kvr_mocker_kv_transfer_*) count both sides: blocks held, sent
// and expired; transfers received, their blocks, bytes and modelled time, and failures.
//
// # Concurrency
//
// A Mocker's methods are safe for concurrent use. The engine goroutine is the only one that
// touches the worker; HTTP handlers (one goroutine per request, fasthttp's) queue work for it
// under a mutex and wait on their request's wake-up channel; the replay socket has a goroutine
// of its own that shares only the kept batches with the engine, under a mutex.
package mocker
