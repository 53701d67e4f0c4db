package main

// The front door's share of the soak: a fake OpenAI-compatible engine in the soak's own
// process, which the workers with an http_endpoint name, and clients of the daemon's
// --frontend-addr that stream, wait for whole answers, or give up early.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouterd/kvrouterd/internal/pause"
)

// The engine's answers: engineTokens tokens, the first after engineFirst (headers included), the
// others engineGap apart. engineFirst is over two of the front door's 50 ms polls of its
// clients, so that a client giving up within 20 ms is found gone, and the engine's request
// cancelled, before the answer's first byte (the front door's 499).
// One answer in breakOneIn breaks off after its second token and one in failOneIn answers 500
// before any byte; every sickEvery, from sickFirst on, one worker with an endpoint (in turn)
// answers 500 to everything, /health included, for sickFor: three failures in a row eject it,
// its first probe (after 10 s) fails, its second (20 s later) brings it back.
const (
	engineTokens = 6
	engineFirst  = 120 * time.Millisecond
	engineGap    = 5 * time.Millisecond
	breakOneIn   = 100
	failOneIn    = 100
	sickFirst    = 20 * time.Second
	sickEvery    = 40 * time.Second
	sickFor      = 15 * time.Second
)

// fault is what the engine did to a request, by its X-Request-Id, for the client to tell an
// expected error from an unexpected one.
type fault int8

const (
	faultStatus fault = iota + 1 // answered 500 before any byte
	faultBreak                   // closed the connection mid-stream
)

// engine is a fake vLLM serving every worker with an http_endpoint under a path of its own,
// base/w/{i}, i the worker's index in the fleet. Safe for concurrent use: net/http serves each
// request on a goroutine of its own, and the engine's state is atomic or a sync.Map.
type engine struct {
	base   string
	srv    *http.Server
	sick   atomic.Int64 // the index + 1 of the worker that fails everything; 0 for none
	faults sync.Map     // X-Request-Id → fault; the client takes its own out
	// What it answered, for the report.
	// cancelled: requests whose connection closed before their first byte.
	streams, cancelled, broken, failed, sickFailed, probes, tokenizes atomic.Int64
}

func startEngine() (*engine, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("soak: engine: %w", err)
	}
	e := &engine{base: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /w/{w}/tokenize", e.tokenize)
	mux.HandleFunc("GET /w/{w}/health", e.health)
	mux.HandleFunc("POST /w/{w}/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { e.complete(w, r, true) })
	mux.HandleFunc("POST /w/{w}/v1/completions", func(w http.ResponseWriter, r *http.Request) { e.complete(w, r, false) })
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second}
	go e.srv.Serve(ln)
	return e, nil
}

// endpoint is worker index i's http_endpoint.
func (e *engine) endpoint(i int) string { return e.base + "/w/" + strconv.Itoa(i) }

func (e *engine) close() { e.srv.Close() }

// sicken makes the workers of indexes ill in turn, on the schedule of sickFirst, sickEvery and
// sickFor, until ctx ends.
func (e *engine) sicken(ctx context.Context, indexes []int) {
	if len(indexes) == 0 {
		return
	}
	wait := sickFirst
	for turn := 0; ; turn++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		e.sick.Store(int64(indexes[turn%len(indexes)]) + 1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(sickFor):
		}
		e.sick.Store(0)
		wait = sickEvery - sickFor
	}
}

func (e *engine) isSick(r *http.Request) bool {
	i, err := strconv.Atoi(r.PathValue("w"))
	return err == nil && int64(i)+1 == e.sick.Load()
}

