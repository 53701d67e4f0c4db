package mocker

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/kvrouterd/kvrouterd/internal/freelist"
	"github.com/kvrouterd/kvrouterd/internal/peer"
)

// api is the OpenAI-compatible HTTP API (vLLM's routes and shapes) in front of the engine.
// fasthttp runs each request on its own goroutine; a handler keeps nothing of the request's
// bytes once it returns (prompts are decoded into fresh slices).
type api struct {
	cfg     Config
	eng     *engine
	log     *slog.Logger
	maxLen  int    // max_model_len
	nonce   uint64 // request ids: nonce and a count, so two mockers' ids differ
	ids     atomic.Uint64
	started int64 // the model's "created"

	// The KV connector: this engine's id and the host and port a decode worker reads its
	// blocks from (its HTTP API's), and the blocks held for decode workers.
	engineID string
	xferHost string
	xferPort int
	held     *held

	// inflight counts the handlers running and the streams being written.
	inflight atomic.Int64
	streams  *freelist.List[eventStream] // spare stream bodies, their buffers kept

	// generations counts the generate requests that arrived, for Config.DieAfter; crash is
	// what the one past it calls (Mocker.crash).
	generations atomic.Int64
	crash       func()
}

// goneEvery is how often a request waiting for the engine looks whether its client has gone:
// a syscall per waiting request each time, and the abort comes this much later at most.
const goneEvery = 20 * time.Millisecond

// apiError is an error answer in vLLM's shape.
type apiError struct {
	status  int
	typ     string
	message string
}

func badRequest(format string, args ...any) *apiError {
	return &apiError{fasthttp.StatusBadRequest, "BadRequestError", fmt.Sprintf(format, args...)}
}

// appendJSON appends e as vLLM's ErrorResponse, {"error":{"message","type","param","code"}}:
// compact as FastAPI's JSONResponse writes an error answer, or spaced as Python's json.dumps
// writes the error event that ends a stream (vLLM's create_streaming_error_response).
func (e *apiError) appendJSON(dst []byte, spaced bool) []byte {
	sep, colon := ",", ":"
	if spaced {
		sep, colon = ", ", ": "
	}
	dst = append(dst, `{"error"`...)
	dst = append(dst, colon...)
	dst = append(dst, `{"message"`...)
	dst = append(dst, colon...)
	dst = appendJSONString(dst, e.message)
	dst = append(dst, sep...)
	dst = append(dst, `"type"`...)
	dst = append(dst, colon...)
	dst = appendJSONString(dst, e.typ)
	dst = append(dst, sep...)
	dst = append(dst, `"param"`...)
	dst = append(dst, colon...)
	dst = append(dst, `null`...)
	dst = append(dst, sep...)
	dst = append(dst, `"code"`...)
	dst = append(dst, colon...)
	dst = strconv.AppendInt(dst, int64(e.status), 10)
	return append(dst, "}}"...)
}

func (a *api) fail(ctx *fasthttp.RequestCtx, e *apiError) {
	b := e.appendJSON(nil, false)
	ctx.SetStatusCode(e.status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
	a.log.Debug("request refused", "path", string(ctx.Path()), "status", e.status, "message", e.message)
}

func (a *api) handle(ctx *fasthttp.RequestCtx) {
	a.inflight.Add(1)
	defer a.inflight.Add(-1)
	method := "POST"
	var h func(*fasthttp.RequestCtx)
	switch string(ctx.Path()) {
	case "/v1/completions":
		h = a.completions
	case "/v1/chat/completions":
		h = a.chat
	case "/tokenize":
		h = a.tokenize
	case "/detokenize":
		h = a.detokenize
	case "/v1/models":
		method, h = "GET", a.models
	case "/health":
		method, h = "GET", func(ctx *fasthttp.RequestCtx) {}
	case "/metrics":
		method, h = "GET", a.metrics
	case "/kv_transfer/read", "/kv_transfer/release":
		h = a.transferEndpoint
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"detail":"Not Found"}`)
		return
	}
	if string(ctx.Method()) != method && !(method == "GET" && ctx.IsHead()) {
		ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
		ctx.Response.Header.Set("Allow", method)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"detail":"Method Not Allowed"}`)
		return
	}
	h(ctx)
}

