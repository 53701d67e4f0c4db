// Package replica shares the active load between router replicas. Replicas behind one event
// stream hold the same index, but each books only the requests it routes. A Sharer tells the
// other replicas of every request this one books, finishes prefilling and completes, and
// applies theirs to its router (router.Router.BookRemote and the other Remote methods), so that
// every replica's cost function counts the whole fleet's requests in each worker's load.
//
// # What replicas exchange
//
// One binary message per operation (Msg; magic "KVRA"; layout, limits and validation in
// SPEC.md): booked (model, worker, the request's block hashes, its prefill tokens and a time to
// live), prefill done, completed. Expiry is not exchanged: each replica expires its copy of a
// booking after the time to live the booking carries.
//
// # Subjects
//
// Plain NATS, not the JetStream event stream: the messages matter only while their requests
// run. Replica R publishes on <prefix>.active.<R> and every Sharer subscribes to
// <prefix>.active.*, skipping its own subject before decoding (on a connection of its own
// without echo, its own messages do not even come back). A replica id is 1 to 64 bytes of
// [A-Za-z0-9_-], random per process unless configured. Two live processes must not share one:
// each would skip the other's messages.
//
// # Order and loss
//
// NATS keeps one publisher's messages in order, so a booking reaches the others before its
// prefill done and its completion. Messages of distinct replicas have no order between them,
// and need none: their requests are distinct. Nothing is acknowledged or sent again. A booking
// lost (a slow subscriber, a reconnect with a full buffer, a replica started after it) is
// missing from the receiver's view until its completion comes, which is then counted as
// unknown_request; a completion lost leaves the remote booking to expire.
//
// # Concurrency
//
// A Sharer's methods are safe for concurrent use. The router calls Booked, PrefillDone and
// Completed from its request goroutines, many at once; they neither wait for the network nor,
// once warm, allocate. NATS hands the other replicas' messages to one goroutine, one at a time,
// and the Sharer applies each to its Sink before the next; Close waits (up to 5 s) for the one
// being applied. Append and Decode are safe for concurrent use on distinct values; a Msg decoded
// into belongs to one goroutine.
package replica
