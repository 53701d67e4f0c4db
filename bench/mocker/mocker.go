package mocker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvrouterd/kvrouterd/bench/sim"
	"github.com/kvrouterd/kvrouterd/internal/freelist"
)

// Mocker is one running mock engine: its worker, its KV-event sockets and its HTTP API. Start
// makes one; its methods are safe for concurrent use, Shutdown once.
type Mocker struct {
	cfg    Config
	log    *slog.Logger
	eng    *engine
	pub    *publisher // nil without KV events
	srv    *fasthttp.Server
	ln     net.Listener
	served chan error

	httpEndpoint, eventsEndpoint, replayEndpoint string

	api     *api
	connsMu sync.Mutex
	conns   map[net.Conn]struct{} // the open HTTP connections; REQUIRES connsMu
	crashed bool                  // Config.DieAfter was reached: every connection is reset; REQUIRES connsMu

	died      chan struct{} // closed by crash
	crashOnce sync.Once
	pubOnce   sync.Once
}

// connState keeps the set of open connections, for Shutdown and crash.
func (m *Mocker) connState(c net.Conn, s fasthttp.ConnState) {
	m.connsMu.Lock()
	defer m.connsMu.Unlock()
	switch s {
	case fasthttp.StateNew:
		if m.crashed { // accepted as the listener closed
			reset(c)
			return
		}
		m.conns[c] = struct{}{}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(m.conns, c)
	}
}

// closeConns closes every open connection: those Shutdown is still waiting for once no handler
// runs. fasthttp 1.74 closes the idle ones itself, yet sometimes counts a kept-alive connection
// as active after its response was sent, and would wait for the client to close it (Go's
// client keeps an idle one 90 s).
func (m *Mocker) closeConns() {
	m.connsMu.Lock()
	defer m.connsMu.Unlock()
	for c := range m.conns {
		c.Close()
	}
}

// ErrDied is what Run returns when the mocker crashed as Config.DieAfter asked.
var ErrDied = errors.New("mocker: died as --die-after asked")

// Died is closed once the mocker has crashed as Config.DieAfter asks: when the generate
// request past the first DieAfter arrived, it closed its listener (connections are refused),
// reset every open connection, its own included (a client sees ECONNRESET; a stream stops
// where it was, without an error event or [DONE]), stopped its engine and closed its KV-event
// sockets, as a crashed engine's process would. It does not leave kvrouterd. Shutdown still
// has to be called.
func (m *Mocker) Died() <-chan struct{} { return m.died }

// crash is the death Died describes; the first call does it.
func (m *Mocker) crash() {
	m.crashOnce.Do(func() {
		m.log.Error("crashing as --die-after asks", "served", m.cfg.DieAfter)
		m.ln.Close()
		m.connsMu.Lock()
		m.crashed = true
		for c := range m.conns {
			reset(c)
		}
		m.connsMu.Unlock()
		m.eng.close()
		m.api.held.close()
		m.closePub()
		close(m.died)
	})
}

