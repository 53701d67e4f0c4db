package frontdoor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/bearer"
	"github.com/kvrouterd/kvrouterd/internal/lograte"
	"github.com/kvrouterd/kvrouterd/internal/peer"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// Config configures a Door. A plain value; the zero value is usable.
type Config struct {
	Logger   *slog.Logger         // nil: discard
	Registry *prometheus.Registry // nil: a registry of its own
	// Retries is how many other workers a request is sent to after one refuses the
	// connection or answers 5xx before any body byte (Dynamo's migration); 0: none.
	Retries int
	// Timeout bounds a whole request, from its arrival to the answer's last byte; 0: none.
	Timeout time.Duration
	// TokenizeTimeout bounds one /tokenize call (10 s when 0).
	TokenizeTimeout time.Duration
	// OverloadStatus answers a request whose workers are all overloaded (their busy
	// thresholds): 529 when 0, as Dynamo's frontend.
	OverloadStatus int
	// Tokens, if set, requires a bearer token of it (OpenAI clients send their API key so):
	// a write token to generate, a read token for /v1/models; /health is open.
	Tokens *bearer.Tokens
}

// Door is the front door over one Router. Safe for concurrent use.
type Door struct {
	r   *router.Router
	cfg Config
	log *slog.Logger
	up  *fasthttp.Client // to the workers' APIs, streaming their answers
	tok *fasthttp.Client // /tokenize, answers buffered
	pre *http.Client     // prefill stages: cancelled when the client goes (fasthttp's calls cannot be)
	m   *metrics
	// refusals logs refused requests, behind a rate limit.
	refusals *slog.Logger

	prefix string        // of the request ids the front door books under
	ids    atomic.Uint64 // the request ids' counter
	turn   atomic.Uint64 // which worker tokenizes next
	bufs   sync.Pool     // *[]byte, for copying streamed bodies
	probe  prober        // the workers' health probes (health.go)
}

// New returns a Door routing with r.
func New(r *router.Router, cfg Config) *Door {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.TokenizeTimeout <= 0 {
		cfg.TokenizeTimeout = 10 * time.Second
	}
	if cfg.OverloadStatus == 0 {
		cfg.OverloadStatus = 529
	}
	d := &Door{r: r, cfg: cfg, log: cfg.Logger,
		// Refusals are client errors, logged at info level: limited from that level up (Level
		// is the lowest level limited; zero would mean warn), so that a client sending bad
		// requests in a loop does not flood the log. The metric counts every one.
		refusals: slog.New(lograte.New(cfg.Logger.Handler(), lograte.Config{Level: slog.LevelInfo - 1})),
		up: &fasthttp.Client{Name: "kvrouterd", StreamResponseBody: true, MaxConnsPerHost: 4096,
			MaxIdleConnDuration: time.Minute, NoDefaultUserAgentHeader: false, DisablePathNormalizing: true},
		tok: &fasthttp.Client{Name: "kvrouterd", MaxConnsPerHost: 1024, MaxResponseBodySize: 64 << 20,
			MaxIdleConnDuration: time.Minute},
		pre:    &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}},
		m:      newMetrics(cfg.Registry),
		prefix: fmt.Sprintf("fd-%08x-", rand.Uint32()),
	}
	d.bufs.New = func() any { b := make([]byte, 32<<10); return &b }
	d.startHealth()
	return d
}

