package mocker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvrouterd/kvrouterd/radix"
)

// kvTransferParams is vLLM's kv_transfer_params, the fields its NixlConnector reads on a request
// and writes on a prefill answer. A client's nulls (vLLM's toy proxy sends the remote fields as
// null on the prefill request) decode to the zero values.
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteBlockIDs  []int32 `json:"remote_block_ids"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteRequestID string  `json:"remote_request_id"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	TPSize          int     `json:"tp_size"`
}

// check refuses what NixlConnector could not act on, naming the field; stream is the request's.
func (p *kvTransferParams) check(stream bool) *apiError {
	switch {
	case p.DoRemoteDecode && p.DoRemotePrefill:
		return badRequest("kv_transfer_params: do_remote_decode and do_remote_prefill are both true")
	case p.DoRemoteDecode && stream:
		return badRequest("kv_transfer_params.do_remote_decode: a prefill request must not stream: its answer carries the transfer's parameters")
	case !p.DoRemotePrefill:
		return nil
	case len(p.RemoteBlockIDs) == 0:
		return badRequest("kv_transfer_params.remote_block_ids: required (non-empty) with do_remote_prefill")
	case p.RemoteEngineID == "":
		return badRequest("kv_transfer_params.remote_engine_id: required with do_remote_prefill")
	case p.RemoteRequestID == "":
		return badRequest("kv_transfer_params.remote_request_id: required with do_remote_prefill")
	case p.RemoteHost == "":
		return badRequest("kv_transfer_params.remote_host: required with do_remote_prefill")
	case p.RemotePort < 1 || p.RemotePort > 65535:
		return badRequest("kv_transfer_params.remote_port: %d is not a port", p.RemotePort)
	}
	return nil
}

// transferCost is the modelled time of reading blocks blocks of blockSize tokens: its bytes
// over the link's bandwidth, plus the fixed latency. Simulated time.
func (c *Config) transferCost(blocks int) (bytes uint64, d time.Duration) {
	bytes = uint64(blocks) * uint64(c.BlockSize) * uint64(c.KVBytesPerToken)
	secs := float64(bytes) * 8 / (c.KVTransferGbps * 1e9)
	return bytes, c.KVTransferLatency + time.Duration(secs*float64(time.Second))
}

// held is the prefill side's table of finished requests whose blocks wait for a decode worker,
// keyed by request id (the remote_request_id of their answers). Safe for concurrent use.
type held struct {
	eng     *engine
	timeout time.Duration // wall time: Config.KVTransferTimeout / Config.Speedup

	mu     sync.Mutex
	byID   map[string]*heldTransfer // REQUIRES mu
	closed bool                     // REQUIRES mu
}

type heldTransfer struct {
	r      *request
	blocks map[int32]struct{} // its block slots, for checking a read
	timer  *time.Timer        // frees it when nobody reads it in time
}

func newHeld(eng *engine, cfg *Config) *held {
	return &held{eng: eng, byID: make(map[string]*heldTransfer),
		timeout: time.Duration(float64(cfg.KVTransferTimeout) / cfg.Speedup)}
}

// add registers r, a finished hold request, under id, with its pinned block slots.
func (h *held) add(id string, r *request, blocks []int32) {
	t := &heldTransfer{r: r, blocks: make(map[int32]struct{}, len(blocks))}
	for _, b := range blocks {
		t.blocks[b] = struct{}{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return // the engine is gone, and the blocks with it
	}
	h.byID[id] = t
	t.timer = time.AfterFunc(h.timeout, func() {
		if h.take(id, t) {
			h.eng.count(func(c *Transfers) { c.Expired++ })
			h.eng.log.Warn("releasing KV blocks no decode worker read in time", "request", id, "timeout", h.timeout)
		}
	})
}

// take removes id's transfer if it is still t (nil: whichever) and releases its blocks.
func (h *held) take(id string, t *heldTransfer) bool {
	h.mu.Lock()
	cur, ok := h.byID[id]
	if !ok || t != nil && cur != t {
		h.mu.Unlock()
		return false
	}
	delete(h.byID, id)
	h.mu.Unlock()
	cur.timer.Stop()
	h.eng.release(cur.r)
	return true
}

// check reports whether id is held and every block of blocks is one of its.
func (h *held) check(id string, blocks []int32) (found, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, found := h.byID[id]
	if !found {
		return false, false
	}
	for _, b := range blocks {
		if _, ok := t.blocks[b]; !ok {
			return true, false
		}
	}
	return true, true
}

// close stops every timer: the engine is closing, and its held blocks go with it.
func (h *held) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for id, t := range h.byID {
		t.timer.Stop()
		delete(h.byID, id)
	}
}

// transferRequest is the body of the mocker's /kv_transfer/read and /kv_transfer/release, the
// stand-ins of NIXL's read of remote blocks and of the notification that frees them.
type transferRequest struct {
	EngineID  string  `json:"remote_engine_id"`
	RequestID string  `json:"remote_request_id"`
	BlockIDs  []int32 `json:"remote_block_ids"` // read only
}

