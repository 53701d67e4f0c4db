// Package ui is the daemon's status page: GET /ui, a static page (HTML, CSS and JavaScript
// embedded in the binary, no external asset) that polls one read-only JSON document, GET
// /ui/status.json, and shows the workers with their state and last event, the index's size, the
// memory, the hit rate, the events per second, the queues and the snapshot age.
//
// The document is built from state the daemon keeps anyway: the router's counters, listings and
// queue statistics, the HTTP server's hit-rate histogram, the snapshot persister's last time.
// Nothing on the route path changes for it. A document is computed at most once per MaxAge and
// served to every poller meanwhile, so that open pages cost the shards one visit per MaxAge
// whatever their number.
//
// Everything that comes from workers (models, endpoints, problems) reaches the page as JSON
// strings and is set as text, never parsed as HTML; the page is served with a Content-Security-
// Policy that allows only its own script, style and document.
package ui
