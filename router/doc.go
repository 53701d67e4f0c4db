// Package router is kvrouterd's engine room without the network: the models and their indexes,
// the worker registry, event application through the shards, and route and match requests scored
// by package scoring. The HTTP server, the benchmarks and the fleet simulator all drive a Router.
//
// A Router is safe for concurrent use. Route and Match read the indexes lock-free and touch no
// lock but the load tracker's when they book a request; the registry changes under one mutex and
// publishes each model's worker list copy-on-write, so requests never wait for it.
package router
