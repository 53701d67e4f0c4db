package ui_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/kvrouterd/kvrouterd/daemon"
	"github.com/kvrouterd/kvrouterd/internal/extbin"
)

// chromium returns Debian's chromium; without it the test skips, or fails under
// KVR_REQUIRE_EXTERNAL=1 (extbin).
func chromium(t *testing.T) string {
	t.Helper()
	return extbin.Find(t, "chromium", "the status page is not tested in a browser", "/usr/bin/chromium", "chromium", "chromium-browser")
}

// browser starts a headless chromium for the test, with a fresh profile, and returns its
// context (bounded by d) and the errors its pages have reported so far: uncaught exceptions,
// console errors and the browser's own error entries (a Content-Security-Policy violation, a
// failed load).
func browser(t *testing.T, d time.Duration) (context.Context, func() []string) {
	t.Helper()
	exe := chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	// What chromium needs as root in a container, and no traffic of its own.
	actx, acancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900))
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		bcancel()
		acancel() // waits for the browser to exit, before its profile directory is removed
		cancel()
	})
	var mu sync.Mutex
	var errs []string
	// Listen starts the browser; the log domain is on from the start.
	err := chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			errs = append(errs, fmt.Sprintf("exception: %s at %s:%d", msg, d.URL, d.LineNumber))
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				var args []string
				for _, a := range ev.Args {
					args = append(args, cmp.Or(a.Description, string(a.Value)))
				}
				errs = append(errs, "console.error: "+strings.Join(args, " "))
			}
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError {
				errs = append(errs, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
			}
		}
	})
	if err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	return bctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(errs)
	}
}

// shown is what the status page shows, read from its DOM.
type shown struct {
	Title   string            `json:"title"`
	URL     string            `json:"url"`
	Updated string            `json:"updated"`
	Stale   bool              `json:"stale"`
	Values  map[string]string `json:"values"` // each tile's value, by its id
	Subs    map[string]string `json:"subs"`   // each tile's line below it, by its id
	Models  [][]string        `json:"models"` // the models table's cells
	Workers [][]string        `json:"workers"`
	Images  int               `json:"images"`
	Marker  bool              `json:"marker"` // set by the test: gone if the page reloaded
}

const readPage = `(() => {
	const cells = (id) => [...document.querySelectorAll("#" + id + " tr:not(.empty)")].map(tr => [...tr.cells].map(td => td.textContent));
	const byId = (sel) => Object.fromEntries([...document.querySelectorAll(sel)].filter(e => e.id).map(e => [e.id, e.textContent]));
	const up = document.getElementById("updated");
	return {
		title: document.title, url: location.href, updated: up.textContent, stale: up.className === "stale",
		values: byId(".tile .value"), subs: byId(".tile .sub"),
		models: cells("models"), workers: cells("workers"),
		images: document.images.length, marker: window.kvrTestMarker === 1,
	};
})()`

