package server

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

type registerJSON struct {
	Worker    *uint64  `json:"worker_id"`
	Model     string   `json:"model"`
	BlockSize int      `json:"block_size"`
	Ranks     []uint32 `json:"dp_ranks"`
	Capacity  int64    `json:"capacity_blocks"`
	MaxTokens int64    `json:"max_batched_tokens"`
	Endpoint  string   `json:"endpoint"`
	Replay    string   `json:"replay_endpoint"`
	// HTTP is the worker's OpenAI-compatible API, where the front door forwards requests.
	HTTP string `json:"http_endpoint"`
	// APIKey is the worker's own API key, sent to HTTP as a bearer token; never listed.
	APIKey string `json:"api_key"`
	// Weight and DeviceType set the worker's weight for mode device_aware_weighted
	// (router.DeviceWeight).
	Weight     float64 `json:"weight"`
	DeviceType string  `json:"device_type"`
	// Role is prefill, decode or both; absent leaves a registered worker's as it was (both
	// for a new worker).
	Role *string `json:"role"`
}

func (s *Server) registerWorker(ctx *fasthttp.RequestCtx) {
	var j registerJSON
	err := decodeJSON(ctx.PostBody(), &j)
	if err != nil {
		s.fail(ctx, epWorkers, err)
		return
	}
	if j.Worker == nil {
		s.reject(ctx, epWorkers, fasthttp.StatusBadRequest, "invalid", "worker_id", -1, "worker_id is required")
		return
	}
	g := router.Registration{
		ID: *j.Worker, Model: j.Model, BlockSize: j.BlockSize, Ranks: j.Ranks,
		Capacity: j.Capacity, MaxTokens: j.MaxTokens, Endpoint: j.Endpoint, Replay: j.Replay, HTTPEndpoint: j.HTTP,
		APIKey: j.APIKey, Weight: router.DeviceWeight(j.DeviceType, j.Weight), KeepRole: j.Role == nil,
	}
	if j.Role != nil {
		if g.Role, err = router.ParseRole(*j.Role); err != nil {
			s.fail(ctx, epWorkers, err)
			return
		}
	}
	err = s.ch.Register(g)
	if err != nil {
		s.fail(ctx, epWorkers, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusCreated)
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

func (s *Server) unregisterWorker(ctx *fasthttp.RequestCtx, idText []byte) {
	id, err := strconv.ParseUint(string(idText), 10, 64)
	if err != nil {
		s.reject(ctx, epWorkers, fasthttp.StatusBadRequest, "invalid", "worker_id", -1, fmt.Sprintf("%q is not a worker id", idText))
		return
	}
	if err := s.ch.Unregister(id); err != nil {
		s.fail(ctx, epWorkers, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

func (s *Server) listWorkers(ctx *fasthttp.RequestCtx) {
	ws := s.r.Workers()
	if ws == nil {
		ws = []router.WorkerInfo{}
	}
	s.writeJSON(ctx, map[string]any{"workers": ws, "models": s.r.Models()})
}

func (s *Server) writeJSON(ctx *fasthttp.RequestCtx, v any) {
	b, err := json.Marshal(v)
	if err != nil { // our own values always marshal
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '\n'))
}

func metricsHandler(reg *prometheus.Registry) fasthttp.RequestHandler {
	return fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}
