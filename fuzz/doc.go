// Package fuzz holds kvrouterd's cross-package fuzz targets: each drives several packages as the
// daemon wires them (wire decode → shard apply → snapshot → restore → match; HTTP bytes through
// the whole server; engine msgpack through the ingest path to the index) and checks the outcome
// against a reference, internal/refmodel or the invariants the API promises, not merely that
// nothing panicked. The fuzz target of each decoder stays beside its decoder, as is the Go
// convention (wire, radix, shard, server); this package has no code outside its tests.
package fuzz