// waitFor reads the page until ok accepts it, and fails the test with what the page showed
// last if ctx ends first.
func waitFor(t *testing.T, ctx context.Context, what string, ok func(*shown) error) *shown {
	t.Helper()
	for {
		s, err := chromedp.Run(ctx, chromedp.Evaluate[shown](readPage))
		if err == nil {
			if err = ok(&s); err == nil {
				return &s
			}
		}
		select {
		case <-ctx.Done():
			b, _ := json.MarshalIndent(s, "", "  ")
			t.Fatalf("%s: %v\nthe page showed:\n%s", what, err, b)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// within bounds one step's wait.
func within(t *testing.T, ctx context.Context, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(ctx, d)
	t.Cleanup(cancel)
	return c
}

// TestPageInChromium opens /ui in headless chromium against a whole daemon: the page renders
// the numbers and an empty worker table, then, without a reload, shows a worker registered,
// its events applied and routes served (hit rate, events per second, the snapshot's age), a
// second worker's arrival and the first one's removal; a hostile model name stays text; the
// page raises no error.
func TestPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and a browser")
	}
	bctx, errs := browser(t, 90*time.Second)
	base := startDaemon(t, func(c *daemon.Config) { c.SnapshotInterval = 200 * time.Millisecond })

	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/ui")); err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, within(t, bctx, 20*time.Second), "the first render", func(s *shown) error {
		switch {
		case !strings.HasPrefix(s.Updated, "updated "):
			return fmt.Errorf("not updated: %q", s.Updated)
		case s.Values["events-rate"] == "—":
			return fmt.Errorf("no rate yet (it needs two documents)")
		}
		return nil
	})
	if s.URL != base+"/ui/" {
		t.Errorf("the page is at %s, want %s/ui/ (the redirect of /ui)", s.URL, base)
	}
	want := map[string]string{"workers-count": "0", "index-blocks": "0", "hit-rate": "—", "events-rate": "0.0",
		"routes-rate": "0.0", "router-queue": "off", "event-queue": "0"}
	for id, v := range want {
		if s.Values[id] != v {
			t.Errorf("tile %s shows %q, want %q", id, s.Values[id], v)
		}
	}
	if m := s.Values["memory-heap"]; !strings.HasSuffix(m, "MiB") && !strings.HasSuffix(m, "KiB") {
		t.Errorf("memory tile shows %q", m)
	}
	if len(s.Workers) != 0 || len(s.Models) != 0 || s.Title != "kvrouterd status" {
		t.Errorf("a new daemon's page lists workers %v, models %v, title %q", s.Workers, s.Models, s.Title)
	}
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](`window.kvrTestMarker = 1`)); err != nil {
		t.Fatal(err)
	}

	model, _ := json.Marshal(hostileModel)
	post(t, base+"/v1/workers", `{"worker_id":`+bigWorker+`,"model":`+string(model)+`,"dp_ranks":[0,1],"http_endpoint":"http://10.0.0.7:8000"}`, http.StatusCreated)
	// Twenty events: the events per second stay above 0.0 for the page's 10 s window.
	var evs []string
	for i := range 20 {
		evs = append(evs, fmt.Sprintf(`{"type":"stored","event_id":%d,"block_hashes":[%d],%s"token_ids":[%s]}`,
			i+1, 100+i, map[bool]string{true: "", false: fmt.Sprintf(`"parent_hash":%d,`, 99+i)}[i == 0], tokens(1+16*i, 16)))
	}
	post(t, base+"/v1/events", `{"worker_id":`+bigWorker+`,"events":[`+strings.Join(evs, ",")+`]}`, http.StatusOK)
	for i := range 3 {
		post(t, base+"/v1/route", fmt.Sprintf(`{"request_id":"r%d","model":%s,"token_ids":[%s]}`, i, model, tokens(1, 320)), http.StatusOK)
	}
	s = waitFor(t, within(t, bctx, 20*time.Second), "the worker, its events and routes, live", func(s *shown) error {
		switch {
		case len(s.Workers) != 2:
			return fmt.Errorf("%d worker rows", len(s.Workers))
		case s.Workers[0][6] != "20":
			return fmt.Errorf("rank 0 shows %s cached blocks", s.Workers[0][6])
		case s.Values["hit-rate"] == "—", s.Values["events-rate"] == "0.0", s.Subs["routes-sub"] != "3 routed, 3 active":
			return fmt.Errorf("hit rate %q, events/s %q, routes %q", s.Values["hit-rate"], s.Values["events-rate"], s.Subs["routes-sub"])
		case s.Values["snapshot-age"] == "none":
			return fmt.Errorf("no snapshot shown")
		}
		return nil
	})
	if !s.Marker {
		t.Error("the page reloaded to show the change")
	}
	// model, worker, rank, role, state, last event, cached, active blocks, requests, lag, endpoint
	for i, want := range [][]string{
		{hostileModel, bigWorker, "0", "both", "stream", "", "20", "20", "3", "0", "http://10.0.0.7:8000"},
		{hostileModel, bigWorker, "1", "both", "stream", "", "0", "0", "0", "0", "http://10.0.0.7:8000"},
	} {
		got := s.Workers[i]
		if len(got) != len(want) {
			t.Fatalf("row %d: %q", i, got)
		}
		for c := range want {
			if c != 5 && got[c] != want[c] {
				t.Errorf("row %d column %d: %q, want %q", i, c, got[c], want[c])
			}
		}
	}
	if last := s.Workers[0][5]; !strings.HasSuffix(last, " ago · #20") {
		t.Errorf("rank 0's last event shows %q, want its age and #20", last)
	}
	if s.Values["workers-count"] != "1" || s.Subs["workers-sub"] != "2 ranks, 1 model" || s.Values["index-blocks"] != "20" ||
		s.Values["hit-rate"] != "100.0 %" || s.Subs["events-sub"] != "20 applied" {
		t.Errorf("tiles %v, %v", s.Values, s.Subs)
	}
	if r, err := strconv.ParseFloat(s.Values["events-rate"], 64); err != nil || r <= 0 {
		t.Errorf("events/s shows %q", s.Values["events-rate"])
	}
	if len(s.Models) != 1 || s.Models[0][0] != hostileModel || s.Models[0][3] != "20" {
		t.Errorf("models table %q", s.Models)
	}
	if s.Images != 0 || s.Title != "kvrouterd status" {
		t.Errorf("the model name was parsed as HTML: %d images, title %q", s.Images, s.Title)
	}

	post(t, base+"/v1/workers", `{"worker_id":42,"model":"Qwen/Qwen3-8B","dp_ranks":[0],"endpoint":"tcp://10.0.1.42:5557"}`, http.StatusCreated)
	if code, _, body := call(t, "DELETE", base+"/v1/workers/"+bigWorker, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE the first worker: %d %s", code, body)
	}
	s = waitFor(t, within(t, bctx, 20*time.Second), "the second worker in, the first out, live", func(s *shown) error {
		if len(s.Workers) != 1 || s.Workers[0][1] != "42" {
			return fmt.Errorf("worker rows %q", s.Workers)
		}
		return nil
	})
	if got := s.Workers[0]; got[0] != "Qwen/Qwen3-8B" || got[10] != "tcp://10.0.1.42:5557" || got[6] != "0" {
		t.Errorf("the second worker's row: %q", got)
	}
	if s.Values["index-blocks"] != "0" || !s.Marker || s.Stale {
		t.Errorf("after the first worker left: index %q, marker %v, stale %v", s.Values["index-blocks"], s.Marker, s.Stale)
	}
	if e := errs(); len(e) > 0 {
		t.Errorf("the page reported errors:\n%s", strings.Join(e, "\n"))
	}
}