// transferEndpoint serves /kv_transfer/read (the blocks are there and may be read: the reader
// models the read's time itself) and /kv_transfer/release (the reader is done, or gives up:
// free them).
func (a *api) transferEndpoint(ctx *fasthttp.RequestCtx) {
	var req transferRequest
	if err := decodeBody(ctx.PostBody(), &req); err != nil {
		a.fail(ctx, badRequest("%v", err))
		return
	}
	switch {
	case req.EngineID != a.engineID:
		a.fail(ctx, badRequest("remote_engine_id: %q is not this engine (%s)", req.EngineID, a.engineID))
		return
	case req.RequestID == "":
		a.fail(ctx, badRequest("remote_request_id: required"))
		return
	}
	notFound := &apiError{fasthttp.StatusNotFound, "NotFoundError",
		fmt.Sprintf("remote_request_id: no KV blocks held for %q (never prefilled here, already read, or expired)", req.RequestID)}
	if string(ctx.Path()) == "/kv_transfer/release" {
		if !a.held.take(req.RequestID, nil) {
			a.fail(ctx, notFound)
			return
		}
		a.eng.count(func(c *Transfers) { c.Sent++ })
		a.writeJSON(ctx, struct{}{})
		return
	}
	switch found, ok := a.held.check(req.RequestID, req.BlockIDs); {
	case !found:
		a.fail(ctx, notFound)
	case !ok:
		a.fail(ctx, badRequest("remote_block_ids: not all among the blocks held for %q", req.RequestID))
	default:
		a.writeJSON(ctx, struct {
			BlockSize int `json:"block_size"`
			Blocks    int `json:"blocks"`
		}{a.cfg.BlockSize, len(req.BlockIDs)})
	}
}

// checkPull refuses a remote_block_ids that does not fit the prompt: the client's error.
func (a *api) checkPull(prompt []uint32, p *kvTransferParams) *apiError {
	bs := a.cfg.BlockSize
	if want := (len(prompt) + bs - 1) / bs; len(p.RemoteBlockIDs) != want {
		return badRequest("kv_transfer_params.remote_block_ids: %d blocks, but the prompt's %d tokens fill %d blocks of %d",
			len(p.RemoteBlockIDs), len(prompt), want, bs)
	}
	return nil
}

// pull reads the prompt's KV blocks from the prefill worker p names, as vLLM's decode side
// does before scheduling a request with do_remote_prefill: only the blocks past the prompt's
// local cache hit, which are the tail of p's remote_block_ids (the prefill worker held one
// block per block of the prompt). It waits the modelled transfer time, then tells the prefill
// worker to free the blocks. It reports whether the blocks arrived; when they did not (the
// prefill worker unreachable, the transfer unknown or expired, blocks of another size) the
// request computes its prompt here, as vLLM's default kv_load_failure_policy "recompute"
// does. The caller has checked p against the prompt (checkPull).
func (a *api) pull(prompt []uint32, p *kvTransferParams) bool {
	bs := a.cfg.BlockSize
	var hs radix.Hasher
	hashes := hs.AppendSequence(nil, prompt, bs, radix.LoRASeed(""))
	hit := a.eng.cachedPrefix(hashes, (len(prompt)-1)/bs) // as the worker caps a hit: one token is left to compute
	blocks := p.RemoteBlockIDs[hit:]
	base := "http://" + net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort))
	body, _ := json.Marshal(transferRequest{EngineID: p.RemoteEngineID, RequestID: p.RemoteRequestID, BlockIDs: blocks})
	failed := func(step string, err error) bool {
		a.eng.count(func(c *Transfers) { c.Failed++ })
		a.log.Warn("KV transfer failed: computing the prompt here", "step", step, "remote", base,
			"remote_request_id", p.RemoteRequestID, "err", err)
		return false
	}
	status, answer, err := call(context.Background(), http.MethodPost, base+"/kv_transfer/read", body)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("%d %s", status, bytes.TrimSpace(answer))
	}
	if err == nil {
		var read struct {
			BlockSize int `json:"block_size"`
		}
		if err = json.Unmarshal(answer, &read); err == nil && read.BlockSize != bs {
			// Its blocks would not line up with ours (NixlConnector checks the same at its
			// handshake).
			err = fmt.Errorf("the prefill worker's blocks hold %d tokens, ours %d", read.BlockSize, bs)
		}
	}
	if err != nil {
		return failed("read", err)
	}
	n, d := a.cfg.transferCost(len(blocks))
	time.Sleep(time.Duration(float64(d) / a.cfg.Speedup))
	body, _ = json.Marshal(transferRequest{EngineID: p.RemoteEngineID, RequestID: p.RemoteRequestID})
	status, answer, err = call(context.Background(), http.MethodPost, base+"/kv_transfer/release", body)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("%d %s", status, bytes.TrimSpace(answer))
	}
	if err != nil {
		// Freed under the read (expired): what arrived cannot be trusted.
		return failed("release", err)
	}
	a.eng.count(func(c *Transfers) {
		c.Received++
		c.BlocksIn += uint64(len(blocks))
		c.BytesIn += n
		c.TransferTime += d
	})
	a.log.Debug("KV blocks received", "remote_request_id", p.RemoteRequestID, "blocks", len(blocks),
		"local_hit_blocks", hit, "bytes", n, "modelled", d)
	return true
}

// answerParams are the kv_transfer_params of a prefill answer whose blocks are held under id:
// what a decode worker needs to read them (NixlConnector's request_finished).
func (a *api) answerParams(id string, blocks []int32) *kvTransferParams {
	return &kvTransferParams{DoRemotePrefill: true, RemoteBlockIDs: blocks, RemoteEngineID: a.engineID,
		RemoteRequestID: id, RemoteHost: a.xferHost, RemotePort: a.xferPort, TPSize: 1}
}
