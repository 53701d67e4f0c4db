// Package e2e runs the fleet simulation (bench/fleet) against kvrouterd as a whole: a daemon
// reached over HTTP and NATS, not its router in process. The daemon is a running kvrouterd, or
// one assembled in this process for the run (StartDaemon) as cmd/kvrouterd assembles it.
//
// # What goes over the wire
//
// Remote is the fleet.Router the simulation drives. Workers register with POST /v1/workers (so
// the daemon knows their block size) and leave with DELETE /v1/workers/{id} when the Remote is
// closed. Route requests go in the binary format, and prefill-done and complete calls as plain
// requests, through package client, from the simulation's goroutine: one connection, one call
// at a time, each route call's wall time recorded client-side. Each simulated step's KV events
// are published to the daemon's JetStream stream as an engine-side publisher in Go would
// publish them (ingest.Publisher, kvrouterd's binary event batch), without waiting for the
// store; the daemon applies them when its consumer reads them.
//
// # Pacing
//
// Because events reach the index asynchronously, a route sees the index as the daemon has
// applied it by then, so the simulated clock must be tied to wall time (fleet.Config.Pace):
// at pace P, a simulated second lasts 1/P wall seconds, and the daemon has that long to apply
// a second's worth of events. Routing quality may therefore differ from the in-process
// simulation's; that difference, the route latency over HTTP and the daemon's catching up
// after the last event (Result.Drain) are what a run measures. fleet.Result.MaxLag says
// whether the simulation kept its pace: a lag that grows with the trace means the machine
// (simulation, NATS and daemon together) could not.
//
// # Clean state
//
// A Remote starts each worker afresh (it registers the id, then unregisters and registers it
// again, so a crashed run's blocks and event cursor are gone) and prefixes its request ids with
// a tag of its own, so runs against one daemon do not collide. It only ever unregisters ids it
// could register for the simulation's model, never another model's worker. Run one simulation
// at a time per daemon: simulations share worker ids.
package e2e
