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
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/bearer"
	"github.com/kvrouterd/kvrouterd/internal/lograte"
	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"
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
	// a write token to generate, a read token for /v1/models; /health is open. The client's
	// Authorization header is then kvrouterd's, and never forwarded to a worker.
	Tokens *bearer.Tokens
}

// Door is the front door over one Router. Safe for concurrent use.
type Door struct {
	r   *router.Router
	cfg Config
	log *slog.Logger
	// eng forwards the requests to the workers' http:// APIs; its calls can be cancelled at
	// any moment, before the answer's headers as during its body, which closes the connection
	// and so ends the engine's request (fasthttp's cannot be cancelled).
	eng upstream
	// up calls them for the prefill stage and over https://: net/http's, cancellable too.
	up  *http.Client
	tok *fasthttp.Client // /tokenize, answers buffered
	m   *metrics
	// refusals logs refused requests, behind a rate limit.
	refusals *slog.Logger

	prefix string        // of the request ids the front door books under
	ids    atomic.Uint64 // the request ids' counter
	turn   atomic.Uint64 // which worker tokenizes next
	bufs   sync.Pool     // *bufio.Reader, for reading streamed answers
	evs    sync.Pool     // *[]byte, an event being read
	aggs   sync.Pool     // *aggregate, assembling an answer
	probe  prober        // the workers' health probes (health.go)
	poll   poller        // the clients of the requests in flight
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
		up: &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true, // the answers go on as they come
		}},
		tok: &fasthttp.Client{Name: "kvrouterd", MaxConnsPerHost: 1024, MaxResponseBodySize: 64 << 20,
			MaxIdleConnDuration: time.Minute},
		m:      newMetrics(cfg.Registry, r),
		prefix: fmt.Sprintf("fd-%08x-", rand.Uint32()),
	}
	d.bufs.New = func() any { return bufio.NewReaderSize(nil, 32<<10) }
	d.evs.New = func() any { b := make([]byte, 0, 4<<10); return &b }
	d.aggs.New = func() any { return new(aggregate) }
	d.startHealth()
	return d
}

// request is one front-door request as it goes: who asked, what, and how its answer is to be
// given. The handler's goroutine fills it; the answer's writer reads it.
type request struct {
	path     string
	endpoint string // Dynamo's endpoint label
	model    string
	reqID    string // X-Request-Id: the client's, or the first booking's id
	start    time.Time
	deadline time.Time
	stream   bool // the client streams
	usage    bool // the client asked for the usage chunk
	chat     bool
	isl      int
	auth     string // the client's Authorization, when it is the worker's to see
	mm       *modelMetrics
}

// Handle serves one request of the front door's API.
func (d *Door) Handle(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	reqID := requestID(ctx)
	ctx.Response.Header.Set("X-Request-Id", reqID)
	if d.cfg.Tokens != nil && path != "/health" {
		need := bearer.Write
		if path == "/v1/models" || strings.HasPrefix(path, "/v1/models/") {
			need = bearer.Read
		}
		if status, msg := d.cfg.Tokens.Refusal(ctx.Request.Header.Peek("Authorization"), need); status != 0 {
			if status == fasthttp.StatusUnauthorized {
				ctx.Response.Header.Set("WWW-Authenticate", bearer.Challenge)
			}
			d.fail(ctx, "other", status, "unauthorized", "", msg)
			return
		}
	}
	switch {
	case path == "/v1/completions" || path == "/v1/chat/completions":
		if !ctx.IsPost() {
			d.fail(ctx, path, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "", "use POST")
			return
		}
		d.generate(ctx, path, reqID)
	case path == "/v1/models":
		d.models(ctx, "")
	case strings.HasPrefix(path, "/v1/models/"):
		d.models(ctx, strings.TrimPrefix(path, "/v1/models/"))
	case path == "/health":
		ctx.SetStatusCode(fasthttp.StatusOK)
	case path == "/v1/kv-cache/stats/stream":
		d.kvStatsStream(ctx)
	default:
		d.fail(ctx, "other", fasthttp.StatusNotFound, "not_found", "", "no endpoint "+strconv.Quote(path))
	}
}

// requestID is the client's X-Request-Id when it is a fit one (printable ASCII, at most 128
// bytes), else a new one.
func requestID(ctx *fasthttp.RequestCtx) string {
	if id := ctx.Request.Header.Peek("X-Request-Id"); len(id) > 0 && len(id) <= 128 {
		ok := true
		for _, c := range id {
			if c < 0x21 || c > 0x7e {
				ok = false
				break
			}
		}
		if ok {
			return string(id)
		}
	}
	b := make([]byte, 0, 36)
	b = append(b, "kvr-"...)
	for range 2 {
		v := rand.Uint64()
		for j := range 8 {
			c := byte(v >> (8 * j))
			b = append(b, hexDigits[c>>4], hexDigits[c&15])
		}
	}
	return string(b)
}

const hexDigits = "0123456789abcdef"

