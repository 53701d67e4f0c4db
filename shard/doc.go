// Package shard applies KV events to the prefix index (package radix) in order per worker.
//
// A Set runs N shard goroutines. A worker belongs to one shard for life, chosen by a hash of its
// id, so all events of all its data-parallel ranks apply in the order they were enqueued, and
// each shard is the only writer of its workers' state: per (worker, rank) the map from engine
// block hash to the router's sequence hash (removals name blocks by engine hash only), duplicate-
// content counts, the event-id cursor, and the worker's slot in the index. Events of a lower
// storage tier (host, disk, external) go to that tier's index and have an engine map of their
// own per rank, so that an offloaded copy never touches the device's.
//
// Each shard's queue is bounded: a producer that outruns it waits in Enqueue (TryEnqueue refuses
// instead), so memory never grows without limit and nothing is dropped silently. Barrier waits
// until everything enqueued before it is applied, for tests, benchmarks and snapshots.
//
// Every event yields an Outcome. Anomalies — a gap or duplicate in event ids, a stored event
// whose parent block is unknown (a missed event), a block-size or token-count mismatch, a
// removal of unknown blocks, the residency budget reached — are counted in Stats and passed to
// the Observer; none is applied in a way that could make the index overstate a worker's cache.
//
// The Applier holds the event semantics and can be used without goroutines (one goroutine at a
// time).
package shard