func (e *engine) health(w http.ResponseWriter, r *http.Request) {
	e.probes.Add(1)
	if e.isSick(r) {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// tokenize answers vLLM's /tokenize: one token id per byte of the messages' contents or of the
// prompt.
func (e *engine) tokenize(w http.ResponseWriter, r *http.Request) {
	e.tokenizes.Add(1)
	if e.isSick(r) {
		http.Error(w, `{"error":{"message":"soak: the engine is down","type":"InternalServerError","code":500}}`, http.StatusInternalServerError)
		return
	}
	var in struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
		Prompt string `json:"prompt"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, `{"error":{"message":"soak: not JSON","type":"BadRequestError","code":400}}`, http.StatusBadRequest)
		return
	}
	out := struct {
		Tokens []uint32 `json:"tokens"`
		Count  int      `json:"count"`
		Max    int      `json:"max_model_len"`
	}{Max: 8192}
	add := func(s string) {
		for i := range len(s) {
			out.Tokens = append(out.Tokens, uint32(s[i])+1)
		}
	}
	for _, m := range in.Messages {
		add(m.Content)
	}
	add(in.Prompt)
	out.Count = len(out.Tokens)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// complete answers a chat or text completion as vLLM streams one: engineTokens chunks, the
// last with finish_reason "length", the usage chunk if stream_options.include_usage, and
// [DONE]. The front door always asks to stream.
func (e *engine) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	var in struct {
		Opts struct {
			Usage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil {
		http.Error(w, `{"error":{"message":"soak: not JSON","type":"BadRequestError","code":400}}`, http.StatusBadRequest)
		return
	}
	id := r.Header.Get("X-Request-Id")
	sick := e.isSick(r)
	if sick || rand.IntN(failOneIn) == 0 {
		e.faults.Store(id, faultStatus)
		if sick {
			e.sickFailed.Add(1)
		} else {
			e.failed.Add(1)
		}
		http.Error(w, `{"error":{"message":"soak: engine failure","type":"InternalServerError","code":500}}`, http.StatusInternalServerError)
		return
	}
	breakAt := -1
	if rand.IntN(breakOneIn) == 0 {
		breakAt = 2
	}
	if !pause.For(r.Context(), engineFirst) {
		e.cancelled.Add(1)
		return
	}
	e.streams.Add(1)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	obj, cid := "text_completion", "cmpl-"+id
	if chat {
		obj, cid = "chat.completion.chunk", "chatcmpl-"+id
	}
	var buf []byte
	for i := range engineTokens {
		if i == breakAt {
			e.faults.Store(id, faultBreak)
			e.broken.Add(1)
			panic(http.ErrAbortHandler) // the connection closes without the chunked body's end
		}
		if i > 0 && !pause.For(r.Context(), engineGap) {
			return
		}
		finish := "null"
		if i == engineTokens-1 {
			finish = `"length"`
		}
		buf = fmt.Appendf(buf[:0], `data: {"id":%q,"object":%q,"created":1765000000,"model":"soak","choices":[{"index":0,`, cid, obj)
		if chat {
			buf = fmt.Appendf(buf, `"delta":{"content":"t%d"}`, i)
		} else {
			buf = fmt.Appendf(buf, `"text":"t%d"`, i)
		}
		buf = fmt.Appendf(buf, `,"logprobs":null,"finish_reason":%s}]}`+"\n\n", finish)
		if _, err := w.Write(buf); err != nil {
			return
		}
		fl.Flush()
	}
	if in.Opts.Usage {
		fmt.Fprintf(w, `data: {"id":%q,"object":%q,"created":1765000000,"model":"soak","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n",
			cid, obj, len(body), engineTokens, len(body)+engineTokens)
	}
	io.WriteString(w, "data: [DONE]\n\n")
	fl.Flush()
}

// frontCounts are the front door's answers by outcome. Safe for concurrent use.
type frontCounts struct {
	ok, okStreamed, cut, errs5xx, goneBefore, goneMid, unexpected atomic.Int64
	firstErrs                                                     atomic.Int32
	errLog                                                        func(string)
}

func (n *frontCounts) bad(format string, a ...any) {
	n.unexpected.Add(1)
	if n.firstErrs.Add(1) <= 10 && n.errLog != nil {
		n.errLog("front door: " + fmt.Sprintf(format, a...))
	}
}

func (n *frontCounts) String() string {
	return fmt.Sprintf("%d 2xx (%d streamed), %d streams cut by the engine (2xx, error event), %d 5xx, %d clients gone before the answer, %d gone mid-stream, %d unexpected",
		n.ok.Load(), n.okStreamed.Load(), n.cut.Load(), n.errs5xx.Load(), n.goneBefore.Load(), n.goneMid.Load(), n.unexpected.Load())
}

// frontLoop sends rate / conns requests a second to the front door from one goroutine, each of
// a kind drawn at random: streamed and whole chats and text completions, and clients that give
// up before the answer or after its first event.
type frontLoop struct {
	cfg  Config
	addr string // the front door's
	hc   *http.Client
	eng  *engine
	n    *frontCounts
	seq  *atomic.Uint64
	rng  *rand.Rand
}

// frontDocs and frontQuestions bound the front door's prompts: documents of about 170 bytes
// (ten blocks of one-byte tokens) shared by their questions.
const (
	frontDocs      = 16
	frontQuestions = 8
)

type frontKind int8

const (
	goneBefore frontKind = iota
	goneMid
	chatStreamed
	chatWhole
	textStreamed
	textWhole
)

func (l *frontLoop) run(ctx context.Context) {
	tick := time.NewTicker(time.Duration(float64(l.cfg.FrontConns) * float64(time.Second) / l.cfg.Front))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var kind frontKind
		switch x := l.rng.IntN(100); {
		case x < 5:
			kind = goneBefore
		case x < 10:
			kind = goneMid
		case x < 55:
			kind = chatStreamed
		case x < 85:
			kind = chatWhole
		case x < 93:
			kind = textStreamed
		default:
			kind = textWhole
		}
		l.one(ctx, kind)
	}
}