// Handle serves one request of the front door's API.
func (d *Door) Handle(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	if d.cfg.Tokens != nil && path != "/health" {
		need := bearer.Write
		if path == "/v1/models" {
			need = bearer.Read
		}
		if status, msg := d.cfg.Tokens.Refusal(ctx.Request.Header.Peek("Authorization"), need); status != 0 {
			if status == fasthttp.StatusUnauthorized {
				ctx.Response.Header.Set("WWW-Authenticate", bearer.Challenge)
			}
			d.fail(ctx, "other", status, "invalid_request_error", "", msg)
			return
		}
	}
	switch path {
	case "/v1/completions", "/v1/chat/completions":
		if !ctx.IsPost() {
			d.fail(ctx, path, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "", "use POST")
			return
		}
		d.generate(ctx, path)
	case "/v1/models":
		d.models(ctx)
	case "/health":
		ctx.SetStatusCode(fasthttp.StatusOK)
	default:
		d.fail(ctx, "other", fasthttp.StatusNotFound, "not_found", "", "no endpoint "+strconv.Quote(path))
	}
}

// fail answers OpenAI's error shape, counts it and logs it.
func (d *Door) fail(ctx *fasthttp.RequestCtx, path string, status int, typ, param, msg string) {
	e := struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}{Message: msg, Type: typ, Code: status}
	if param != "" {
		e.Param = &param
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '\n'))
	d.m.requests.WithLabelValues(path, strconv.Itoa(status)).Inc()
	d.refusals.Info("front door: request refused", "path", path, "status", status, "type", typ, "msg", msg)
}

// models lists the models some worker serves an HTTP API for, as OpenAI's /v1/models does.
func (d *Door) models(ctx *fasthttp.RequestCtx) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	var ws []router.HTTPWorker
	for _, m := range d.r.Models() {
		if ws = d.r.HTTPWorkers(m.Name, ws[:0]); len(ws) > 0 {
			out.Data = append(out.Data, model{ID: m.Name, Object: "model", Created: time.Now().Unix(), OwnedBy: "kvrouterd"})
		}
	}
	b, _ := json.Marshal(out)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
	d.m.requests.WithLabelValues("/v1/models", "200").Inc()
}