// reset closes c at once with a TCP reset (SO_LINGER 0) rather than an orderly FIN, as the
// kernel closes the sockets of a process that died.
func reset(c net.Conn) {
	if tc, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func (m *Mocker) closePub() {
	if m.pub != nil {
		m.pubOnce.Do(m.pub.close)
	}
}

// onceListener is a listener closed once: crash closes it before fasthttp's Shutdown, which
// would report the second close as an error.
type onceListener struct {
	net.Listener
	once sync.Once
	err  error
}

func (l *onceListener) Close() error {
	l.once.Do(func() { l.err = l.Listener.Close() })
	return l.err
}

// Start checks cfg, binds the HTTP listener and the ZMQ sockets, starts the engine and serves;
// it does not register with kvrouterd (Register does). Logs go to logw.
func Start(cfg Config, logw io.Writer) (*Mocker, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	level, _ := cfg.level()
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: level})).With("worker", cfg.WorkerID)
	form, _ := cfg.form()
	m := &Mocker{cfg: cfg, log: log, served: make(chan error, 1), died: make(chan struct{})}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("mocker: --http-addr: %w", err)
	}
	m.ln = &onceListener{Listener: ln}
	m.httpEndpoint = endpoint("http://", ln.Addr(), cfg.AdvertiseHost)
	var publish func(*sim.StepOutput)
	if cfg.KVEventsAddr != "" {
		if m.pub, err = listenEvents(cfg.KVEventsAddr, cfg.ReplayAddr, form, log); err != nil {
			ln.Close()
			return nil, err
		}
		m.eventsEndpoint, m.replayEndpoint = m.pub.endpoints(cfg.AdvertiseHost)
		publish = m.pub.publishStep
	}
	m.eng = newEngine(sim.NewWorker(cfg.WorkerID, cfg.workerConfig()), cfg.Speedup, publish, log)

	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	a := &api{cfg: cfg, eng: m.eng, log: log, maxLen: cfg.maxModelLen(),
		nonce: binary.LittleEndian.Uint64(nonce[:]), started: time.Now().Unix(), held: newHeld(m.eng, &cfg),
		streams: freelist.New[eventStream]()}
	a.engineID = fmt.Sprintf("kvr-mock-%d-%016x", cfg.WorkerID, a.nonce)
	if u, err := url.Parse(m.httpEndpoint); err == nil {
		a.xferHost = u.Hostname()
		a.xferPort, _ = strconv.Atoi(u.Port())
	}
	a.crash = m.crash
	m.api = a
	m.conns = make(map[net.Conn]struct{})
	m.srv = &fasthttp.Server{
		Handler:            a.handle,
		Name:               "kvr-mocker",
		MaxRequestBodySize: 64 << 20,
		CloseOnShutdown:    true,
		Logger:             fasthttpLogger{log},
		ConnState:          m.connState,
	}
	go func() { m.served <- m.srv.Serve(m.ln) }()
	log.Info("kvr-mocker serving", "model", cfg.Model, "http", m.httpEndpoint, "kv_events", m.eventsEndpoint,
		"replay", m.replayEndpoint, "blocks", cfg.Blocks, "block_size", cfg.BlockSize, "speedup", cfg.Speedup)
	return m, nil
}

type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug("fasthttp: " + fmt.Sprintf(format, args...))
}

// HTTPEndpoint is the OpenAI API's URL (http://host:port), as registered.
func (m *Mocker) HTTPEndpoint() string { return m.httpEndpoint }

// Addr is the HTTP listener's host:port.
func (m *Mocker) Addr() string { return m.ln.Addr().String() }

// EventsEndpoint is the KV events' PUB endpoint (tcp://host:port), "" without events.
func (m *Mocker) EventsEndpoint() string { return m.eventsEndpoint }

// ReplayEndpoint is the replay socket's endpoint, "" without one.
func (m *Mocker) ReplayEndpoint() string { return m.replayEndpoint }

// Stats returns the engine's counters as of its last step.
func (m *Mocker) Stats() Stats { return m.eng.stats() }

// registration is the body of kvrouterd's POST /v1/workers.
type registration struct {
	WorkerID         uint64 `json:"worker_id"`
	Model            string `json:"model"`
	BlockSize        int    `json:"block_size"`
	CapacityBlocks   int    `json:"capacity_blocks"`
	MaxBatchedTokens int    `json:"max_batched_tokens"`
	Endpoint         string `json:"endpoint"`
	ReplayEndpoint   string `json:"replay_endpoint,omitempty"`
	HTTPEndpoint     string `json:"http_endpoint"`
	Role             string `json:"role,omitempty"` // prefill or decode; absent: both
}

func (m *Mocker) registration() registration {
	return registration{
		WorkerID: m.cfg.WorkerID, Model: m.cfg.Model, BlockSize: m.cfg.BlockSize,
		CapacityBlocks: m.cfg.Blocks, MaxBatchedTokens: m.cfg.MaxBatchedTokens,
		Endpoint: m.eventsEndpoint, ReplayEndpoint: m.replayEndpoint, HTTPEndpoint: m.httpEndpoint,
		Role: map[bool]string{true: m.cfg.Role}[m.cfg.Role != "both"],
	}
}

// errRefused: kvrouterd answered the registration with a client error, which retrying will not
// change.
var errRefused = errors.New("mocker: kvrouterd refused the registration")

