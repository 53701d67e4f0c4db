package server

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// NVIDIA Dynamo's standalone KV indexer API, same paths and JSON shapes, so that tools written
// for it work unchanged. Its errors are {"error": msg}; ours add field and offset.

// modelKey names the index of a (model, tenant): the model name for the default tenant,
// "model@tenant" otherwise.
func modelKey(model, tenant string) string {
	if tenant == "" || tenant == "default" {
		return model
	}
	return model + "@" + tenant
}

// dynamoField renames the field of a router.FieldError as Dynamo's /register body names it.
func dynamoField(err error) error {
	var fe *router.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	name, ok := map[string]string{"model": "model_name", "dp_ranks": "dp_rank"}[fe.Field]
	if !ok {
		return err
	}
	c := *fe
	c.Field = name
	return &c
}

type dynRegister struct {
	Instance  *uint64 `json:"instance_id"`
	Endpoint  string  `json:"endpoint"`
	Model     string  `json:"model_name"`
	BlockSize int     `json:"block_size"`
	Tenant    string  `json:"tenant_id"`
	Rank      uint32  `json:"dp_rank"`
	Replay    string  `json:"replay_endpoint"`
}

type dynUnregister struct {
	Instance *uint64 `json:"instance_id"`
	Model    string  `json:"model_name"`
	Tenant   string  `json:"tenant_id"`
	Rank     *uint32 `json:"dp_rank"`
}

type dynQuery struct {
	Tokens []uint32 `json:"token_ids"`
	Hashes []int64  `json:"block_hashes"`
	Model  string   `json:"model_name"`
	Tenant string   `json:"tenant_id"`
	LoRA   string   `json:"lora_name"`
}

func (s *Server) dynamo(ctx *fasthttp.RequestCtx, path string) {
	want := "POST"
	if path == "/workers" || path == "/dump" {
		want = "GET"
	}
	if !s.method(ctx, epDynamo, ctx.Method(), []byte(want)) {
		return
	}
	switch path {
	case "/register":
		var j dynRegister
		if err := decodeJSON(ctx.PostBody(), &j); err != nil {
			s.fail(ctx, epDynamo, err)
			return
		}
		if j.Instance == nil || j.Model == "" || j.BlockSize <= 0 {
			s.reject(ctx, epDynamo, fasthttp.StatusBadRequest, "invalid", "instance_id", -1, "instance_id, model_name and block_size are required")
			return
		}
		if s.r.HasRank(*j.Instance, j.Rank) {
			s.reject(ctx, epDynamo, fasthttp.StatusConflict, "conflict", "dp_rank", -1,
				"instance "+strconv.FormatUint(*j.Instance, 10)+" dp_rank "+strconv.FormatUint(uint64(j.Rank), 10)+" already registered")
			return
		}
		key := modelKey(j.Model, j.Tenant)
		if len(key) > wire.MaxString && len(j.Model) <= wire.MaxString {
			// Each part fits; the index's name, model_name@tenant_id, does not.
			s.reject(ctx, epDynamo, fasthttp.StatusBadRequest, "too_long", "tenant_id", -1,
				fmt.Sprintf("model_name@tenant_id is %d bytes, at most %d", len(key), wire.MaxString))
			return
		}
		err := s.ch.Register(router.Registration{
			ID: *j.Instance, Model: key, BlockSize: j.BlockSize,
			Ranks: []uint32{j.Rank}, Endpoint: j.Endpoint, Replay: j.Replay,
		})
		if err != nil {
			s.fail(ctx, epDynamo, dynamoField(err))
			return
		}
		ctx.SetStatusCode(fasthttp.StatusCreated)
		s.writeJSON(ctx, map[string]string{"status": "ok"})
	case "/unregister":
		var j dynUnregister
		if err := decodeJSON(ctx.PostBody(), &j); err != nil {
			s.fail(ctx, epDynamo, err)
			return
		}
		if j.Instance == nil {
			s.reject(ctx, epDynamo, fasthttp.StatusBadRequest, "invalid", "instance_id", -1, "instance_id is required")
			return
		}
		// Ranks leave with their instance: kvrouterd removes the whole instance.
		if err := s.ch.Unregister(*j.Instance); err != nil {
			s.fail(ctx, epDynamo, err)
			return
		}
		s.writeJSON(ctx, map[string]string{"status": "ok"})
	case "/workers":
		type entry struct {
			Instance  uint64                  `json:"instance_id"`
			Source    string                  `json:"source"`
			Status    string                  `json:"status"`
			Endpoints map[string]string       `json:"endpoints"`
			Model     string                  `json:"model_name"`
			BlockSize int                     `json:"block_size"`
			Listeners map[string]*dynListener `json:"listeners"`
			// Problems: what is known to be wrong with the worker's configuration (kvrouterd's
			// own field; Dynamo's clients ignore it).
			Problems []string `json:"problems,omitempty"`
		}
		out := []*entry{}
		byID := map[uint64]*entry{}
		for _, w := range s.r.Workers() {
			e := byID[w.ID]
			if e == nil {
				e = &entry{Instance: w.ID, Source: "http", Status: dynActive, Endpoints: map[string]string{}, Model: w.Model, BlockSize: w.BlockSize,
					Listeners: map[string]*dynListener{}, Problems: w.Problems}
				byID[w.ID] = e
				out = append(out, e)
			}
			if w.Endpoint != "" {
				e.Source = "zmq"
			}
			rank := strconv.FormatUint(uint64(w.Rank), 10)
			e.Endpoints[rank] = w.Endpoint
			l := newDynListener(&w)
			e.Listeners[rank] = l
			e.Status = dynWorse(e.Status, l.Status)
		}
		s.writeJSON(ctx, out)
	case "/query", "/query_by_hash":
		s.dynamoQuery(ctx, path == "/query_by_hash")
	case "/dump":
		s.dynamoDump(ctx)
	}
}