// dies counts a generate request and reports whether it is the one past Config.DieAfter, which
// crashes the mocker instead of being served.
func (a *api) dies() bool {
	if n := a.cfg.DieAfter; n > 0 && a.generations.Add(1) > int64(n) {
		a.crash()
		return true
	}
	return false
}

// checkModel accepts the served model, or none (vLLM's default).
func (a *api) checkModel(model string) *apiError {
	if model == "" || model == a.cfg.Model {
		return nil
	}
	return &apiError{fasthttp.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model)}
}

// outputLen is the output length of a request of prompt tokens asking for maxTokens (nil:
// unset), within max_model_len.
func (a *api) outputLen(prompt int, maxTokens *int) (int, *apiError) {
	if prompt == 0 {
		return 0, badRequest("Prompt cannot be empty")
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return 0, badRequest("max_tokens must be at least 1, got %d.", *maxTokens)
		}
		if prompt+*maxTokens > a.maxLen {
			return 0, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens "+
				"(%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
				a.maxLen, prompt+*maxTokens, prompt, *maxTokens)
		}
		return *maxTokens, nil
	}
	if prompt >= a.maxLen {
		return 0, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. "+
			"Please reduce the length of the input messages.", a.maxLen, prompt)
	}
	return min(a.cfg.DefaultMaxTokens, a.maxLen-prompt), nil
}

func checkCommon(n *int, stream bool, opts *streamOptions) *apiError {
	if n != nil && *n != 1 {
		return badRequest("n = %d: kvr-mocker generates one choice per request", *n)
	}
	if opts != nil && !stream {
		return badRequest("Stream options can only be defined when `stream=True`.")
	}
	return nil
}

// read decodes the body into req and checks its model (*model, a field of req), answering a
// refusal itself.
func (a *api) read(ctx *fasthttp.RequestCtx, req any, model *string) bool {
	if err := decodeBody(ctx.PostBody(), req); err != nil {
		a.fail(ctx, badRequest("%v", err))
		return false
	}
	if e := a.checkModel(*model); e != nil {
		a.fail(ctx, e)
		return false
	}
	return true
}

// begin decodes a generation request's body into req and checks what both endpoints check,
// answering a refusal itself. It returns the request's stop conditions.
func (a *api) begin(ctx *fasthttp.RequestCtx, req any, g *generationRequest) (*stopSpec, bool) {
	if !a.read(ctx, req, &g.Model) {
		return nil, false
	}
	if e := checkCommon(g.N, g.Stream, g.StreamOptions); e != nil {
		a.fail(ctx, e)
		return nil, false
	}
	if p := g.KVTransferParams; p != nil {
		if e := p.check(g.Stream); e != nil {
			a.fail(ctx, e)
			return nil, false
		}
	}
	stop, err := parseStop(g.Stop, g.StopTokenIDs, g.IncludeStopStrInOutput)
	if err != nil {
		a.fail(ctx, badRequest("%v", err))
		return nil, false
	}
	return stop, true
}

func (a *api) completions(ctx *fasthttp.RequestCtx) {
	if a.dies() {
		return
	}
	var req completionRequest
	stop, ok := a.begin(ctx, &req, &req.generationRequest)
	if !ok {
		return
	}
	bos := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	prompt, err := parsePrompt(req.Prompt, bos)
	if err != nil {
		a.fail(ctx, badRequest("%v", err))
		return
	}
	if bos && len(prompt) == 1 && prompt[0] == BOSID && isText(req.Prompt) {
		prompt = nil // text without a piece: empty, whatever special tokens were added
	}
	out, e := a.outputLen(len(prompt), req.MaxTokens)
	if e != nil {
		a.fail(ctx, e)
		return
	}
	a.generate(ctx, &generation{
		chat: false, id: a.newID("cmpl-"), created: time.Now().Unix(), model: a.cfg.Model,
		prompt: prompt, output: out, stream: req.Stream, usage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		kv: req.KVTransferParams, stop: stop,
	})
}

