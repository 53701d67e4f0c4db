package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/bearer"
	"github.com/kvrouterd/kvrouterd/internal/tlscert"
)

// Security is who may call the daemon's HTTP listeners and how: bearer tokens, TLS, the rate
// limits of the control plane, and the admin listener (pprof). A plain value.
type Security struct {
	AuthTokenFile string
	TLSCertFile   string
	TLSKeyFile    string
	// WorkerAPIKeysFile holds the API keys the front door sends the workers' HTTP APIs, by
	// worker id or http_endpoint (workerKeys); they win over the keys workers register.
	WorkerAPIKeysFile string
	// ReloadInterval is how often the token, certificate, key and worker-key files are looked
	// at for a change (their size and modification time).
	ReloadInterval time.Duration
	AdminAddr      string
	ControlRate    float64
	ControlBurst   int
	EventsRate     float64
	EventsBurst    int
}

// DefaultSecurity is the security of a daemon started without flags: no tokens, no TLS (both
// to be configured for anything beyond a private network; README, Security), a control
// plane limited to 500 changes a second with room for a fleet's start, events unlimited,
// no admin listener.
func DefaultSecurity() Security {
	return Security{ReloadInterval: 10 * time.Second, ControlRate: 500, ControlBurst: 5000}
}

// Flags defines the flags that set s.
func (s *Security) Flags(fs *flag.FlagSet) {
	fs.StringVar(&s.AuthTokenFile, "auth-token-file", s.AuthTokenFile, "file of bearer tokens, one a line, \"read TOKEN\" for a read-only one (matches, queries, listings): once set, every endpoint of the API, the selection service and the front door but health, readiness and metrics needs Authorization: Bearer TOKEN; reloaded on change")
	fs.StringVar(&s.TLSCertFile, "tls-cert-file", s.TLSCertFile, "PEM certificate (chain) for HTTPS on the API, the selection service and the front door, with --tls-key-file; reloaded on change")
	fs.StringVar(&s.TLSKeyFile, "tls-key-file", s.TLSKeyFile, "PEM private key of --tls-cert-file")
	fs.StringVar(&s.WorkerAPIKeysFile, "worker-api-keys-file", s.WorkerAPIKeysFile, "file of the API keys the front door sends workers (Authorization: Bearer KEY), one \"WORKER_ID KEY\" or \"HTTP_ENDPOINT KEY\" a line, # comments: they win over a registration's api_key; never listed or logged; reloaded on change")
	fs.DurationVar(&s.ReloadInterval, "auth-reload-interval", s.ReloadInterval, "how often --auth-token-file, --tls-cert-file, --tls-key-file and --worker-api-keys-file are checked for a change")
	fs.StringVar(&s.AdminAddr, "admin-addr", s.AdminAddr, "address of the admin listener serving Go's pprof profiles under /debug/pprof/ (write token needed with --auth-token-file); empty: off. Bind it to loopback")
	fs.Float64Var(&s.ControlRate, "control-rate-limit", s.ControlRate, "control-plane requests a second (registrations and their removals, peers, busy thresholds, snapshots, dumps; both APIs together); over it 429; 0: no limit")
	fs.IntVar(&s.ControlBurst, "control-burst", s.ControlBurst, "control-plane requests allowed at once above --control-rate-limit (a fleet registering at start)")
	fs.Float64Var(&s.EventsRate, "events-rate-limit", s.EventsRate, "POST /v1/events requests a second; over it 429; 0: no limit")
	fs.IntVar(&s.EventsBurst, "events-burst", s.EventsBurst, "POST /v1/events requests allowed at once above --events-rate-limit")
}

// Check says which flag of s is wrong, or nil.
func (s *Security) Check() error {
	switch {
	case (s.TLSCertFile == "") != (s.TLSKeyFile == ""):
		return errors.New("--tls-cert-file and --tls-key-file go together")
	case s.ReloadInterval <= 0:
		return fmt.Errorf("--auth-reload-interval %v: want a positive duration", s.ReloadInterval)
	case s.ControlRate < 0 || s.EventsRate < 0 || s.ControlBurst < 0 || s.EventsBurst < 0:
		return errors.New("--control-rate-limit, --control-burst, --events-rate-limit, --events-burst: must not be negative")
	}
	return nil
}

// credentials are the loaded token file, certificate and worker keys, nil when not configured.
type credentials struct {
	tokens *bearer.Tokens
	cert   *tlscert.Cert
	keys   *workerKeys
}

// apiKeys is router.Config.APIKeys: the worker keys file's lookup, nil without one.
func (cr credentials) apiKeys() func(id uint64, endpoint string) (string, bool) {
	if cr.keys == nil {
		return nil
	}
	return cr.keys.Lookup
}

// load reads the files s names; a file that does not load fails the start.
func (s *Security) load() (cr credentials, err error) {
	if s.AuthTokenFile != "" {
		if cr.tokens, err = bearer.Load(s.AuthTokenFile); err != nil {
			return cr, fmt.Errorf("--auth-token-file: %w", err)
		}
	}
	if s.TLSCertFile != "" {
		if cr.cert, err = tlscert.Load(s.TLSCertFile, s.TLSKeyFile); err != nil {
			return cr, fmt.Errorf("--tls-cert-file %s, --tls-key-file %s: %w", s.TLSCertFile, s.TLSKeyFile, err)
		}
	}
	if s.WorkerAPIKeysFile != "" {
		if cr.keys, err = loadWorkerKeys(s.WorkerAPIKeysFile); err != nil {
			return cr, fmt.Errorf("--worker-api-keys-file: %w", err)
		}
	}
	return cr, nil
}

// listen wraps ln in TLS when a certificate is configured.
func (cr credentials) listen(ln net.Listener) net.Listener {
	if cr.cert == nil {
		return ln
	}
	return tls.NewListener(ln, cr.cert.Config())
}

// watch reloads the token file, the certificate and the worker keys every interval until ctx
// ends; a file that does not load is logged and the one in force kept.
func (cr credentials) watch(ctx context.Context, every time.Duration, log *slog.Logger) {
	if cr.tokens == nil && cr.cert == nil && cr.keys == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if cr.tokens != nil {
			switch changed, err := cr.tokens.Reload(); {
			case err != nil:
				log.Error("auth token file not reloaded; the tokens in force stay", "err", err)
			case changed:
				log.Info("auth token file reloaded", "file", cr.tokens.Path(), "tokens", cr.tokens.Len())
			}
		}
		if cr.cert != nil {
			switch changed, err := cr.cert.Reload(); {
			case err != nil:
				log.Error("TLS certificate not reloaded; the one in force stays", "err", err)
			case changed:
				log.Info("TLS certificate reloaded")
			}
		}
		if cr.keys != nil {
			switch changed, err := cr.keys.Reload(); {
			case err != nil:
				log.Error("worker API keys file not reloaded; the keys in force stay", "err", err)
			case changed:
				log.Info("worker API keys file reloaded", "file", cr.keys.Path(), "keys", cr.keys.Len())
			}
		}
	}
}

// adminHandler serves pprof's profiles, behind a write token when tokens are configured.
func (cr credentials) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if cr.tokens == nil {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// 401 for no token or an unknown one, 403 for a read token, as every other listener.
		if status, msg := cr.tokens.Refusal([]byte(r.Header.Get("Authorization")), bearer.Write); status != 0 {
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", bearer.Challenge)
			}
			http.Error(w, msg, status)
			return
		}
		mux.ServeHTTP(w, r)
	})
}
