// Package daemon assembles kvrouterd from its parts and runs it: the one place that knows the
// order in which they start and stop. cmd/kvrouterd parses the configuration (flags and KVR_*
// variables, through Config.Flags) and calls Run.
//
// # Start
//
// Start takes each step in turn and fails at once, with an error that begins with the flag to
// change:
//
//  1. bind --http-addr, and --selection-addr if set (connections wait in the backlog until the
//     API and the selection service serve);
//  2. create --data-dir and check it is writable; check the disk's free space (--min-free-disk);
//  3. open the snapshot store in --data-dir/snapshots (held by one process at a time), fetch a
//     peer's newest snapshot (--bootstrap-from), restore the newest that verifies;
//  4. subscribe to the engines' ZMQ publishers (--zmq, and those restored workers registered);
//  5. start the embedded NATS server (--nats-listen) or connect to --nats-url, whose first
//     connection must succeed, and read the event stream after the restored snapshot;
//  6. share load with the other replicas (--share-load, --replica-id);
//  7. the background work (periodic snapshots, the catching-up check), then the HTTP API and
//     the selection service (one server.Server, the same router).
//
// Every step that holds something (a port, a file, a goroutine) pushes its undoing on one stack.
// A failed start unwinds the stack before returning its error, and so does the end of Wait: the
// server stops taking requests on both listeners and finishes those in flight, then the background work stops,
// load sharing, the event stream and the engine subscriptions close, the last snapshot is
// written (a graceful shutdown only), the router applies every event it accepted and closes,
// and the snapshot store and the listeners close. Nothing started is left running.
//
// # Concurrency
//
// Start and Wait are for one goroutine, which owns the Daemon; Daemon.Addr and
// Daemon.SelectionAddr are safe from any.
// The parts' own concurrency contracts are in docs/architecture.md.
package daemon