// Register registers the mocker with kvrouterd at cfg.Register (POST /v1/workers), retrying
// with backoff while kvrouterd cannot be reached or answers 5xx, until ctx is done. A 4xx
// answer is final: the error wraps errRefused and quotes kvrouterd's message.
func (m *Mocker) Register(ctx context.Context) error {
	if m.cfg.Register == "" {
		return nil
	}
	body, _ := json.Marshal(m.registration())
	url := strings.TrimSuffix(m.cfg.Register, "/") + "/v1/workers"
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		status, answer, err := call(ctx, http.MethodPost, url, body)
		switch {
		case err == nil && status/100 == 2:
			m.log.Info("registered with kvrouterd", "url", m.cfg.Register, "endpoint", m.eventsEndpoint)
			return nil
		case err == nil && status/100 == 4:
			return fmt.Errorf("%w: POST %s: %d %s", errRefused, url, status, bytes.TrimSpace(answer))
		case err == nil:
			err = fmt.Errorf("%d %s", status, bytes.TrimSpace(answer))
		}
		if attempt == 1 || attempt%10 == 0 {
			m.log.Warn("kvrouterd not answering yet; retrying", "url", url, "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("mocker: registering with %s: %w (last: %v)", m.cfg.Register, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// Deregister removes the mocker's worker from kvrouterd (DELETE /v1/workers/{id}), once.
func (m *Mocker) Deregister(ctx context.Context) error {
	if m.cfg.Register == "" {
		return nil
	}
	url := fmt.Sprintf("%s/v1/workers/%d", strings.TrimSuffix(m.cfg.Register, "/"), m.cfg.WorkerID)
	status, answer, err := call(ctx, http.MethodDelete, url, nil)
	if err == nil && status/100 != 2 && status != http.StatusNotFound {
		err = fmt.Errorf("%d %s", status, bytes.TrimSpace(answer))
	}
	if err != nil {
		return fmt.Errorf("mocker: DELETE %s: %w", url, err)
	}
	m.log.Info("left kvrouterd", "url", m.cfg.Register)
	return nil
}

func call(ctx context.Context, method, url string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, answer, nil
}

// Shutdown stops the mocker: it stops accepting connections, lets the requests in flight run
// until they end or ctx is done, then aborts the rest (their streams end with finish_reason
// "abort"), stops the engine and closes the sockets. It does not deregister (Deregister does).
func (m *Mocker) Shutdown(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- m.srv.Shutdown() }()
	var err error
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	expired := ctx.Done()
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-expired:
			m.log.Warn("shutdown timeout: aborting the requests in flight")
			m.eng.close() // ends every handler's wait and every stream
			expired = nil
		case <-tick.C:
			if m.api.inflight.Load() == 0 {
				m.closeConns()
			}
		}
	}
	// A Shutdown that comes before Serve has taken the listener returns without closing it.
	m.ln.Close()
	m.api.held.close()
	m.eng.close()
	m.closePub()
	if serr := <-m.served; err == nil && !errors.Is(serr, net.ErrClosed) {
		err = serr
	}
	m.log.Info("kvr-mocker stopped", "stats", fmt.Sprintf("%+v", m.eng.stats()))
	return err
}

// Run runs a mocker until ctx is done: Start, Register (with cfg.Register), and at the end
// Deregister and Shutdown within cfg.ShutdownTimeout. A registration kvrouterd refuses ends the
// run with its error; a crash (cfg.DieAfter) ends it at once with ErrDied, still registered.
func Run(ctx context.Context, cfg Config, logw io.Writer) error {
	m, err := Start(cfg, logw)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.Died():
			cancel()
		case <-ctx.Done():
		}
	}()
	var regErr error
	registered := false
	switch err := m.Register(ctx); {
	case err == nil:
		registered = cfg.Register != ""
		<-ctx.Done()
	case ctx.Err() == nil: // refused: no use serving a worker kvrouterd will not route to
		regErr = err
		m.log.Error("registration failed", "err", err)
	}
	select {
	case <-m.Died():
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		m.Shutdown(sctx) // releases what is left; nothing to wait for
		return ErrDied
	default:
	}
	m.log.Info("shutting down")
	if registered {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := m.Deregister(dctx); err != nil {
			m.log.Warn("could not leave kvrouterd", "err", err)
		}
		cancel()
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := m.Shutdown(sctx); err != nil {
		return err
	}
	return regErr
}