// fail answers OpenAI's error shape (type from the status, code the reason), counts it and
// logs it.
func (d *Door) fail(ctx *fasthttp.RequestCtx, path string, status int, code, param, msg string) {
	e := apiError{Message: msg, Type: errorType(status)}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	writeError(ctx, status, e)
	d.m.requests.WithLabelValues(path, strconv.Itoa(status)).Inc()
	d.refusals.Info("front door: request refused", "path", path, "status", status, "code", code, "msg", msg,
		"request_id", string(ctx.Response.Header.Peek("X-Request-Id")))
}

// models lists the models some worker serves an HTTP API for, as OpenAI's /v1/models does, or
// answers one of them (GET /v1/models/{id}).
func (d *Door) models(ctx *fasthttp.RequestCtx, one string) {
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
	var b []byte
	if one != "" {
		i := slices.IndexFunc(out.Data, func(m model) bool { return m.ID == one })
		if i < 0 {
			d.fail(ctx, "/v1/models/{id}", fasthttp.StatusNotFound, "model_not_found", "model", fmt.Sprintf("the model `%s` does not exist", one))
			return
		}
		b, _ = json.Marshal(out.Data[i])
	} else {
		b, _ = json.Marshal(out)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
	path := "/v1/models"
	if one != "" {
		path = "/v1/models/{id}"
	}
	d.m.requests.WithLabelValues(path, "200").Inc()
}

// generate serves /v1/completions and /v1/chat/completions: tokenize, route, forward.
func (d *Door) generate(ctx *fasthttp.RequestCtx, path, reqID string) {
	q := &request{path: path, reqID: reqID, start: time.Now(), chat: path == "/v1/chat/completions", endpoint: "completions"}
	if q.chat {
		q.endpoint = "chat_completions"
	}
	if d.cfg.Timeout > 0 {
		q.deadline = q.start.Add(d.cfg.Timeout)
	}
	body, err := decodeObject(ctx.PostBody())
	if err != nil || body == nil {
		msg := "the body is not a JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		d.fail(ctx, path, fasthttp.StatusBadRequest, "invalid_json", "", msg)
		return
	}
	if err := json.Unmarshal(body["model"], &q.model); err != nil || q.model == "" {
		d.fail(ctx, path, fasthttp.StatusBadRequest, "invalid_value", "model", "model is required: a string naming a served model")
		return
	}
	if raw, ok := body["stream"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &q.stream) != nil {
			d.fail(ctx, path, fasthttp.StatusBadRequest, "invalid_type", "stream", "stream must be true or false")
			return
		}
	}
	var so map[string]json.RawMessage
	if raw, ok := body["stream_options"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &so) != nil {
			d.fail(ctx, path, fasthttp.StatusBadRequest, "invalid_type", "stream_options", "stream_options must be an object")
			return
		}
		_ = json.Unmarshal(so["include_usage"], &q.usage)
	}
	ws := d.r.HTTPWorkers(q.model, nil)
	if len(ws) == 0 {
		if _, ok := d.r.ModelBlockSize(q.model); ok {
			d.fail(ctx, path, fasthttp.StatusServiceUnavailable, "no_worker", "model",
				fmt.Sprintf("no worker of model %q has registered an http_endpoint", q.model))
			return
		}
		d.fail(ctx, path, fasthttp.StatusNotFound, "model_not_found", "model", fmt.Sprintf("the model `%s` does not exist", q.model))
		return
	}
	var hints nvext
	if raw, ok := body["nvext"]; ok && hints.decode(raw) != nil {
		d.fail(ctx, path, fasthttp.StatusBadRequest, "invalid_type", "nvext", "nvext is not Dynamo's extension object")
		return
	}
	hints.applyHeaders(&ctx.Request.Header)
	if id := hints.BackendInstanceID; id != nil && !slices.ContainsFunc(ws, func(w router.HTTPWorker) bool { return w.ID == *id }) {
		d.fail(ctx, path, fasthttp.StatusBadRequest, "unknown_worker", "nvext.backend_instance_id",
			fmt.Sprintf("nvext.backend_instance_id names worker %d, which is not a registered worker of model %q with an http_endpoint", *id, q.model))
		return
	}
	if hints.CacheSalt == "" {
		_ = json.Unmarshal(body["cache_salt"], &hints.CacheSalt) // vLLM's own field
	}
	if d.cfg.Tokens == nil {
		// Without kvrouterd's own tokens the client's credential is the workers' to read.
		q.auth = string(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	}
	var toks []uint32
	var rewrite bool
	var status int
	if len(hints.TokenData) > 0 {
		toks = hints.TokenData // Dynamo's pre-tokenized prompt
	} else {
		toks, rewrite, status, err = d.tokens(ws, q, body)
	}
	if err != nil {
		code := "invalid_prompt"
		if status >= 500 {
			code = "tokenize_failed"
		}
		d.fail(ctx, path, status, code, map[bool]string{true: "messages", false: "prompt"}[q.chat], err.Error())
		return
	}
	q.isl = len(toks)
	q.mm = d.m.model(q.model)
	if rewrite {
		// The engine is given the ids it would compute, and does not tokenize again.
		body["prompt"], _ = json.Marshal(toks)
	}
	// The engine always streams, with the usage chunk, whatever the client asked: the
	// booking, the measured times and the client's presence follow the stream, and a
	// non-streaming client gets the answer assembled.
	var out []byte
	_, hasStream := body["stream"]
	if !rewrite && so == nil && (!hasStream || q.stream) {
		// The client's body with the fields added before its closing brace: no key twice,
		// and no second encoding of the whole body.
		add := `,"stream":true,"stream_options":{"include_usage":true}}`
		if hasStream {
			add = `,"stream_options":{"include_usage":true}}`
		}
		in := bytes.TrimRight(ctx.PostBody(), " \t\r\n")
		out = make([]byte, 0, len(in)+len(add))
		out = append(append(out, in[:len(in)-1]...), add...)
	} else {
		body["stream"] = json.RawMessage("true")
		if so == nil {
			so = map[string]json.RawMessage{}
		}
		so["include_usage"] = json.RawMessage("true")
		body["stream_options"], _ = json.Marshal(so)
		out, _ = json.Marshal(body)
	}
	d.forward(ctx, q, ws, toks, &hints, out)
}

