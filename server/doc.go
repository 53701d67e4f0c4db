// Package server is kvrouterd's HTTP API over fasthttp: route and match in the binary wire
// format or JSON, request lifecycle calls, KV events, the worker registry, NVIDIA Dynamo's
// standalone-indexer endpoints, health and Prometheus metrics.
//
// The request's Content-Type selects the format: application/x-kvrouterd for package wire's
// binary messages, JSON otherwise; the answer comes in the same format. Every malformed request
// gets a 4xx status and a JSON body {"error": …, "field": …, "offset": …} naming what was wrong,
// is counted in kvrouterd_http_rejected_total by endpoint and reason, and is logged; it changes
// nothing.
//
// A Server is safe for concurrent use; fasthttp runs each request on its own goroutine. Handlers
// keep nothing of a request once they return.
package server