func (a *api) chat(ctx *fasthttp.RequestCtx) {
	if a.dies() {
		return
	}
	var req chatRequest
	stop, ok := a.begin(ctx, &req, &req.generationRequest)
	if !ok {
		return
	}
	prompt, err := chatPrompt(&req)
	if err != nil {
		a.fail(ctx, badRequest("%v", err))
		return
	}
	maxTokens := req.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = req.MaxTokens
	}
	out, e := a.outputLen(len(prompt), maxTokens)
	if e != nil {
		a.fail(ctx, e)
		return
	}
	a.generate(ctx, &generation{
		chat: true, id: a.newID("chatcmpl-"), created: time.Now().Unix(), model: a.cfg.Model,
		prompt: prompt, output: out, stream: req.Stream, usage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		kv: req.KVTransferParams, stop: stop,
	})
}

func (a *api) newID(prefix string) string {
	return fmt.Sprintf("%s%016x%016x", prefix, a.nonce, a.ids.Add(1))
}

// generation is one completion or chat completion being answered.
type generation struct {
	chat          bool
	id            string
	created       int64
	model         string
	prompt        []uint32
	seed          uint64 // OutputSeed(prompt)
	limit         int    // max_tokens, or what the model's length leaves
	output        int    // tokens the engine generates: limit, or fewer when a stop condition ends the request
	stream, usage bool
	stop          *stopSpec // nil: none

	kv     *kvTransferParams // the request's kv_transfer_params; nil: none
	remote bool              // its prompt's KV was read from the prefill worker kv names
	answer *kvTransferParams // a prefill answer's kv_transfer_params, its blocks held
}

func (g *generation) detokenizer() *detokenizer {
	return &detokenizer{stop: g.stop, seed: g.seed, limit: g.limit}
}