func (s *Server) dynamoQuery(ctx *fasthttp.RequestCtx, byHash bool) {
	var j dynQuery
	if err := decodeJSON(ctx.PostBody(), &j); err != nil {
		s.fail(ctx, epDynamo, err)
		return
	}
	key := modelKey(j.Model, j.Tenant)
	bs, ok := s.r.ModelBlockSize(key)
	if !ok {
		tenant := j.Tenant
		if tenant == "" {
			tenant = "default"
		}
		s.reject(ctx, epDynamo, fasthttp.StatusNotFound, "unknown_model", "model_name", -1, "no indexer for model="+j.Model+" tenant="+tenant)
		return
	}
	b := s.bufs.Get()
	defer s.bufs.Put(b)
	b.req = wire.RouteRequest{Model: key, LoRA: j.LoRA, Tokens: j.Tokens, ByHash: byHash}
	if byHash {
		b.req.Hashes = make([]uint64, len(j.Hashes))
		for i, h := range j.Hashes {
			b.req.Hashes[i] = uint64(h)
		}
	}
	scores := map[string]map[string]int64{}
	trees := map[string]map[string]int64{}
	// A prompt shorter than one block matches nothing.
	if (byHash && len(j.Hashes) > 0) || (!byHash && len(j.Tokens) >= bs) {
		if err := s.r.Match(&b.req, &b.resp); err != nil {
			s.fail(ctx, epDynamo, err)
			return
		}
		for _, c := range b.resp.Candidates {
			if c.CachedBlocks == 0 {
				continue
			}
			id, rank := strconv.FormatUint(c.Worker, 10), strconv.FormatUint(uint64(c.Rank), 10)
			if scores[id] == nil {
				scores[id], trees[id] = map[string]int64{}, map[string]int64{}
			}
			scores[id][rank] = int64(c.CachedBlocks) * int64(bs)
			trees[id][rank] = int64(c.TreeBlocks)
		}
	}
	s.writeJSON(ctx, map[string]any{"scores": scores, "frequencies": []int{}, "tree_sizes": trees})
}

// dynamoDump lists, per model, one stored event per (worker, rank) holding its blocks. The
// router keeps no tree and no local hashes: block_hash is the engine's hash and tokens_hash the
// router's sequence hash, sorted by it, so two replicas in the same state dump the same bytes.
func (s *Server) dynamoDump(ctx *fasthttp.RequestCtx) {
	type block struct {
		BlockHash  uint64 `json:"block_hash"`
		TokensHash uint64 `json:"tokens_hash"`
	}
	type stored struct {
		Parent *uint64 `json:"parent_hash"`
		Blocks []block `json:"blocks"`
	}
	type data struct {
		Stored stored `json:"stored"`
	}
	type event struct {
		ID   uint64 `json:"event_id"`
		Data data   `json:"data"`
		Rank uint32 `json:"dp_rank"`
	}
	type routerEvent struct {
		Worker uint64 `json:"worker_id"`
		Tier   string `json:"storage_tier"`
		Event  event  `json:"event"`
	}
	type modelDump struct {
		BlockSize int           `json:"block_size"`
		Events    []routerEvent `json:"events"`
	}
	out := map[string]*modelDump{}
	var blocks []router.DumpedBlock
	for _, m := range s.r.Models() {
		name, tenant, found := strings.Cut(m.Name, "@")
		if !found {
			tenant = "default"
		}
		md := &modelDump{BlockSize: m.BlockSize, Events: []routerEvent{}}
		out[name+":"+tenant] = md
		for _, id := range s.r.ModelWorkers(m.Name) {
			blocks = s.r.DumpWorker(id, blocks[:0])
			for i := 0; i < len(blocks); {
				j := i
				ev := routerEvent{Worker: id, Tier: "device", Event: event{ID: uint64(len(md.Events)), Rank: blocks[i].Rank}}
				for ; j < len(blocks) && blocks[j].Rank == blocks[i].Rank; j++ {
					ev.Event.Data.Stored.Blocks = append(ev.Event.Data.Stored.Blocks, block{blocks[j].Engine, blocks[j].Seq})
				}
				md.Events = append(md.Events, ev)
				i = j
			}
		}
	}
	s.writeJSON(ctx, out)
}