// generate serves /v1/completions and /v1/chat/completions: tokenize, route, forward.
func (d *Door) generate(ctx *fasthttp.RequestCtx, path string) {
	var deadline time.Time
	if d.cfg.Timeout > 0 {
		deadline = time.Now().Add(d.cfg.Timeout)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(ctx.PostBody(), &body); err != nil || body == nil {
		msg := "the body is not a JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		d.fail(ctx, path, fasthttp.StatusBadRequest, "invalid_request_error", "", msg)
		return
	}
	var model string
	if err := json.Unmarshal(body["model"], &model); err != nil || model == "" {
		d.fail(ctx, path, fasthttp.StatusBadRequest, "invalid_request_error", "model", "model is required: a string naming a served model")
		return
	}
	ws := d.r.HTTPWorkers(model, nil)
	if len(ws) == 0 {
		if _, ok := d.r.ModelBlockSize(model); ok {
			d.fail(ctx, path, fasthttp.StatusServiceUnavailable, "service_unavailable", "model",
				fmt.Sprintf("no worker of model %q has registered an http_endpoint", model))
			return
		}
		d.fail(ctx, path, fasthttp.StatusNotFound, "model_not_found", "model", fmt.Sprintf("the model `%s` does not exist", model))
		return
	}
	var hints nvext
	if raw, ok := body["nvext"]; ok && json.Unmarshal(raw, &hints) != nil {
		d.fail(ctx, path, fasthttp.StatusBadRequest, "invalid_request_error", "nvext", "nvext is not Dynamo's extension object")
		return
	}
	if hints.CacheSalt == "" {
		_ = json.Unmarshal(body["cache_salt"], &hints.CacheSalt) // vLLM's own field
	}
	chat := path == "/v1/chat/completions"
	var toks []uint32
	var rewrite bool
	var status int
	var err error
	if len(hints.TokenData) > 0 {
		toks = hints.TokenData // Dynamo's pre-tokenized prompt
	} else {
		toks, rewrite, status, err = d.tokens(ws, model, chat, body)
	}
	if err != nil {
		typ := "invalid_request_error"
		if status >= 500 {
			typ = "service_unavailable"
		}
		d.fail(ctx, path, status, typ, map[bool]string{true: "messages", false: "prompt"}[chat], err.Error())
		return
	}
	out := ctx.PostBody()
	if rewrite {
		// The engine is given the ids it would compute, and does not tokenize again.
		body["prompt"], _ = json.Marshal(toks)
		out, _ = json.Marshal(body)
	}
	d.forward(ctx, path, model, ws, toks, &hints, out, deadline)
}

// nvext is what the front door reads of Dynamo's request extension (lib/llm protocols
// nvext.rs): a pinned worker and rank, the prompt's token ids, its cache salt, and the
// router's per-request overrides. The rest of it goes to the engine with the request.
type nvext struct {
	BackendInstanceID *uint64        `json:"backend_instance_id"`
	DPRank            *uint32        `json:"dp_rank"`
	TokenData         []uint32       `json:"token_data"`
	CacheSalt         string         `json:"cache_salt"`
	Override          *wire.Override `json:"router_config_override"`
	// Queue order and the expected output (Dynamo's AgentHints): priority (seconds ahead, its
	// deprecated latency_sensitivity the fallback), strict priority, output length.
	AgentHints *struct {
		Priority           *int32   `json:"priority"`
		LatencySensitivity *float64 `json:"latency_sensitivity"`
		StrictPriority     *uint32  `json:"strict_priority"`
		OSL                *uint32  `json:"osl"`
	} `json:"agent_hints"`
	// Session affinity's key (Dynamo's session_control; the X-Dynamo-Session-ID header when
	// absent).
	SessionControl *struct {
		SessionID string `json:"session_id"`
	} `json:"session_control"`
}

// routeRequest is the route of toks under the hints: by local hashes when the prompt is salted
// (the router's own hashing of token ids knows no salt), pinned when the request names a worker.
func (h *nvext) routeRequest(rr *wire.RouteRequest, toks []uint32, bs int) {
	if h.CacheSalt != "" && bs > 0 && len(toks) >= bs { // a shorter prompt has no block to salt
		var hs radix.Hasher
		rr.ByHash, rr.Tokens = true, nil
		rr.Hashes = hs.AppendLocal(rr.Hashes[:0], toks, bs, radix.Seed("", h.CacheSalt))
		rr.ISL = uint32(min(len(toks), math.MaxUint32))
	}
	if h.BackendInstanceID != nil {
		rr.HasPinned, rr.PinnedWorker = true, *h.BackendInstanceID
		if h.DPRank != nil {
			rr.PinnedRank = *h.DPRank
		}
	}
	if a := h.AgentHints; a != nil {
		switch {
		case a.Priority != nil:
			rr.PriorityJump = float64(max(*a.Priority, 0))
		case a.LatencySensitivity != nil:
			rr.PriorityJump = *a.LatencySensitivity
		}
		if a.StrictPriority != nil {
			rr.StrictPriority = *a.StrictPriority
		}
		if a.OSL != nil {
			rr.ExpectedOSL = *a.OSL
		}
	}
	if h.SessionControl != nil {
		rr.SessionID = h.SessionControl.SessionID
	}
	h.Override.Apply(rr)
}

// tokens returns the ids of the request's prompt: a completion's own ids, or a worker's
// /tokenize of its prompt or messages. rewrite says to forward the ids as the prompt.
func (d *Door) tokens(ws []router.HTTPWorker, model string, chat bool, body map[string]json.RawMessage) (toks []uint32, rewrite bool, status int, err error) {
	tb := map[string]json.RawMessage{"model": body["model"]}
	if chat {
		if len(body["messages"]) == 0 {
			return nil, false, fasthttp.StatusBadRequest, errors.New("messages is required")
		}
		for _, k := range []string{"messages", "add_generation_prompt", "continue_final_message", "add_special_tokens",
			"chat_template", "chat_template_kwargs", "tools", "mm_processor_kwargs"} {
			if v, ok := body[k]; ok {
				tb[k] = v
			}
		}
	} else {
		p := body["prompt"]
		var ids []uint32
		if json.Unmarshal(p, &ids) == nil && len(ids) > 0 {
			return ids, false, 0, nil
		}
		var text string
		switch {
		case json.Unmarshal(p, &text) == nil:
			rewrite = true
		default:
			// A batch of prompts: routed by its first, forwarded as it is.
			var batch []json.RawMessage
			if json.Unmarshal(p, &batch) != nil || len(batch) == 0 {
				return nil, false, fasthttp.StatusBadRequest, errors.New("prompt is required: a string, token ids, or a list of either")
			}
			if json.Unmarshal(batch[0], &ids) == nil && len(ids) > 0 {
				return ids, false, 0, nil
			}
			if json.Unmarshal(batch[0], &text) != nil {
				return nil, false, fasthttp.StatusBadRequest, errors.New("prompt is required: a string, token ids, or a list of either")
			}
		}
		if text == "" {
			return nil, false, fasthttp.StatusBadRequest, errors.New("prompt must not be empty")
		}
		tb["prompt"], _ = json.Marshal(text)
		if v, ok := body["add_special_tokens"]; ok {
			tb["add_special_tokens"] = v
		}
	}
	req, _ := json.Marshal(tb)
	toks, status, err = d.tokenize(ws, req)
	return toks, rewrite, status, err
}

// tokenize asks the model's workers in turn for req's token ids until one answers: a 4xx
// answer is the request's fault and ends the search.
func (d *Door) tokenize(ws []router.HTTPWorker, req []byte) ([]uint32, int, error) {
	start := int(d.turn.Add(1))
	var last error
	for i := range min(len(ws), 3) {
		w := ws[(start+i)%len(ws)]
		toks, status, err := d.tokenizeAt(w.Endpoint, req)
		if err == nil {
			return toks, 0, nil
		}
		if status >= 400 && status < 500 {
			return nil, status, err
		}
		d.m.upstream.WithLabelValues("tokenize").Inc()
		last = fmt.Errorf("worker %d: %w", w.ID, err)
	}
	return nil, fasthttp.StatusServiceUnavailable, fmt.Errorf("no worker could tokenize the prompt: %w", last)
}

func (d *Door) tokenizeAt(endpoint string, body []byte) ([]uint32, int, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(strings.TrimRight(endpoint, "/") + "/tokenize")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := d.tok.DoTimeout(req, resp, d.cfg.TokenizeTimeout); err != nil {
		return nil, 0, err
	}
	if code := resp.StatusCode(); code != fasthttp.StatusOK {
		return nil, code, fmt.Errorf("/tokenize answered %d: %.200s", code, resp.Body())
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		return nil, fasthttp.StatusBadGateway, fmt.Errorf("/tokenize answered what is not its JSON: %w", err)
	}
	if len(out.Tokens) == 0 {
		return nil, fasthttp.StatusBadRequest, errors.New("the prompt has no tokens")
	}
	return out.Tokens, 0, nil
}

// forward routes the request among ws and sends it on, trying another worker when one fails
// before answering.
func (d *Door) forward(ctx *fasthttp.RequestCtx, path, model string, ws []router.HTTPWorker, toks []uint32, hints *nvext, body []byte, deadline time.Time) {
	bs, _ := d.r.ModelBlockSize(model)
	endpoint := make(map[uint64]string, len(ws))
	allowed := make([]uint64, 0, len(ws))
	for _, w := range ws {
		endpoint[w.ID] = w.Endpoint
		allowed = append(allowed, w.ID)
	}
	// Every worker of the model may take it: say none, so that the request goes through the
	// router queue (a request restricted to some workers bypasses it, as in Dynamo).
	every := len(ws) == len(d.r.ModelWorkers(model))
	session := string(ctx.Request.Header.Peek("X-Dynamo-Session-ID"))
	gone := func() bool { return peer.Gone(ctx.Conn()) }
	var lastErr string
	for attempt := 0; attempt <= d.cfg.Retries && len(allowed) > 0; attempt++ {
		id := d.prefix + strconv.FormatUint(d.ids.Add(1), 36)
		// A request asks for a disaggregated decision while its model has prefill workers
		// (or disaggregation is enforced), as Dynamo's frontend does; the router splits it
		// unless its conditional policy keeps it whole.
		rr := wire.RouteRequest{RequestID: id, Model: model, Tokens: toks, Allowed: allowed, SessionID: session, Disagg: d.r.Disaggregates(model)}
		if attempt == 0 && every {
			rr.Allowed = nil
		}
		hints.routeRequest(&rr, toks, bs)
		var rs wire.RouteResponse
		if err := d.r.RouteWait(&rr, &rs, gone); err != nil {
			status, typ := fasthttp.StatusServiceUnavailable, "service_unavailable"
			var fe *router.FieldError
			switch {
			case errors.Is(err, router.ErrGone):
				d.m.requests.WithLabelValues(path, "499").Inc()
				return // nobody to answer
			case errors.Is(err, router.ErrQueueFull):
				status, typ = fasthttp.StatusTooManyRequests, "queue_full"
			case errors.Is(err, router.ErrQueueTimeout):
				typ = "queue_timeout"
			case errors.Is(err, router.ErrOverloaded):
				status, typ = d.cfg.OverloadStatus, "overloaded"
			case errors.As(err, &fe) && errors.Is(err, router.ErrInvalid):
				status, typ = fasthttp.StatusBadRequest, "invalid_request_error"
			}
			d.fail(ctx, path, status, typ, "", "routing: "+err.Error())
			return
		}
		worker, rank := rs.Worker, rs.Rank
		out := body
		if rs.Prefill {
			var ok bool
			if out, ok = d.prefillStage(ctx, path, id, &rs, endpoint[rs.PrefillWorker], body, deadline); !ok {
				return // the client left
			}
		}
		ures, err := d.send(ctx, endpoint[worker]+path, rank, out, deadline)
		if err == nil {
			d.m.requests.WithLabelValues(path, strconv.Itoa(ures.StatusCode())).Inc()
			d.relay(ctx, ures, id, worker)
			return
		}
		// Nothing of the answer has reached the client: free the booking, try another.
		_ = d.r.Complete(id)
		lastErr = fmt.Sprintf("worker %d: %v", worker, err)
		d.log.Warn("front door: worker failed before answering; trying another", "worker", worker, "model", model, "err", err, "attempt", attempt+1)
		d.m.upstream.WithLabelValues("forward").Inc()
		if i := slices.Index(allowed, worker); i >= 0 {
			allowed = append(allowed[:i], allowed[i+1:]...)
		}
		if attempt < d.cfg.Retries && len(allowed) > 0 {
			d.m.migrations.Inc()
		}
	}
	d.fail(ctx, path, fasthttp.StatusBadGateway, "upstream_error", "", "no worker answered: "+lastErr)
}

// prefillStage runs the prefill stage of a request the router split, as Dynamo's frontend runs
// it for vLLM: the request to the prefill worker with one output token, not streamed, and
// kv_transfer_params asking it to keep the blocks for a remote decode (do_remote_decode); its
// answer's kv_transfer_params go into the decode request, which the caller sends to the decode
// worker. Whatever the prefill worker answered, the prefill stage's booking is released then
// (PrefillDone). It returns the body for the decode worker; when the prefill stage fails (the
// worker unreachable, an error answer, no kv_transfer_params in it) that is the client's own
// body, which the decode worker serves whole — where Dynamo's frontend fails the request, a
// decode worker can always prefill. ok is false when the client left: the bookings are
// released and nothing is to be sent.
func (d *Door) prefillStage(ctx *fasthttp.RequestCtx, path, id string, rs *wire.RouteResponse, endpoint string, body []byte, deadline time.Time) (out []byte, ok bool) {
	var orig map[string]json.RawMessage
	if json.Unmarshal(body, &orig) != nil { // it was decoded once already
		_ = d.r.PrefillDone(id)
		return body, true
	}
	req := maps.Clone(orig)
	req["max_tokens"] = json.RawMessage("1")
	if _, set := req["max_completion_tokens"]; set {
		req["max_completion_tokens"] = json.RawMessage("1")
	}
	req["stream"] = json.RawMessage("false")
	delete(req, "stream_options")
	req["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,` +
		`"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)
	pb, _ := json.Marshal(req)
	params, gone, err := d.prefillCall(ctx, endpoint+path, rs.PrefillRank, pb, deadline)
	_ = d.r.PrefillDone(id)
	if gone {
		_ = d.r.Complete(id)
		d.m.requests.WithLabelValues(path, "499").Inc()
		d.m.disagg.WithLabelValues("client_gone").Inc()
		return nil, false
	}
	if err != nil {
		d.m.upstream.WithLabelValues("prefill").Inc()
		d.m.disagg.WithLabelValues("fallback").Inc()
		d.log.Warn("front door: prefill stage failed; the decode worker serves the request whole",
			"prefill_worker", rs.PrefillWorker, "decode_worker", rs.Worker, "request", id, "err", err)
		return body, true
	}
	d.m.disagg.WithLabelValues("split").Inc()
	ctx.Response.Header.Set("X-Kvrouterd-Prefill-Worker", strconv.FormatUint(rs.PrefillWorker, 10))
	// The client's own body with the engine's parameters added: its stream and length settings
	// stay as they were.
	orig["kv_transfer_params"] = params
	out, _ = json.Marshal(orig)
	return out, true
}

// prefillCall posts a prefill request and returns its answer's kv_transfer_params. It polls the
// client's connection meanwhile: gone reports that the client left, and the call was cancelled
// (the prefill worker sees its connection close and drops the request).
func (d *Door) prefillCall(ctx *fasthttp.RequestCtx, url string, rank uint32, body []byte, deadline time.Time) (params json.RawMessage, gone bool, err error) {
	c, cancel := context.WithCancel(context.Background())
	if !deadline.IsZero() {
		c, cancel = context.WithDeadline(context.Background(), deadline)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(c, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization); len(auth) > 0 {
		req.Header.Set(fasthttp.HeaderAuthorization, string(auth))
	}
	req.Header.Set("X-Data-Parallel-Rank", strconv.FormatUint(uint64(rank), 10))
	type result struct {
		params json.RawMessage
		err    error
	}
	done := make(chan result, 1)
	go func() {
		p, err := d.prefillDo(req)
		done <- result{p, err}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			return r.params, false, r.err
		case <-tick.C:
			if peer.Gone(ctx.Conn()) {
				cancel()
				<-done
				return nil, true, nil
			}
		}
	}
}

func (d *Door) prefillDo(req *http.Request) (json.RawMessage, error) {
	resp, err := d.pre.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answered %d: %.200s", resp.StatusCode, b)
	}
	var a struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("answered what is not its JSON: %w", err)
	}
	if len(a.Params) == 0 || string(a.Params) == "null" {
		return nil, errors.New("answered without kv_transfer_params: is its engine started with a KV connector?")
	}
	return a.Params, nil
}

// errUpstream5xx is a worker's 5xx answer before any body byte, which counts as its failure.
type errUpstream5xx struct{ status int }

func (e errUpstream5xx) Error() string { return fmt.Sprintf("answered %d", e.status) }

// send posts body to url and returns the answer with its body still to stream, or an error if
// the worker could not be reached or answered 5xx.
func (d *Door) send(ctx *fasthttp.RequestCtx, url string, rank uint32, body []byte, deadline time.Time) (*fasthttp.Response, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if auth := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization); len(auth) > 0 {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, auth)
	}
	req.Header.Set("X-Data-Parallel-Rank", strconv.FormatUint(uint64(rank), 10))
	req.SetBodyRaw(body)
	resp := fasthttp.AcquireResponse()
	var err error
	if deadline.IsZero() {
		err = d.up.Do(req, resp)
	} else {
		err = d.up.DoDeadline(req, resp, deadline)
	}
	if err == nil && resp.StatusCode() >= 500 {
		err = errUpstream5xx{resp.StatusCode()}
	}
	if err != nil {
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	return resp, nil
}

// relay streams the worker's answer to the client and moves the booking along: prefill done
// at the first body bytes, the tokens generated as the stream brings them (with output
// tracking, see outputCounter), complete at the end, whatever ends it (the answer's end, the
// client gone, the worker's error, the deadline).
func (d *Door) relay(ctx *fasthttp.RequestCtx, ures *fasthttp.Response, id string, worker uint64) {
	ctx.SetStatusCode(ures.StatusCode())
	if ct := ures.Header.ContentType(); len(ct) > 0 {
		ctx.Response.Header.SetContentTypeBytes(ct)
	}
	ctx.Response.Header.Set("X-Kvrouterd-Worker", strconv.FormatUint(worker, 10))
	src := ures.BodyStream()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		bp := d.bufs.Get().(*[]byte)
		defer func() {
			d.bufs.Put(bp)
			_ = ures.CloseBodyStream()
			fasthttp.ReleaseResponse(ures)
			_ = d.r.Complete(id) // whatever ended the answer: the booking goes
		}()
		if src == nil {
			return
		}
		first := true
		var oc outputCounter
		track := d.r.TracksOutput()
		for {
			n, err := src.Read(*bp)
			if n > 0 {
				if first {
					first = false
					_ = d.r.PrefillDone(id)
				}
				if track && oc.scan((*bp)[:n]) {
					_ = d.r.OutputTokens(id, oc.generated())
				}
				if _, werr := w.Write((*bp)[:n]); werr != nil {
					d.m.ended.WithLabelValues("client_gone").Inc()
					return
				}
				if werr := w.Flush(); werr != nil {
					d.m.ended.WithLabelValues("client_gone").Inc()
					return
				}
			}
			if err == io.EOF {
				d.m.ended.WithLabelValues("done").Inc()
				return
			}
			if err != nil {
				d.m.ended.WithLabelValues("upstream_error").Inc()
				d.log.Warn("front door: the worker's answer broke off", "worker", worker, "request", id, "err", err)
				return
			}
		}
	})
}

type metrics struct {
	requests   *prometheus.CounterVec
	upstream   *prometheus.CounterVec
	ended      *prometheus.CounterVec
	disagg     *prometheus.CounterVec
	migrations prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_requests_total",
			Help: "Front-door requests answered, by path and status (the worker's, once forwarded)."}, []string{"path", "code"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_upstream_errors_total",
			Help: "Workers that failed a front-door call before answering: tokenize, prefill (a disaggregated request's prefill stage), or forward (then given up for the request)."}, []string{"call"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_streams_total",
			Help: "Forwarded answers, by how they ended: done, client_gone, upstream_error (a broken stream or the deadline)."}, []string{"end"}),
		migrations: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_migrations_total",
			Help: "Requests sent to another worker after one failed before answering."}),
		disagg: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouterd_frontdoor_disaggregated_total",
			Help: "Requests the router split into a prefill and a decode stage, by outcome: split (both ran), fallback (the prefill stage failed; the decode worker served it whole), client_gone (during the prefill stage)."}, []string{"outcome"}),
	}
	reg.MustRegister(m.requests, m.upstream, m.ended, m.migrations, m.disagg)
	return m
}
