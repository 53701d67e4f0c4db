package ui

import (
	"embed"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/valyala/fasthttp"
)

// Config says where the page's document comes from. Zero values take the defaults listed.
type Config struct {
	// Router is the daemon's router: its counters, listings and queues. Required.
	Router *router.Router
	// HitRate, if set, returns the sum of routed requests' hit rates and how many it sums
	// (server.Server.HitRate).
	HitRate func() (sum float64, requests uint64)
	// LastSnapshot, if set, returns when the newest snapshot written or restored was taken, zero
	// before any; nil says that the daemon keeps no snapshots.
	LastSnapshot func() time.Time
	// RouterQueue says that the router queue is on (--router-queue-threshold).
	RouterQueue bool
	// Started is when the daemon started, for its uptime (the time New is called).
	Started time.Time
	// MaxAge is how long a document is served again before it is computed anew (500 ms).
	MaxAge time.Duration
	// MaxWorkers bounds the ranks the document lists (1,000); it counts them all.
	MaxWorkers int
}

// Page serves the status page and its document. Safe for concurrent use: concurrent requests
// for the document within MaxAge share one computation.
type Page struct {
	cfg Config

	mu      sync.Mutex
	doc     []byte    // REQUIRES mu: the last document, JSON
	docTime time.Time // REQUIRES mu: when doc was computed
}

// New returns the page of cfg.Router.
func New(cfg Config) *Page {
	if cfg.Started.IsZero() {
		cfg.Started = time.Now()
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = 500 * time.Millisecond
	}
	if cfg.MaxWorkers <= 0 {
		cfg.MaxWorkers = 1000
	}
	return &Page{cfg: cfg}
}

//go:embed assets
var assets embed.FS

// file is one embedded asset and its content type.
type file struct {
	body []byte
	typ  string
}

var files = func() map[string]file {
	read := func(name string) []byte {
		b, err := assets.ReadFile("assets/" + name)
		if err != nil {
			panic("ui: " + err.Error()) // embedded at build time: cannot be missing
		}
		return b
	}
	return map[string]file{
		"/ui/":          {read("index.html"), "text/html; charset=utf-8"},
		"/ui/app.js":    {read("app.js"), "text/javascript; charset=utf-8"},
		"/ui/style.css": {read("style.css"), "text/css; charset=utf-8"},
	}
}()

// csp lets the page load its own script, style and document and nothing else: no inline script,
// no other origin, no frame around it. The empty data: icon keeps browsers from asking for
// /favicon.ico.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handle serves GET /ui (a redirect to /ui/), /ui/ (the page), its script and style, and
// /ui/status.json (the document). The server routes only GETs of /ui and /ui/… here.
func (p *Page) Handle(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	path := string(ctx.Path())
	switch path {
	case "/ui":
		// Relative, so that a proxy serving the daemon under a prefix keeps it; the page's
		// own links are relative for the same reason.
		h.Set("Location", "ui/")
		ctx.SetStatusCode(fasthttp.StatusMovedPermanently)
		return
	case "/ui/status.json":
		h.Set("Cache-Control", "no-store")
		ctx.SetContentType("application/json")
		ctx.SetBody(p.document(time.Now()))
		return
	}
	f, ok := files[path]
	if !ok {
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":"no such file of the status page","field":"path"}` + "\n")
		return
	}
	h.Set("Content-Security-Policy", csp)
	ctx.SetContentType(f.typ)
	ctx.SetBody(f.body)
}

// document returns the document, computed at now unless the last one is younger than MaxAge.
// The bytes returned are never changed: callers may keep them.
func (p *Page) document(now time.Time) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.doc != nil && now.Sub(p.docTime) < p.cfg.MaxAge && !now.Before(p.docTime) {
		return p.doc
	}
	b, err := json.Marshal(p.status(now))
	if err != nil { // our own values always marshal
		b = []byte(`{"error":` + strconv.Quote(err.Error()) + `}`)
	}
	p.doc, p.docTime = append(b, '\n'), now
	return p.doc
}

// Status computes the document at now (not the one served again within MaxAge).
func (p *Page) Status(now time.Time) *Status { return p.status(now) }
