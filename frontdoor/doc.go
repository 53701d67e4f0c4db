// Package frontdoor is kvrouterd's OpenAI-compatible front door: clients send OpenAI requests
// (/v1/completions, /v1/chat/completions, /v1/models) to it, and each is tokenized as its engine
// tokenizes it, routed with the router's bookings exactly as /v1/route routes, and forwarded to
// the chosen worker's OpenAI API (its registered http_endpoint), whose answer streams back to the
// client unchanged.
//
// # A request's path
//
//  1. Token ids. A /v1/completions prompt of token ids is used as it is. Otherwise the front
//     door asks a worker of the model for them: vLLM's and SGLang's POST /tokenize, with the
//     request's messages (the engine applies its own chat template, with the request's
//     add_generation_prompt, continue_final_message, chat_template, chat_template_kwargs and
//     tools) or its prompt. A /v1/completions request then goes on with its prompt replaced by
//     those ids, so that the engine does not tokenize it twice.
//  2. Route. The ids are routed as /v1/route routes them (the same cost, modes and bookings),
//     under a request id of the front door's. The chosen rank is named to the engine in the
//     X-Data-Parallel-Rank header, which vLLM and SGLang honour.
//  3. Forward. The request goes to the worker's http_endpoint and path, over a pooled
//     connection; the answer's status, content type and body go back as they come, a streamed
//     body chunk by chunk as the engine flushes it.
//  4. The booking follows the request: its prefill is done at the answer's first body bytes
//     (the first token: an engine sends nothing of the body before it), the request complete
//     at its end, and freed as well when the client goes away, the worker fails or the request
//     outlives Config.Timeout. None is left behind.
//  5. Migration. A worker that refuses the connection or answers 5xx before any body byte is
//     given up for this request: the booking is freed and the request routed again among the
//     model's other workers, up to Config.Retries times (Dynamo's migration). After the first
//     byte an error ends the client's answer where it stands.
//  6. Disaggregation. A request asks for a disaggregated decision while its model has a prefill
//     worker, or disaggregation is enforced (Router.Disaggregates). When the router splits it, the prefill stage runs
//     first, as Dynamo's frontend runs it with vLLM: the request, with max_tokens 1, not
//     streamed, and kv_transfer_params asking for a remote decode (do_remote_decode), goes to
//     the prefill worker; once it answers, the prefill stage's booking is released and the
//     client's request, carrying the answer's kv_transfer_params, goes to the decode worker as
//     in step 3. A failed prefill stage leaves the decode worker to serve the request whole; a
//     client leaving during it cancels it and frees both bookings.
//
// Errors are OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with the status;
// each is counted in kvrouterd_frontdoor_requests_total and logged.
//
// A Door is safe for concurrent use; fasthttp runs each request on a goroutine of its own.
package frontdoor
