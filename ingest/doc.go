// Package ingest brings KV events into the router from NATS JetStream: an embedded NATS server
// (the default) or an external one, the subject scheme publishers use, and the consumer that
// reads the event stream from a known sequence.
//
// # Subjects
//
// Events of worker W of model M go to
//
//	<prefix>.events.<model token>.<W>
//
// and its load reports to <prefix>.load.<model token>.<W>, where the prefix is "kvr" by default,
// W is the worker id in decimal, and the model token is the model name with every byte outside
// [A-Za-z0-9_-] written as %XX (upper-case hex): "meta-llama/Llama-3.1-8B" becomes
// "meta-llama%2FLlama-3%2E1-8B". The stream (KVR_EVENTS by default) holds <prefix>.events.>.
//
// # Payloads on the event subjects
//
//   - kvrouterd's binary event batch (wire/SPEC.md, section 5), recognised by its magic "KVRW".
//     Its worker and model must be the subject's.
//   - A vLLM or SGLang KV-event batch exactly as the engine publishes it on ZMQ (the msgpack
//     third frame; wire/SPEC.md, "Engine event batches"). Worker and model come from the
//     subject. The optional header Kvr-Rank sets the data-parallel rank of a batch that does
//     not state one. Engines do not number events: such events carry no event ids, and their
//     order is the stream's.
//
// # Load reports
//
// A JSON object per report (router.LoadReport: worker_id, dp_rank, model, active_blocks,
// waiting_requests, kv_usage, max_batched_tokens), published on the load subject with plain NATS
// (not kept in the stream). A worker that sends them is dropped from routing when silent past
// the daemon's --worker-timeout.
//
// # Load sharing between replicas
//
// Replicas on one NATS tell each other of every request they book, finish prefilling and
// complete, on plain NATS subjects <prefix>.active.<replica id>: package replica (its SPEC.md
// has the messages). Its connection comes from Stream.Dial; the embedded server lets the
// kvrouterd user, and not the publisher, use those subjects.
//
// # Who may connect to the embedded server
//
// Only two users unless EmbeddedConfig.NoAuth: kvrouterd (every right) and publisher (publish
// events and load reports, nothing else), whose passwords live in the server's directory
// (auth.go). The Consumer watches the stream: a deleted one is created again, a changed one set
// back, and Health says when neither is possible.
//
// Resuming the event stream after a snapshot (ConsumerConfig.StartSeq) and clearing the index
// when sequences were lost (ConsumerConfig.OnGap) are the daemon's restart path.
package ingest