// TestPageWithToken: with --auth-token-file the page loads without a token, asks for one when
// its document is refused, and, given a read token, shows the daemon's state.
func TestPageWithToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and a browser")
	}
	const token = "read-0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("read "+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bctx, errs := browser(t, 60*time.Second)
	base := startDaemon(t, func(c *daemon.Config) { c.Security.AuthTokenFile = tokens })
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/ui")); err != nil {
		t.Fatal(err)
	}
	var hidden bool
	waitFor(t, within(t, bctx, 20*time.Second), "the token asked for", func(s *shown) error {
		h, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.getElementById("auth").hidden`))
		if err != nil {
			return err
		}
		hidden = h
		if hidden || !s.Stale || !strings.Contains(s.Updated, "a bearer token is needed") {
			return fmt.Errorf("form hidden %v, updated %q", hidden, s.Updated)
		}
		return nil
	})
	if err := chromedp.Do(bctx, chromedp.SendKeys("#token", token), chromedp.Click("#auth button")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, within(t, bctx, 20*time.Second), "the page with the token", func(s *shown) error {
		if !strings.HasPrefix(s.Updated, "updated ") || s.Values["workers-count"] != "0" {
			return fmt.Errorf("updated %q, workers %q", s.Updated, s.Values["workers-count"])
		}
		return nil
	})
	// The refusals before the token are the browser's log entries for the 401s; nothing else.
	for _, e := range errs() {
		if !strings.Contains(e, "401") {
			t.Errorf("the page reported: %s", e)
		}
	}
}
