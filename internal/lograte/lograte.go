// Package lograte keeps a failing dependency from flooding the log: a slog.Handler that passes
// each repeated warning or error a few times, then once per interval with the number of
// repeats it dropped, and caps all warnings and errors together. A Handler and the handlers
// derived from it (WithAttrs, WithGroup) share one limit and are safe for concurrent use.
//
// Why: libraries the daemon embeds retry failed I/O in tight loops and log every attempt (Pebble
// retries a failed memtable flush with no backoff; on a full disk that was 196 MB of log in 15
// s). Records below Config.Level are never limited.
package lograte

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Config is a Handler's limits, a plain value; zero fields take their defaults.
type Config struct {
	// Level is the lowest level limited (zero: slog.LevelWarn); lower records pass untouched.
	Level slog.Level
	// Burst lines of one message pass before it is limited (5); then one per Every (10 s).
	Burst int
	Every time.Duration
	// TotalBurst and TotalEvery cap every limited record together (50, then one per 200 ms),
	// for failures that log a different message each time.
	TotalBurst int
	TotalEvery time.Duration
	// Now is the clock (time.Now); tests set it.
	Now func() time.Time
}

// keyLen is how much of a message identifies it: libraries format values into their messages
// ("write MANIFEST-000044: no space left"), and repeats differ in the numbers at the end.
const (
	keyLen  = 48
	maxKeys = 4096
)

// Attributes added to the record that follows dropped ones.
const (
	// AttrRepeats is how many records of this message were dropped since the last one passed.
	AttrRepeats = "repeats_dropped"
	// AttrOthers is how many limited records of any message the total cap dropped.
	AttrOthers = "log_lines_dropped"
)

type bucket struct {
	tokens  float64
	last    time.Time
	dropped int64
}

// take refills b at one token per every up to burst, then spends one if it can.
func (b *bucket) take(now time.Time, burst int, every time.Duration) bool {
	if b.last.IsZero() {
		b.tokens = float64(burst)
	} else if d := now.Sub(b.last); d > 0 {
		b.tokens = min(float64(burst), b.tokens+float64(d)/float64(every))
	}
	b.last = now
	if b.tokens < 1 {
		b.dropped++
		return false
	}
	b.tokens--
	return true
}

type state struct {
	cfg   Config
	mu    sync.Mutex
	keys  map[string]*bucket
	total bucket
}

// Handler, safe for concurrent use as the handler it wraps must be, is a slog.Handler that
// limits repeated records before they reach that handler.
type Handler struct {
	next slog.Handler
	st   *state
}

// New returns a Handler in front of next.
func New(next slog.Handler, cfg Config) *Handler {
	if cfg.Level == 0 {
		cfg.Level = slog.LevelWarn
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 5
	}
	if cfg.Every <= 0 {
		cfg.Every = 10 * time.Second
	}
	if cfg.TotalBurst <= 0 {
		cfg.TotalBurst = 50
	}
	if cfg.TotalEvery <= 0 {
		cfg.TotalEvery = 200 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Handler{next: next, st: &state{cfg: cfg, keys: map[string]*bucket{}}}
}

// Enabled is the wrapped handler's.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle passes r on unless its message has repeated too often or too many records have.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.st.cfg.Level {
		return h.next.Handle(ctx, r)
	}
	repeats, others, ok := h.st.admit(r.Level, r.Message)
	if !ok {
		return nil
	}
	if repeats > 0 || others > 0 {
		r = r.Clone()
		if repeats > 0 {
			r.AddAttrs(slog.Int64(AttrRepeats, repeats))
		}
		if others > 0 {
			r.AddAttrs(slog.Int64(AttrOthers, others))
		}
	}
	return h.next.Handle(ctx, r)
}

// admit decides on one record; when it passes, it returns the drops to report and resets them.
func (st *state) admit(l slog.Level, msg string) (repeats, others int64, ok bool) {
	key := msg[:min(len(msg), keyLen)] + "\x00" + l.String()
	st.mu.Lock()
	defer st.mu.Unlock()
	now := st.cfg.Now()
	b := st.keys[key]
	if b == nil {
		if len(st.keys) >= maxKeys {
			clear(st.keys) // bounded memory; the total cap still holds
		}
		b = &bucket{}
		st.keys[key] = b
	}
	if !b.take(now, st.cfg.Burst, st.cfg.Every) {
		return 0, 0, false
	}
	if !st.total.take(now, st.cfg.TotalBurst, st.cfg.TotalEvery) {
		// Counted once, in the total: give back the message's token.
		b.tokens++
		return 0, 0, false
	}
	repeats, others = b.dropped, st.total.dropped
	b.dropped, st.total.dropped = 0, 0
	return repeats, others, true
}

// WithAttrs returns a handler sharing h's limits.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), st: h.st}
}

// WithGroup returns a handler sharing h's limits.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), st: h.st}
}
