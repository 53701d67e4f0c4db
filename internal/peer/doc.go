// Package peer tells whether the client at the other end of a connection has gone, without
// reading anything from it: a request waiting in the router queue has no other way to learn
// that its client left (fasthttp reads a connection only between requests).
//
// Gone is safe for concurrent use with the connection's own reads and writes.
package peer