// generate submits g to the engine and answers: one JSON body once the request ends, or, with
// stream, Server-Sent Events as its tokens come, after headers sent at once (as Starlette's
// StreamingResponse sends them), so that a client can give up on a request still queued by
// closing its connection. Either way a client that goes away has its request aborted, as
// vLLM's server aborts a request on disconnect: the engine frees its slot and blocks.
//
// With kv_transfer_params (vLLM's NixlConnector): a prefill request (do_remote_decode) keeps
// its blocks pinned when it finishes and answers the parameters to read them with; a decode
// request (do_remote_prefill) first reads its prompt's blocks from the prefill worker (pull),
// then runs with its prompt's KV in place (sim.Request.Remote).
func (a *api) generate(ctx *fasthttp.RequestCtx, g *generation) {
	if f := a.cfg.FailRate; f > 0 && rand.Float64() < f {
		a.fail(ctx, &apiError{fasthttp.StatusInternalServerError, "InternalServerError",
			fmt.Sprintf("kvr-mocker: simulated engine failure (--fail-rate %v)", f)})
		return
	}
	g.seed = OutputSeed(g.prompt)
	g.limit = g.output
	g.output = stopAt(g.stop, g.seed, g.limit)
	hold := g.kv != nil && g.kv.DoRemoteDecode
	pull := g.kv != nil && g.kv.DoRemotePrefill
	if pull {
		if e := a.checkPull(g.prompt, g.kv); e != nil {
			a.fail(ctx, e)
			return
		}
	}
	conn := ctx.Conn()
	if g.stream {
		ctx.SetContentType("text/event-stream; charset=utf-8")
		ctx.Response.ImmediateHeaderFlush = true
		ctx.SetBodyStream(a.newEventStream(g, nil, conn), -1)
		return
	}
	if pull {
		g.remote = a.pull(g.prompt, g.kv)
	}
	r := a.eng.submit(g.prompt, g.output, g.remote, hold)
	poll := time.NewTicker(goneEvery)
	defer poll.Stop()
	gone := false
	for {
		select {
		case <-r.wake:
		case <-poll.C:
			if !gone && peer.Gone(conn) {
				// Wait for the abort to land: a hold request that finished meanwhile
				// still has blocks to free.
				gone = true
				a.log.Debug("client gone: aborting", "id", g.id)
				a.eng.abort(r)
			}
			continue
		}
		n, cached, e, err := r.progress()
		if e == endNone {
			continue
		}
		if gone || (hold && e == endFinished && peer.Gone(conn)) {
			if hold && e == endFinished {
				// Nobody will learn where the blocks are: free them now, as vLLM frees the
				// blocks of a prefill request whose client went away.
				a.eng.release(r)
			}
			return
		}
		if e == endFailed {
			a.fail(ctx, badRequest("%v", err))
			return
		}
		d := g.detokenizer()
		for d.n < n {
			d.add()
		}
		finish := d.finish()
		if e == endAborted {
			finish = "abort"
		}
		if hold && e == endFinished {
			r.mu.Lock()
			blocks := r.held
			r.mu.Unlock()
			a.held.add(g.id, r, blocks)
			g.answer = a.answerParams(g.id, blocks)
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(g.appendBody(nil, d, n, cached, finish))
		return
	}
}

// maxKeptBuffer is the capacity beyond which a stream's buffer is not kept for the next: a long
// answer's text, or many steps' events at a high speedup.
const maxKeptBuffer = 64 << 10

// errClientGone ends a stream whose client was seen gone while its request waited.
var errClientGone = errors.New("mocker: client gone")

// eventStream is a stream's body, vLLM's Server-Sent Events of one request's tokens: one event
// per token (its text empty while a stop string may be forming), those of the steps that
// brought some since the last Read together. Not safe for concurrent use: fasthttp's
// connection goroutine calls Read and Close in turn.
//
// fasthttp reads it once the headers are flushed and writes and flushes one chunk per Read, so
// a step's events cost no hand-off to another goroutine, as a StreamWriter's would (its own
// goroutine and a pipe). Read submits the request first, after the headers as vLLM adds a
// streamed request to its engine, then waits for it, looking at the connection every
// goneEvery. Close, which fasthttp calls when the response ends or fails, aborts a request
// that has not ended: its client went away (a write failed, or it was seen gone).
type eventStream struct {
	a       *api
	g       *generation
	r       *request // nil until the first Read submits g
	conn    net.Conn
	d       detokenizer
	poll    *time.Ticker // kept with s; running from the first wait until Close (ticking)
	buf     []byte       // events not read yet, from off
	off     int
	over    bool // r has ended, its last events in buf, or was aborted
	ticking bool
}

// newEventStream returns the body of a stream of g, whose request is r or, if nil, submitted
// by the first Read. The stream counts as in flight until Close.
func (a *api) newEventStream(g *generation, r *request, conn net.Conn) *eventStream {
	a.inflight.Add(1)
	s := a.streams.Get()
	d := g.detokenizer()
	d.text = s.d.text[:0]
	*s = eventStream{a: a, g: g, r: r, conn: conn, d: *d, poll: s.poll, buf: s.buf[:0]}
	return s
}

// Read returns events not read yet, waiting for the engine when there are none; io.EOF once
// the last has been read, errClientGone if the client was seen gone meanwhile.
func (s *eventStream) Read(p []byte) (int, error) {
	for s.off == len(s.buf) {
		if s.over {
			return 0, io.EOF
		}
		s.buf, s.off = s.buf[:0], 0
		if err := s.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, s.buf[s.off:])
	s.off += n
	return n, nil
}

// next waits for r to progress and appends the events of what it brought to buf: none while
// the engine has nothing new.
func (s *eventStream) next() error {
	a, g := s.a, s.g
	if s.r == nil {
		if g.kv != nil && g.kv.DoRemotePrefill {
			g.remote = a.pull(g.prompt, g.kv)
		}
		s.r = a.eng.submit(g.prompt, g.output, g.remote, false)
	}
	r := s.r
	select {
	case <-r.wake:
	default:
		switch {
		case s.poll == nil:
			s.poll = time.NewTicker(goneEvery)
		case !s.ticking:
			s.poll.Reset(goneEvery)
		}
		s.ticking = true
		select {
		case <-r.wake:
		case <-s.poll.C:
			if peer.Gone(s.conn) {
				a.log.Debug("client gone: aborting", "id", g.id)
				a.eng.abort(r)
				s.over = true
				return errClientGone
			}
			return nil
		}
	}
	n, cached, e, err := r.progress()
	d, buf := &s.d, s.buf
	for d.n < n {
		if g.chat && d.n == 0 {
			buf = g.appendRoleChunk(buf)
		}
		d.add()
		last := d.n == g.output
		finish := ""
		if last {
			finish = d.finish()
		}
		buf = g.appendTokenChunk(buf, d.delta(last), finish, d.reason)
	}
	switch e {
	case endAborted:
		buf = g.appendFinishChunk(buf, d.delta(true), "abort")
	case endFailed:
		buf = append(buf, "data: "...)
		buf = badRequest("%v", err).appendJSON(buf, true)
		buf = append(buf, "\n\n"...)
	}
	if e != endNone {
		if g.usage && e != endFailed {
			buf = g.appendUsageChunk(buf, n, cached)
		}
		buf = append(buf, "data: [DONE]\n\n"...)
		s.over = true
	}
	s.buf = buf
	return nil
}

// Close aborts the request if it has not ended (the stream was cut before its last event) and
// keeps s for another stream: neither s nor what Read returned may be used after.
func (s *eventStream) Close() error {
	if s.ticking {
		s.poll.Stop()
	}
	if s.r != nil && !s.over {
		s.a.log.Debug("client gone: aborting", "id", s.g.id)
		s.a.eng.abort(s.r)
	}
	a, text, buf := s.a, s.d.text[:0], s.buf[:0]
	if cap(text) > maxKeptBuffer {
		text = nil
	}
	if cap(buf) > maxKeptBuffer {
		buf = nil
	}
	*s = eventStream{d: detokenizer{text: text}, poll: s.poll, buf: buf}
	a.streams.Put(s)
	a.inflight.Add(-1)
	return nil
}

// stream writes r's events to w as fasthttp writes a stream's body, without the chunks'
// framing: what each Read returns, then a flush. For tests that read a stream's bytes.
func (a *api) stream(w *bufio.Writer, g *generation, r *request, conn net.Conn) {
	s := a.newEventStream(g, r, conn)
	defer s.Close()
	p := make([]byte, 4096)
	for {
		n, err := s.Read(p)
		if n > 0 {
			if _, werr := w.Write(p[:n]); werr != nil {
				return
			}
			if werr := w.Flush(); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// The chunks and bodies, field for field as vLLM writes them (pydantic's declaration order).

func (g *generation) appendHead(dst []byte, object string) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendJSONString(dst, g.id)
	dst = append(dst, `,"object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, g.created, 10)
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, g.model)
	return append(dst, `,"choices":[`...)
}

func (g *generation) chunkObject() string {
	if g.chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

func (g *generation) appendRoleChunk(dst []byte) []byte {
	dst = append(dst, "data: "...)
	dst = g.appendHead(dst, g.chunkObject())
	return append(dst, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
}

// appendFinish appends finish_reason and, once there is one, stop_reason (reason, JSON; nil:
// null).
func appendFinish(dst []byte, finish string, reason []byte) []byte {
	if finish == "" {
		return append(dst, `,"finish_reason":null`...)
	}
	dst = append(dst, `,"finish_reason":"`...)
	dst = append(dst, finish...)
	dst = append(dst, `","stop_reason":`...)
	if reason == nil {
		return append(dst, "null"...)
	}
	return append(dst, reason...)
}

// appendTokenChunk appends the event of one output token whose text is text; finish (with
// reason) when it is the last.
func (g *generation) appendTokenChunk(dst, text []byte, finish string, reason []byte) []byte {
	dst = append(dst, "data: "...)
	dst = g.appendHead(dst, g.chunkObject())
	if g.chat {
		dst = append(dst, `{"index":0,"delta":{"content":`...)
		dst = appendJSONString(dst, string(text))
		dst = append(dst, `},"logprobs":null`...)
		dst = appendFinish(dst, finish, reason)
	} else {
		dst = append(dst, `{"index":0,"text":`...)
		dst = appendJSONString(dst, string(text))
		dst = append(dst, `,"logprobs":null`...)
		dst = appendFinish(dst, finish, reason)
		if finish == "" {
			dst = append(dst, `,"stop_reason":null`...)
		}
	}
	return append(dst, "}]}\n\n"...)
}

// appendFinishChunk appends an event that only ends the choice (an abort), with the text a
// stream held back, if any.
func (g *generation) appendFinishChunk(dst, text []byte, finish string) []byte {
	dst = append(dst, "data: "...)
	dst = g.appendHead(dst, g.chunkObject())
	switch {
	case !g.chat:
		dst = append(dst, `{"index":0,"text":`...)
		dst = appendJSONString(dst, string(text))
		dst = append(dst, `,"logprobs":null`...)
	case len(text) > 0:
		dst = append(dst, `{"index":0,"delta":{"content":`...)
		dst = appendJSONString(dst, string(text))
		dst = append(dst, `},"logprobs":null`...)
	default:
		dst = append(dst, `{"index":0,"delta":{},"logprobs":null`...)
	}
	dst = appendFinish(dst, finish, nil)
	return append(dst, "}]}\n\n"...)
}

func (g *generation) appendUsageChunk(dst []byte, n, cached int) []byte {
	dst = append(dst, "data: "...)
	dst = g.appendHead(dst, g.chunkObject())
	dst = append(dst, `],"usage":`...)
	dst = g.appendUsage(dst, n, cached)
	return append(dst, "}\n\n"...)
}

func (g *generation) appendUsage(dst []byte, n, cached int) []byte {
	p := len(g.prompt)
	if g.remote {
		// vLLM counts the tokens whose KV arrived as computed before the request ran: all
		// but the last prompt token.
		cached = max(cached, p-1)
	}
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p+n), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(cached), 10)
	return append(dst, "}}"...)
}

// appendBody appends the whole answer of a request not streamed: the text of d, which has
// followed its n output tokens, its choice ended by finish.
func (g *generation) appendBody(dst []byte, d *detokenizer, n, cached int, finish string) []byte {
	text := d.text
	if g.chat {
		dst = g.appendHead(dst, "chat.completion")
		dst = append(dst, `{"index":0,"message":{"role":"assistant","content":`...)
		dst = appendJSONString(dst, string(text))
		dst = append(dst, `},"logprobs":null`...)
	} else {
		dst = g.appendHead(dst, "text_completion")
		dst = append(dst, `{"index":0,"text":`...)
		dst = appendJSONString(dst, string(text))
		dst = append(dst, `,"logprobs":null`...)
	}
	var reason []byte
	if finish == "stop" {
		reason = d.reason
	}
	dst = appendFinish(dst, finish, reason)
	dst = append(dst, `}],"usage":`...)
	dst = g.appendUsage(dst, n, cached)
	if g.answer != nil {
		kv, _ := json.Marshal(g.answer)
		dst = append(dst, `,"kv_transfer_params":`...)
		dst = append(dst, kv...)
	}
	return append(dst, '}')
}

func (a *api) tokenize(ctx *fasthttp.RequestCtx) {
	var req tokenizeRequest
	if !a.read(ctx, &req, &req.Model) {
		return
	}
	var ids []uint32
	var err error
	switch {
	case req.Messages != nil:
		ids, err = chatPrompt(&req)
	case req.Prompt != nil:
		ids, err = parsePrompt(req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	default:
		err = fmt.Errorf("either prompt or messages is required")
	}
	if err != nil {
		a.fail(ctx, badRequest("%v", err))
		return
	}
	if ids == nil {
		ids = []uint32{}
	}
	var strs []string
	if req.ReturnTokenStrs {
		strs = make([]string, len(ids))
		for i, id := range ids {
			strs[i] = TokenText(id)
		}
	}
	a.writeJSON(ctx, struct {
		Count     int      `json:"count"`
		MaxLen    int      `json:"max_model_len"`
		Tokens    []uint32 `json:"tokens"`
		TokenStrs []string `json:"token_strs"`
	}{len(ids), a.maxLen, ids, strs})
}

func (a *api) detokenize(ctx *fasthttp.RequestCtx) {
	var req detokenizeRequest
	if !a.read(ctx, &req, &req.Model) {
		return
	}
	a.writeJSON(ctx, map[string]string{"prompt": Decode(req.Tokens)})
}

func (a *api) models(ctx *fasthttp.RequestCtx) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
		Permission  []any   `json:"permission"`
	}
	a.writeJSON(ctx, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{a.cfg.Model, "model", a.started, "vllm", a.cfg.Model, nil, a.maxLen, []any{}}}})
}

