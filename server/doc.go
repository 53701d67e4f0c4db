// Package server is kvrouterd's HTTP API over fasthttp: route and match in the binary wire
// format or JSON, request lifecycle calls, KV events, the worker registry, NVIDIA Dynamo's
// standalone-indexer endpoints, health and Prometheus metrics; and, on a listener of its own
// (ServeSelection), NVIDIA Dynamo's selection service over the same router (selection.go).
//
// The request's Content-Type selects the format: application/x-kvrouterd for package wire's
// binary messages, JSON otherwise; the answer comes in the same format. Every malformed request
// gets a 4xx status and a JSON body {"error": …, "field": …, "offset": …} naming what was wrong,
// is counted in kvrouterd_http_rejected_total by endpoint and reason, and is logged; it changes
// nothing. The selection service answers Dynamo's {"error": msg} instead.
//
// Open connections are bounded in total and per client address (Config.MaxConns,
// MaxConnsPerIP). At the total limit a new connection takes the place of the one that has waited
// longest for a request, so that a health probe gets in while idle clients hold every slot; it
// is refused with 503 when none is idle, or past its address's limit; ServeSelection's
// connections count in the same limits. A process out of files does not stop Serve: accept
// closes an idle connection or waits and tries again. Refusals, evictions and accept errors are
// counted (kvrouterd_http_connections_*, kvrouterd_http_accept_errors_total) and logged a line
// per kind per 10 s.
//
// A Server is safe for concurrent use; fasthttp runs each request on its own goroutine. Handlers
// keep nothing of a request once they return.
package server
