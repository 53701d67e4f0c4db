// Package snapshot stores kvrouterd's index snapshots in a Pebble database and moves them between
// replicas as a portable stream. A snapshot is the caller's opaque records, cut by the caller into
// chunks at record boundaries, each compressed with zstd on its own so that a restore can
// decompress chunks in parallel, plus a manifest: the event-stream sequence the state covers, a
// small opaque info header, and per chunk its sizes and an XXH3-64 checksum.
//
// # Guarantees
//
// A snapshot exists once its manifest is committed, in one synced Pebble batch; before that it
// does not exist, and chunks a crash left without a manifest are deleted when the store is next
// opened. Write keeps the newest Config.Keep committed snapshots and deletes older ones (manifest
// and chunks) in the same batch that commits the new one. Snapshot IDs increase for the life of a
// directory, across restarts.
//
// Nothing corrupt is returned as valid. Latest verifies the manifest's checksum and every chunk's
// checksum before it returns a snapshot, and skips, newest first, every snapshot that fails,
// telling the caller which and why (Skipped). Chunk verifies the checksum again on every read and
// checks that the frame decompresses to exactly the manifest's length. If Pebble cannot open the
// directory at all (a damaged MANIFEST, a truncated table), Open renames it to
// <dir>.corrupt-<unix seconds> (or, where dir cannot be renamed, as a mount point cannot, moves
// its contents into dir/corrupt-<unix seconds>), logs it, starts an empty store, and reports it
// by MovedAside; a
// directory that is merely locked by another process or unreadable for permissions is an error
// and is left alone.
//
// A store opened with Config.ReadOnly writes nothing (Pebble replays its log in memory and
// neither flushes nor compacts; orphan chunks stay until a writable open), refuses Write and
// Receive with ErrReadOnly, and serves every read. It is for a disk with no room left: there a
// writable open fails, or Pebble retries a failed flush forever, or ends the process on a failed
// MANIFEST write (Config.Fatal). Neither a full disk (ENOSPC) nor a read-only filesystem makes
// Open move a directory aside: they say nothing of the files.
//
// Verification is eager because it is cheap next to decompression: reading and hashing the
// compressed bytes runs at memory speed (see snapshot_timing_test.go), while the restore must
// decompress them anyway. Eager checks let a restore start from a snapshot that will not fail
// half-way; the second check in Chunk catches what goes wrong on disk after that, and then the
// caller falls back with Before.
//
// # Concurrency
//
// A Store may be used from any number of goroutines. Write and Receive are serialized by the
// store (one at a time; a second waits); they do their compression and file writing without
// holding anything readers need, and take the store's shared lock only to ingest and commit.
// Latest, Before, List and every Snapshot method may run concurrently with each other and with a
// Write. A Snapshot reads a consistent, pinned view: a Write that prunes it does not disturb it,
// but its disk space is reclaimed only after Close. Close waits for in-flight reads and commits.
//
// # Layout in Pebble
//
// The store owns its directory: Pebble's files, and a subdirectory snapshot-staging/ where Write
// and Receive build one table of chunks that is then ingested (moved into the LSM without going
// through the write-ahead log and memtable, so chunk bytes are written to disk once).
// Keys, with integers big-endian so that keys sort by ID:
//
//	0x00 "format"                      "kvrouterd.snapshot/1": the layout version
//	0x01 id:u64                        manifest (the encoding below)
//	0x02 id:u64                        pending: chunks of id may exist without a manifest
//	0x03 id:u64 index:u32              chunk: the compressed bytes, exactly as in the stream
//
// A write goes: build the chunk table in snapshot-staging/ (synced); set pending (synced batch);
// ingest the table; then one synced batch sets the manifest, deletes pending and deletes the
// snapshots beyond Keep (a range deletion over their chunks). Open deletes the chunks of every
// pending id that has no manifest.
//
// The key order keeps chunk bytes from being rewritten: every small key sorts before every chunk,
// and IDs increase. So an ingested table overlaps nothing and lands in the bottom level; the
// tables Pebble flushes (manifests, pending keys, range deletions of older IDs) span only the
// small keys and deleted chunks, so compacting them down touches no live chunk table; and a
// deleted snapshot's table is dropped whole, unread.
//
// # Manifest encoding
//
// All integers little-endian. The same bytes are the value of the manifest key and the head of the
// portable stream.
//
//	offset    size  field
//	0         4     magic "KVSN"
//	4         2     version, 1
//	6         2     flags, 0 (reserved; a reader rejects other values)
//	8         8     id: the writer's local snapshot ID (informational in a stream)
//	16        8     created: Unix time in nanoseconds, signed
//	24        8     stream_seq: the last event-stream sequence the state includes
//	32        8     raw_bytes: sum of raw_len over chunks
//	40        8     stored_bytes: sum of stored_len over chunks
//	48        4     chunk_count N, at most MaxChunks
//	52        4     info_len L, at most MaxInfo
//	56        L     info: opaque to this package
//	56+L      16·N  per chunk i: raw_len u32 (at most MaxChunk), stored_len u32
//	                (at most raw_len + raw_len/1024 + 64), checksum u64
//	56+L+16N  8     manifest checksum
//
// A chunk's checksum is XXH3-64 (seed 0) of its stored bytes; the manifest checksum is XXH3-64
// (seed 0) of the manifest's bytes before it. Stored bytes are zstd frames (RFC 8878) that
// decompress to exactly raw_len bytes; an empty chunk is one empty frame. Frames carry no zstd
// content checksum (the chunk checksum covers the compressed bytes).
//
// # Portable stream
//
// The stream, served by GET /v1/snapshot and read by Receive, is
//
//	manifest ‖ stored bytes of chunk 0 ‖ … ‖ stored bytes of chunk N-1
//
// and then the end of the stream: no framing beyond the manifest's lengths, no trailing bytes. A
// reader reads the 56-byte fixed head, then L + 16·N + 8 more bytes, checks the manifest
// checksum, then reads each chunk's stored_len bytes and checks its checksum. Receive also
// decompresses every chunk to check its length, and stores the snapshot only when all of it
// verified, under a new local ID (newer than every snapshot it holds), keeping created,
// stream_seq and info. A stream that fails any check leaves the receiving store as it was.
package snapshot