// one sends one request of kind and counts its outcome.
func (l *frontLoop) one(ctx context.Context, kind frontKind) {
	model := modelName(l.rng.IntN(l.cfg.Models))
	doc := strings.Repeat(fmt.Sprintf("doc %02d ", l.rng.IntN(frontDocs)), 24)
	question := fmt.Sprintf("question %d of the soak?", l.rng.IntN(frontQuestions))
	chat := kind != textStreamed && kind != textWhole
	stream := kind != chatWhole && kind != textWhole
	usage := stream && l.rng.IntN(2) == 0
	var body []byte
	var err error
	if chat {
		body, err = json.Marshal(struct {
			Model    string              `json:"model"`
			Messages []map[string]string `json:"messages"`
			Max      int                 `json:"max_tokens"`
			Stream   bool                `json:"stream"`
		}{model, []map[string]string{{"role": "system", "content": doc}, {"role": "user", "content": question}}, engineTokens, stream})
	} else {
		body, err = json.Marshal(struct {
			Model  string `json:"model"`
			Prompt string `json:"prompt"`
			Max    int    `json:"max_tokens"`
			Stream bool   `json:"stream"`
		}{model, doc + question, engineTokens, stream})
	}
	if err != nil {
		l.n.bad("%v", err)
		return
	}
	if usage {
		body = append(body[:len(body)-1], `,"stream_options":{"include_usage":true}}`...)
	}
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	id := fmt.Sprintf("soak-front-%d", l.seq.Add(1))
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if kind == goneBefore {
		// Within 20 ms, before the engine's first byte.
		t := time.AfterFunc(time.Duration(5+l.rng.IntN(15))*time.Millisecond, cancel)
		defer t.Stop()
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, "http://"+l.addr+path, bytes.NewReader(body))
	if err != nil {
		l.n.bad("%v", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := l.hc.Do(req)
	f, _ := l.eng.faults.LoadAndDelete(id)
	defer l.eng.faults.Delete(id) // an engine call that outlived the client's
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case kind == goneBefore && errors.Is(err, context.Canceled):
			l.n.goneBefore.Add(1)
		default:
			l.n.bad("%s %s: %v", path, id, err)
		}
		return
	}
	defer resp.Body.Close()
	if kind == goneBefore || kind == goneMid {
		if resp.StatusCode == http.StatusOK && kind == goneMid {
			// Read the first event, then close the connection.
			br := bufio.NewReader(resp.Body)
			br.ReadString('\n')
		}
		cancel()
		l.n.goneMid.Add(1)
		return
	}
	switch {
	case resp.StatusCode >= 500:
		io.Copy(io.Discard, resp.Body)
		f2, _ := l.eng.faults.Load(id)
		if f == nil && f2 == nil {
			l.n.bad("%s %s: HTTP %d, and the engine failed nothing of it", path, id, resp.StatusCode)
			return
		}
		l.n.errs5xx.Add(1)
		return
	case resp.StatusCode != http.StatusOK:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		l.n.bad("%s %s: HTTP %d: %s", path, id, resp.StatusCode, b)
		return
	}
	var problem string
	if stream {
		problem = readStream(resp.Body, usage)
	} else {
		problem = readWhole(resp.Body, chat)
	}
	if problem == "" {
		l.n.ok.Add(1)
		if stream {
			l.n.okStreamed.Add(1)
		}
		return
	}
	if ctx.Err() != nil {
		return
	}
	if f2, _ := l.eng.faults.Load(id); stream && (f == faultBreak || f2 == faultBreak) {
		l.n.cut.Add(1)
		return
	}
	l.n.bad("%s %s: %s", path, id, problem)
}

// readStream reads an event stream to its end; it says what is wrong with it, or "" when it
// has the engine's tokens, the usage chunk if asked for (and not otherwise) and [DONE].
func readStream(r io.Reader, usage bool) string {
	sc := bufio.NewScanner(r)
	var chunks int
	var sawUsage, done bool
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		switch {
		case done:
			return "an event after [DONE]"
		case string(data) == "[DONE]":
			done = true
		case bytes.HasPrefix(data, []byte(`{"error"`)):
			return "an error event: " + string(data)
		case bytes.Contains(data, []byte(`"usage":{`)) && bytes.Contains(data, []byte(`"choices":[]`)):
			sawUsage = true
		default:
			chunks++
		}
	}
	switch {
	case sc.Err() != nil:
		return fmt.Sprintf("the stream broke off after %d chunks: %v", chunks, sc.Err())
	case !done:
		return fmt.Sprintf("no [DONE] after %d chunks", chunks)
	case chunks != engineTokens:
		return fmt.Sprintf("%d chunks, want %d", chunks, engineTokens)
	case sawUsage != usage:
		return fmt.Sprintf("usage chunk %v, asked for %v", sawUsage, usage)
	}
	return ""
}

// readWhole reads an answer not streamed; it says what is wrong with it, or "" when it has the
// engine's tokens assembled, its finish reason and the usage.
func readWhole(r io.Reader, chat bool) string {
	var out struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			Finish string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(r).Decode(&out); err != nil {
		return "not JSON: " + err.Error()
	}
	if len(out.Choices) != 1 {
		return fmt.Sprintf("%d choices", len(out.Choices))
	}
	c := out.Choices[0]
	text := c.Text
	if chat {
		text = c.Message.Content
	}
	var want strings.Builder
	for i := range engineTokens {
		fmt.Fprintf(&want, "t%d", i)
	}
	if text != want.String() || c.Finish != "length" || out.Usage.Completion != engineTokens {
		return fmt.Sprintf("text %q, finish_reason %q, %d completion tokens", text, c.Finish, out.Usage.Completion)
	}
	return ""
}