// nvext is what the front door reads of Dynamo's request extension (lib/llm protocols
// nvext.rs): a pinned worker and rank, the prompt's token ids, its cache salt, and the
// router's per-request overrides. The rest of it goes to the engine with the request.
type nvext struct {
	BackendInstanceID *uint64        `json:"backend_instance_id"`
	DPRank            *uint32        `json:"dp_rank"`
	TokenData         tokenIDs       `json:"token_data"`
	CacheSalt         string         `json:"cache_salt"`
	Override          *wire.Override `json:"router_config_override"`
	// Queue order and the expected output (Dynamo's AgentHints): priority (seconds ahead, its
	// deprecated latency_sensitivity the fallback), strict priority, output length.
	AgentHints *agentHints `json:"agent_hints"`
	// Session affinity's key (Dynamo's session_control; the X-Dynamo-Session-ID header when
	// absent).
	SessionControl *struct {
		SessionID string `json:"session_id"`
	} `json:"session_control"`
}

// agentHints is nvext's agent_hints: queue order (priority: seconds ahead, its deprecated
// latency_sensitivity the fallback; strict priority) and the expected output length.
type agentHints struct {
	Priority           *int32   `json:"priority"`
	LatencySensitivity *float64 `json:"latency_sensitivity"`
	StrictPriority     *uint32  `json:"strict_priority"`
	OSL                *uint32  `json:"osl"`
}

// decode reads raw, nvext's JSON (checked valid), as json.Unmarshal does: by hand when it holds
// token_data alone (Dynamo's pre-tokenized prompt, the common case), which reflection made a
// large part of a request's decoding; else by encoding/json.
func (h *nvext) decode(raw json.RawMessage) error {
	d := unsafeString(raw)
	if i := skipSpace(d, 0); i < len(d) && d[i] == '{' {
		plain := true
		eachMember(d, func(k, _ string) bool {
			plain = k == `"token_data"`
			return plain
		})
		if plain {
			var err error
			eachMember(d, func(_, v string) bool {
				err = h.TokenData.UnmarshalJSON([]byte(v))
				return err == nil
			})
			return err
		}
	}
	return json.Unmarshal(raw, h)
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
func (d *Door) tokens(ws []router.HTTPWorker, q *request, body map[string]json.RawMessage) (toks []uint32, rewrite bool, status int, err error) {
	chat := q.chat
	// The /tokenize request: the body's own members, raw, in key order.
	var arr [10]member
	tb := append(arr[:0], member{k: "model", v: body["model"]})
	if chat {
		if len(body["messages"]) == 0 {
			return nil, false, fasthttp.StatusBadRequest, errors.New("messages is required")
		}
		for _, k := range []string{"messages", "add_generation_prompt", "continue_final_message", "add_special_tokens",
			"chat_template", "chat_template_kwargs", "tools", "mm_processor_kwargs"} {
			if v, ok := body[k]; ok {
				tb = append(tb, member{k: k, v: v})
			}
		}
	} else {
		p := body["prompt"]
		var ids tokenIDs // p and batch[0] are JSON: the map's decoding checked them
		if ids.UnmarshalJSON(p) == nil && len(ids) > 0 {
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
			if ids.UnmarshalJSON(batch[0]) == nil && len(ids) > 0 {
				return ids, false, 0, nil
			}
			if json.Unmarshal(batch[0], &text) != nil {
				return nil, false, fasthttp.StatusBadRequest, errors.New("prompt is required: a string, token ids, or a list of either")
			}
		}
		if text == "" {
			return nil, false, fasthttp.StatusBadRequest, errors.New("prompt must not be empty")
		}
		tb = append(tb, member{k: "prompt", v: appendString(nil, text)})
		if v, ok := body["add_special_tokens"]; ok {
			tb = append(tb, member{k: "add_special_tokens", v: v})
		}
	}
	slices.SortFunc(tb, func(a, b member) int { return strings.Compare(a.k, b.k) })
	n := 2
	for _, m := range tb {
		n += len(m.k) + len(m.v) + 4
	}
	req := append(make([]byte, 0, n), '{')
	for i, m := range tb {
		if i > 0 {
			req = append(req, ',')
		}
		req = append(appendString(req, m.k), ':')
		req = append(req, m.v...)
	}
	req = append(req, '}')
	toks, status, err = d.tokenize(ws, q, req)
	return toks, rewrite, status, err
}

// tokenize asks the model's workers in turn for req's token ids until one answers: a 4xx
// answer is the request's fault and ends the search.
func (d *Door) tokenize(ws []router.HTTPWorker, q *request, req []byte) ([]uint32, int, error) {
	start := int(d.turn.Add(1))
	// Workers out of routing are asked last: an unreachable one would cost the request its
	// connection's timeout.
	order := make([]router.HTTPWorker, 0, len(ws))
	var out []router.EjectedRank
	if out = d.r.OutRanks(out); len(out) == 0 {
		for i := range ws {
			order = append(order, ws[(start+i)%len(ws)])
		}
	} else {
		isOut := func(id uint64) bool {
			return slices.ContainsFunc(out, func(e router.EjectedRank) bool { return e.Worker == id })
		}
		for pass := range 2 {
			for i := range ws {
				if w := ws[(start+i)%len(ws)]; isOut(w.ID) == (pass == 1) {
					order = append(order, w)
				}
			}
		}
	}
	var last error
	for _, w := range order[:min(len(order), 3)] {
		toks, status, err := d.tokenizeAt(w.Endpoint, authFor(q, w), req)
		if err == nil {
			return toks, 0, nil
		}
		if status >= 400 && status < 500 {
			return nil, status, err
		}
		d.m.upstream.WithLabelValues("tokenize").Inc()
		reason := "tokenize"
		if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
			reason = "connect" // one refused connection ejects at once
		}
		d.r.UpstreamFailed(w.ID, 0, reason)
		last = fmt.Errorf("worker %d: %w", w.ID, err)
	}
	return nil, fasthttp.StatusServiceUnavailable, fmt.Errorf("no worker could tokenize the prompt: %w", last)
}

