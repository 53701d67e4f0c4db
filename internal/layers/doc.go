// Package layers holds no code: its test enforces the direction of imports between kvrouterd's
// packages, reading `go list` and failing when a package imports one of its own layer or above,
// unless the table in the test names that pair.
//
// Bottom to top:
//
//  1. internal/ helpers, and kvevent (the event vocabulary, importing nothing of the project).
//  2. radix (the index), approx, scoring, snapshot, and wire (codecs: only kvevent and internal/).
//  3. shard (event application), router (one request's path), and the test-only fake engine
//     (internal/enginetest), which writes its payloads with wire.
//  4. ingest, replica (load sharing between replicas), server, client (on wire only), and the
//     test-only reference model.
//  5. daemon (the assembly of the parts, their start and stop order).
//  6. cmd/kvrouterd (flags and environment; calls daemon).
//  7. bench/ and everything under it, and cmd/kvr-mocker (the mock engine's command, which runs
//     bench/mocker), kept out of the daemon's dependency tree.
//
// A new package has no layer until it is added to the test's table; the test says so. Only what
// a package's own files import is checked, not its tests' imports: a test may reach across a
// layer (replica's tests read ingest.DefaultPrefix), since no binary links it.
package layers