// metrics writes the engine's gauges and counters under vLLM's metric names, for gateways and
// scorers that read them (the inference extension's queue and KV-usage scorers, for instance).
func (a *api) metrics(ctx *fasthttp.RequestCtx) {
	st := a.eng.stats()
	var b []byte
	label := appendJSONString(nil, a.cfg.Model) // a quoted string is a valid label value here
	metric := func(name, typ, help string, v float64) {
		b = fmt.Appendf(b, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=%s} %s\n", name, help, name, typ, name, label,
			strconv.FormatFloat(v, 'g', -1, 64))
	}
	metric("vllm:num_requests_running", "gauge", "Requests running in the engine.", float64(st.Running))
	metric("vllm:num_requests_waiting", "gauge", "Requests waiting to run.", float64(st.Waiting))
	metric("vllm:kv_cache_usage_perc", "gauge", "Fraction of the KV cache in use (1 = 100%).", st.Usage)
	metric("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", float64(st.PromptTokens))
	metric("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", float64(st.CachedTokens))
	metric("vllm:prompt_tokens_total", "counter", "Prompt tokens admitted.", float64(st.PromptTokens))
	metric("vllm:generation_tokens_total", "counter", "Output tokens generated.", float64(st.Generated))
	metric("vllm:request_success_total", "counter", "Requests finished.", float64(st.Completed))
	metric("kvr_mocker_requests_aborted_total", "counter", "Requests aborted (client gone, or shutdown).", float64(st.Aborted))
	metric("kvr_mocker_cached_blocks", "gauge", "KV blocks stored and published.", float64(st.CachedBlocks))
	metric("kvr_mocker_computed_prompt_tokens_total", "counter", "Prompt tokens computed by prefill steps.", float64(st.ComputedTokens))
	metric("kvr_mocker_remote_prompt_tokens_total", "counter", "Prompt tokens whose KV was read from a prefill worker.", float64(st.RemoteTokens))
	metric("kvr_mocker_kv_transfers_held", "gauge", "Finished prefill requests whose blocks wait for a decode worker.", float64(st.Held))
	metric("kvr_mocker_kv_transfers_sent_total", "counter", "Held blocks a decode worker read and released.", float64(st.Sent))
	metric("kvr_mocker_kv_transfers_expired_total", "counter", "Held blocks released unread after --kv-transfer-timeout.", float64(st.Expired))
	metric("kvr_mocker_kv_transfers_received_total", "counter", "Prompts whose KV blocks were read from a prefill worker.", float64(st.Received))
	metric("kvr_mocker_kv_transfer_blocks_total", "counter", "KV blocks read from prefill workers.", float64(st.BlocksIn))
	metric("kvr_mocker_kv_transfer_bytes_total", "counter", "KV bytes read from prefill workers (modelled).", float64(st.BytesIn))
	metric("kvr_mocker_kv_transfer_seconds_total", "counter", "Modelled time of the reads, simulated seconds.", st.TransferTime.Seconds())
	metric("kvr_mocker_kv_transfers_failed_total", "counter", "Reads that failed; the prompt was computed instead.", float64(st.Failed))
	ctx.SetContentType("text/plain; version=0.0.4")
	ctx.SetBody(b)
}

func (a *api) writeJSON(ctx *fasthttp.RequestCtx, v any) {
	b, err := json.Marshal(v)
	if err != nil { // our own values always marshal
		a.fail(ctx, &apiError{fasthttp.StatusInternalServerError, "InternalServerError", err.Error()})
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// appendJSONString appends s as a JSON string: quotes, backslashes and control characters
// escaped, invalid UTF-8 as U+FFFD.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