func (d *Door) tokenizeAt(endpoint, auth string, body []byte) ([]uint32, int, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(strings.TrimRight(endpoint, "/") + "/tokenize")
	req.Header.SetMethod(fasthttp.MethodPost)
	if auth != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, auth)
	}
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := d.tok.DoTimeout(req, resp, d.cfg.TokenizeTimeout); err != nil {
		return nil, 0, err
	}
	if code := resp.StatusCode(); code != fasthttp.StatusOK {
		return nil, code, fmt.Errorf("/tokenize answered %d: %.200s", code, resp.Body())
	}
	// The ids read in place when they are a plain list, else by encoding/json, errors and all.
	b := resp.Body()
	var toks []uint32
	if t := gjson.Get(unsafeString(b), "tokens"); t.IsArray() && gjson.ValidBytes(b) {
		toks, _ = appendIDs(nil, t.Raw)
	}
	if toks == nil {
		var out struct {
			Tokens tokenIDs `json:"tokens"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, fasthttp.StatusBadGateway, fmt.Errorf("/tokenize answered what is not its JSON: %w", err)
		}
		toks = out.Tokens
	}
	if len(toks) == 0 {
		return nil, fasthttp.StatusBadRequest, errors.New("the prompt has no tokens")
	}
	return toks, 0, nil
}

// authFor is the Authorization header a worker is sent: its own API key when it has one, else
// the client's when that is not kvrouterd's own token, else none.
func authFor(q *request, w router.HTTPWorker) string {
	if w.APIKey != "" {
		return "Bearer " + w.APIKey
	}
	return q.auth
}

// forward routes the request among ws and sends it on, trying another worker when one fails
// before answering.
func (d *Door) forward(ctx *fasthttp.RequestCtx, q *request, ws []router.HTTPWorker, toks []uint32, hints *nvext, body []byte) {
	bs, _ := d.r.ModelBlockSize(q.model)
	byID := make(map[uint64]router.HTTPWorker, len(ws))
	allowed := make([]uint64, 0, len(ws))
	for _, w := range ws {
		byID[w.ID] = w
		allowed = append(allowed, w.ID)
	}
	// Every worker of the model may take it: say none, so that the request goes through the
	// router queue (a request restricted to some workers bypasses it, as in Dynamo).
	every := len(ws) == len(d.r.ModelWorkers(q.model))
	session := string(ctx.Request.Header.Peek("X-Dynamo-Session-ID"))
	class := router.PolicyClassOf(string(ctx.Request.Header.Peek(router.PolicyClassHeader)))
	w := d.poll.watch(ctx.Conn(), q.deadline)
	inflight := q.mm.inflight
	inflight.Inc()
	handed := false // to the answer's stream writer, which ends the watcher and the gauge
	defer func() {
		if !handed {
			w.end()
			inflight.Dec()
		}
	}()
	gone := func() bool { return w.err() != nil }
	var last *errUpstream
	var lastWorker uint64
	for attempt := 0; attempt <= d.cfg.Retries && len(allowed) > 0; attempt++ {
		id := d.prefix + strconv.FormatUint(d.ids.Add(1), 36)
		// A request asks for a disaggregated decision while its model has prefill workers
		// (or disaggregation is enforced), as Dynamo's frontend does; the router splits it
		// unless its conditional policy keeps it whole.
		rr := wire.RouteRequest{RequestID: id, Model: q.model, Tokens: toks, Allowed: allowed, SessionID: session, Disagg: d.r.Disaggregates(q.model)}
		if attempt == 0 && every {
			rr.Allowed = nil
		}
		hints.routeRequest(&rr, toks, bs)
		var rs wire.RouteResponse
		if err := d.r.RouteWaitClass(&rr, &rs, class, gone); err != nil {
			status, code := fasthttp.StatusServiceUnavailable, "no_worker"
			var fe *router.FieldError
			var pe *router.PolicyClassError
			switch {
			case errors.As(err, &pe):
				d.classRefused(ctx, q, pe)
				return
			case errors.Is(err, router.ErrUnknownPolicyClass):
				d.fail(ctx, q.path, fasthttp.StatusBadRequest, "unknown_policy_class", "", err.Error())
				return
			case errors.Is(err, router.ErrGone):
				d.early(ctx, q, w, nil)
				return
			case errors.Is(err, router.ErrQueueFull):
				status, code = fasthttp.StatusTooManyRequests, "queue_full"
			case errors.Is(err, router.ErrQueueTimeout):
				code = "queue_timeout"
			case errors.Is(err, router.ErrOverloaded):
				status, code = d.cfg.OverloadStatus, "overloaded"
			case errors.As(err, &fe) && errors.Is(err, router.ErrInvalid):
				status, code = fasthttp.StatusBadRequest, "invalid_request"
				d.fail(ctx, q.path, status, code, fe.Field, "routing: "+err.Error())
				return
			}
			msg := err.Error()
			if errors.As(err, &fe) {
				msg = fe.Msg // the request's model is not what is wrong: its workers' state is
			}
			d.fail(ctx, q.path, status, code, "", msg)
			return
		}
		worker, rank := rs.Worker, rs.Rank
		routed, predicted := time.Now(), rs.PredictedTTFT
		hw := byID[worker]
		out := body
		if rs.Prefill {
			var ok bool
			if out, ok = d.prefillStage(ctx, q, id, &rs, byID[rs.PrefillWorker], body, w); !ok {
				d.early(ctx, q, w, nil)
				return
			}
		}
		o := &outgoing{endpoint: hw.Endpoint, path: q.path, rank: rank, auth: authFor(q, hw), reqID: q.reqID, body: out}
		ures, err := d.send(o, w)
		if err == nil {
			d.r.UpstreamOK(worker, rank)
			handed = d.answer(ctx, q, w, ures, id, worker, rank, predicted, routed)
			return
		}
		_ = d.r.Complete(id)
		if errors.Is(err, errDeadline) || errors.Is(err, errClientGone) {
			d.early(ctx, q, w, err)
			return
		}
		// Nothing of the answer has reached the client: free the booking, try another.
		var ue *errUpstream
		if !errors.As(err, &ue) {
			ue = &errUpstream{err: err}
		}
		last, lastWorker = ue, worker
		d.r.UpstreamFailed(worker, rank, ue.reason())
		d.log.Warn("front door: worker failed before answering", "worker", worker, "rank", rank, "model", q.model,
			"err", err, "attempt", attempt+1, "request_id", q.reqID)
		d.m.upstream.WithLabelValues("forward").Inc()
		if i := slices.Index(allowed, worker); i >= 0 {
			allowed = append(allowed[:i], allowed[i+1:]...)
		}
		if attempt < d.cfg.Retries && len(allowed) > 0 {
			d.m.migrations.Inc()
			q.mm.migrations.Inc()
		}
	}
	d.m.dynRequests.WithLabelValues(q.model, q.endpoint, requestType(q), "error").Inc()
	if last != nil && last.status != 0 {
		// The engine's own error, its message kept.
		e := last.apiErr
		e.Message = fmt.Sprintf("worker %d: %s", lastWorker, e.Message)
		writeError(ctx, last.status, e)
		d.m.requests.WithLabelValues(q.path, strconv.Itoa(last.status)).Inc()
		return
	}
	msg := "no worker answered"
	if last != nil {
		msg += fmt.Sprintf(": worker %d: %v", lastWorker, last)
	}
	d.fail(ctx, q.path, fasthttp.StatusBadGateway, "upstream_error", "", msg)
}

func requestType(q *request) string {
	if q.stream {
		return "stream"
	}
	return "unary"
}

// early ends a request that the client left, or that outlived the deadline, before its answer
// began: a client still there is told of the timeout.
func (d *Door) early(ctx *fasthttp.RequestCtx, q *request, w *watcher, err error) {
	d.m.dynRequests.WithLabelValues(q.model, q.endpoint, requestType(q), "error").Inc()
	if errors.Is(err, errDeadline) || errors.Is(w.err(), errDeadline) {
		d.m.ended.WithLabelValues("timeout").Inc()
		d.fail(ctx, q.path, fasthttp.StatusGatewayTimeout, "timeout", "",
			fmt.Sprintf("the request outlived --frontend-timeout (%v) before its answer began", d.cfg.Timeout))
		return
	}
	d.m.requests.WithLabelValues(q.path, "499").Inc()
	d.m.dynDisconnected.Inc()
	q.mm.cancelled.Inc()
	d.log.Info("front door: the client went away before the answer began", "model", q.model, "request_id", q.reqID)
	goneAnswer(ctx)
}

// goneAnswer is the answer to a client taken for gone: nobody should read it, but should the
// client still be there it reads an error, not an empty success.
func goneAnswer(ctx *fasthttp.RequestCtx) {
	writeError(ctx, 499, apiError{Message: "the client went away; the request was cancelled", Type: "invalid_request_error", Code: ptr("client_gone")})
	ctx.SetConnectionClose()
}

// answer relays a worker's answer (its headers in): an error answer in OpenAI's shape; an
// event stream to a streaming client as it comes, or assembled into one JSON answer for the
// others; a whole JSON answer as it is. It reports whether the answer was handed to the
// response's stream writer, which then owns ures, the watcher and the booking.
func (d *Door) answer(ctx *fasthttp.RequestCtx, q *request, w *watcher, ures *upAnswer, id string, worker uint64, rank uint32,
	predicted float64, routed time.Time) bool {
	a := &answer{d: d, q: q, id: id, worker: worker, rank: rank, track: d.r.TracksOutput(), predicted: predicted, routed: routed}
	status := ures.status
	ctx.Response.Header.Set("X-Kvrouterd-Worker", strconv.FormatUint(worker, 10))
	if predicted > 0 {
		ctx.Response.Header.Set("X-Kvrouterd-Predicted-Ttft-Ms", strconv.FormatFloat(predicted, 'f', 1, 64))
	}
	release := func() { _ = ures.Body.Close() }
	if status >= 300 {
		b, _ := io.ReadAll(io.LimitReader(ures.Body, 64<<10))
		release()
		_ = d.r.Complete(id)
		writeError(ctx, status, engineError(status, b))
		d.m.requests.WithLabelValues(q.path, strconv.Itoa(status)).Inc()
		d.m.dynRequests.WithLabelValues(q.model, q.endpoint, requestType(q), "error").Inc()
		return false
	}
	passHeaders(ctx, ures)
	src := ures.Body
	if !strings.HasPrefix(ures.ctype, "text/event-stream") {
		// An engine that answered whole although asked to stream: relayed as it is, if whole.
		d.whole(ctx, a, w, ures, status)
		release()
		return false
	}
	if !q.stream {
		d.assemble(ctx, a, w, src)
		release()
		return false
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("text/event-stream")
	sb := &streamBody{d: d, a: a, w: w, status: status, release: release, src: src,
		rd: d.bufs.Get().(*bufio.Reader), evb: d.evs.Get().(*[]byte)}
	sb.rd.Reset(src)
	ctx.SetBodyStream(sb, -1)
	return true
}

func ptr[T any](v T) *T { return &v }

// errCut ends the client's stream with an error, so that its connection ends without the
// stream's last chunk: the client sees a broken answer, not a whole one.
var errCut = errors.New("frontdoor: the answer was cut")

// streamBody is a streaming client's answer, as fasthttp reads it from the connection's
// goroutine: the worker's events as they come (each read of it flushed to the client), and
// when the worker's answer broke off or the deadline passed, an OpenAI error event and then
// errCut. fasthttp closes it once, however the answer ended: Close ends the booking and
// records what was measured.
type streamBody struct {
	d       *Door
	a       *answer
	w       *watcher
	status  int
	release func()
	src     io.Reader // the worker's answer's body
	rd      *bufio.Reader
	evb     *[]byte
	out     []byte // what is to go to the client
	off     int
	end     string // how the answer ended, once it has
	err     error  // what Read returns once out is sent
}

func (s *streamBody) Read(p []byte) (int, error) {
	for s.off == len(s.out) {
		if s.end != "" {
			return 0, s.err
		}
		s.next()
	}
	n := copy(p, s.out[s.off:])
	s.off += n
	return n, nil
}

// next reads the worker's events up to one that goes to the client, or the answer's end.
func (s *streamBody) next() {
	s.out, s.off = s.out[:0], 0
	for {
		var raw, data []byte
		var err error
		if s.a.done {
			// [DONE] has gone on: the answer is whole, its body's end is read by the
			// connection's next call.
			wholeBody(s.src)
			err = io.EOF
		} else {
			raw, data, err = readEvent(s.rd, s.evb)
		}
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			s.end = s.a.end(s.w, err)
			switch s.end {
			case "done":
				s.err = io.EOF
			case "client_gone":
				s.err = errClientGone
			default:
				// The client must see that its answer was cut: an error event, then the
				// connection ends without the stream's last chunk.
				msg := s.a.cutMessage(s.end, err)
				s.d.log.Warn("front door: the worker's answer was cut", "worker", s.a.worker, "rank", s.a.rank,
					"request_id", s.a.q.reqID, "reason", msg)
				s.out = append(s.out, "data: "...)
				s.out = append(s.out, bytes.TrimRight(errorBody(apiError{Message: msg, Type: "server_error", Code: ptr(s.end)}), "\n")...)
				s.out = append(s.out, "\n\n"...)
				s.err = errCut
			}
			return
		}
		if data == nil || s.a.event(data) {
			s.out = append(s.out, raw...)
			return
		}
	}
}

// Close ends the answer: fasthttp calls it once the client's answer is written or failed.
func (s *streamBody) Close() error {
	if s.end == "" {
		s.end = "client_gone" // the client's connection failed before the answer's end
	}
	s.rd.Reset(nil)
	s.d.bufs.Put(s.rd)
	s.d.evs.Put(s.evb)
	s.release()
	s.w.end()
	s.a.q.mm.inflight.Dec()
	s.a.finish(s.end, s.status)
	return nil
}

// end classifies how an answer ended, after its reading stopped with err.
func (a *answer) end(w *watcher, err error) string {
	switch {
	case errors.Is(w.err(), errClientGone):
		return "client_gone"
	case errors.Is(w.err(), errDeadline) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case err != nil || !a.whole():
		return "upstream_error"
	}
	return "done"
}

// cutMessage says why an answer was cut.
func (a *answer) cutMessage(end string, err error) string {
	if end == "timeout" {
		return fmt.Sprintf("the answer was cut after %d tokens: the request outlived --frontend-timeout (%v)", a.tokens(), a.d.cfg.Timeout)
	}
	why := "the stream ended without its last event"
	if err != nil {
		why = err.Error()
	}
	return fmt.Sprintf("worker %d's answer broke off after %d tokens: %s", a.worker, a.tokens(), why)
}

// assemble reads the worker's event stream whole and answers a non-streaming client with the
// assembled answer, or with an error when the stream broke off or carried one.
func (d *Door) assemble(ctx *fasthttp.RequestCtx, a *answer, w *watcher, src io.Reader) {
	agg := d.aggs.Get().(*aggregate)
	defer d.putAggregate(agg)
	agg.reset(a.q.chat)
	rd := d.bufs.Get().(*bufio.Reader)
	rd.Reset(src)
	evb := d.evs.Get().(*[]byte)
	var err error
	for {
		var data []byte
		if _, data, err = readEvent(rd, evb); err != nil {
			break
		}
		if data == nil {
			continue
		}
		a.event(data)
		if a.done {
			// The answer is whole: its body's end is read by the connection's next call.
			wholeBody(src)
			break
		}
		if a.errEv == nil {
			agg.add(data)
		}
	}
	if err == io.EOF {
		err = nil
	}
	rd.Reset(nil)
	d.bufs.Put(rd)
	d.evs.Put(evb)
	end := a.end(w, err)
	switch {
	case end == "client_gone":
		goneAnswer(ctx)
		a.finish(end, 499)
		return
	case a.errEv != nil:
		e := engineError(fasthttp.StatusInternalServerError, a.errEv)
		status := fasthttp.StatusInternalServerError
		if e.Code != nil {
			if c, err := strconv.Atoi(*e.Code); err == nil && c >= 400 && c < 600 {
				status = c
			}
		}
		writeError(ctx, status, e)
		a.finish("engine_error", status)
		return
	case end != "done":
		msg := a.cutMessage(end, err)
		d.log.Warn("front door: the worker's answer was cut", "worker", a.worker, "rank", a.rank, "request_id", a.q.reqID, "reason", msg)
		status := fasthttp.StatusBadGateway
		if end == "timeout" {
			status = fasthttp.StatusGatewayTimeout
		}
		writeError(ctx, status, apiError{Message: msg, Type: "server_error", Code: ptr(end)})
		a.finish(end, status)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.SetBody(agg.bytes())
	a.finish(end, fasthttp.StatusOK)
}

// maxKeptAggregate is the size beyond which an aggregate's buffers are not kept for the next
// answer: a long answer's.
const maxKeptAggregate = 256 << 10

func (d *Door) putAggregate(g *aggregate) {
	if g.held() <= maxKeptAggregate {
		g.reset(false)
		d.aggs.Put(g)
	}
}

// wholeBody tells the worker's answer's body, if it can be told, that the answer is whole.
func wholeBody(body io.Reader) {
	if b, ok := body.(interface{ Whole() }); ok {
		b.Whole()
	}
}

// whole relays an answer that is not an event stream, as it is, once it has all of it.
func (d *Door) whole(ctx *fasthttp.RequestCtx, a *answer, w *watcher, ures *upAnswer, status int) {
	b, err := io.ReadAll(io.LimitReader(ures.Body, 256<<20))
	end := a.end(w, err)
	if end == "upstream_error" && err == nil {
		end = "done" // a JSON answer has no [DONE]: its length is its end
	}
	switch end {
	case "client_gone":
		goneAnswer(ctx)
		a.finish(end, 499)
		return
	case "done":
	default:
		msg := a.cutMessage(end, err)
		d.log.Warn("front door: the worker's answer was cut", "worker", a.worker, "request_id", a.q.reqID, "reason", msg)
		writeError(ctx, fasthttp.StatusBadGateway, apiError{Message: msg, Type: "server_error", Code: ptr(end)})
		a.finish(end, fasthttp.StatusBadGateway)
		return
	}
	a.first, a.last = time.Now(), time.Now()
	a.readUsage(gjson.GetBytes(b, "usage"))
	_ = d.r.PrefillDone(a.id)
	ctx.SetStatusCode(status)
	if ct := ures.ctype; ct != "" {
		ctx.Response.Header.SetContentType(ct)
	}
	ctx.SetBody(b)
	a.finish(end, status)
}

// finish ends an answer's booking and records what it measured.
func (a *answer) finish(end string, status int) {
	d, q := a.d, a.q
	_ = d.r.Complete(a.id)
	if end == "upstream_error" {
		// A broken answer is the worker's failure, as a reset before it would be.
		d.r.UpstreamFailed(a.worker, a.rank, "reset")
	}
	d.m.ended.WithLabelValues(end).Inc()
	d.m.requests.WithLabelValues(q.path, strconv.Itoa(status)).Inc()
	ok := end == "done"
	d.m.dynRequests.WithLabelValues(q.model, q.endpoint, requestType(q), map[bool]string{true: "success", false: "error"}[ok]).Inc()
	mm := q.mm
	if end == "client_gone" {
		d.m.dynDisconnected.Inc()
		mm.cancelled.Inc()
		d.log.Info("front door: the client went away; the worker's request is cancelled", "worker", a.worker, "request_id", q.reqID, "tokens", a.tokens())
	}
	dur := time.Since(q.start).Seconds()
	mm.duration.Observe(dur)
	mm.dynDuration.Observe(dur)
	isl := q.isl
	if a.hasUsage && a.usage.Prompt > 0 {
		isl = int(a.usage.Prompt)
	}
	mm.isl.Observe(float64(isl))
	mm.dynISL.Observe(float64(isl))
	n := a.tokens()
	mm.osl.Observe(float64(n))
	mm.dynOSL.Observe(float64(n))
	mm.outputTokens.Add(float64(n))
	if a.first.IsZero() {
		return
	}
	ttft := a.first.Sub(q.start).Seconds()
	mm.ttft.Observe(ttft)
	if measured := a.first.Sub(a.routed).Seconds(); a.predicted > 0 && measured > 0 {
		mm.predRatio.Observe(a.predicted / 1e3 / measured)
	}
	mm.dynTTFT.Observe(ttft)
	itl := -1.0
	if n > 1 && a.last.After(a.first) {
		itl = a.last.Sub(a.first).Seconds() / float64(n-1)
	}
	d.m.observe(rankKey{a.worker, a.rank, "decode"}, ttft, itl, isl)
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
func (d *Door) prefillStage(ctx *fasthttp.RequestCtx, q *request, id string, rs *wire.RouteResponse, pw router.HTTPWorker, body []byte, w *watcher) (out []byte, ok bool) {
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
	began := time.Now()
	params, gone, err := d.prefillCall(strings.TrimRight(pw.Endpoint, "/")+q.path, rs.PrefillRank, authFor(q, pw), q.reqID, pb, w)
	_ = d.r.PrefillDone(id)
	if gone {
		_ = d.r.Complete(id)
		d.m.disagg.WithLabelValues("client_gone").Inc()
		return nil, false
	}
	if err != nil {
		d.r.UpstreamFailed(rs.PrefillWorker, rs.PrefillRank, "5xx")
		d.m.upstream.WithLabelValues("prefill").Inc()
		d.m.disagg.WithLabelValues("fallback").Inc()
		d.log.Warn("front door: prefill stage failed; the decode worker serves the request whole",
			"prefill_worker", rs.PrefillWorker, "decode_worker", rs.Worker, "request_id", q.reqID, "err", err)
		return body, true
	}
	d.r.UpstreamOK(rs.PrefillWorker, rs.PrefillRank)
	// The prefill stage's answer is its first token: its time is the prefill worker's TTFT.
	d.m.observe(rankKey{rs.PrefillWorker, rs.PrefillRank, "prefill"}, time.Since(began).Seconds(), -1, q.isl)
	d.m.disagg.WithLabelValues("split").Inc()
	ctx.Response.Header.Set("X-Kvrouterd-Prefill-Worker", strconv.FormatUint(rs.PrefillWorker, 10))
	// The client's own body with the engine's parameters added: its stream and length settings
	// stay as they were.
	orig["kv_transfer_params"] = params
	out, _ = json.Marshal(orig)
	return out, true
}

// prefillCall posts a prefill request and returns its answer's kv_transfer_params. When the
// watcher fires meanwhile (the client left, or the deadline passed), the call is cancelled (the
// prefill worker sees its connection close and drops the request) and gone is true.
func (d *Door) prefillCall(url string, rank uint32, auth, reqID string, body []byte, w *watcher) (params json.RawMessage, gone bool, err error) {
	req, err := http.NewRequestWithContext(w.call(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, auth)
	}
	req.Header.Set("X-Request-Id", reqID)
	req.Header.Set("X-Data-Parallel-Rank", strconv.FormatUint(uint64(rank), 10))
	params, err = d.prefillDo(req)
	if w.err() != nil {
		return nil, true, nil
	}
	return params, false, err
}

func (d *Door) prefillDo(req *http.Request) (json.RawMessage, error) {
	resp, err := d.up.Do(req)
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

// classRefused answers a request its policy class refused (a limit, a deadline) with Dynamo's
// structured overload body.
func (d *Door) classRefused(ctx *fasthttp.RequestCtx, q *request, pe *router.PolicyClassError) {
	status := d.cfg.OverloadStatus
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(pe.AppendJSON(nil, status))
	d.m.requests.WithLabelValues(q.path, strconv.Itoa(status)).Inc()
	d.refusals.Info("front door: request refused by its policy class", "path", q.path, "status", status, "msg", pe.Error())
}
