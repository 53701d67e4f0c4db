package server

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvrouterd/kvrouterd/radix"
	"github.com/kvrouterd/kvrouterd/router"
	"github.com/kvrouterd/kvrouterd/wire"
	"github.com/valyala/fasthttp"
)

// NVIDIA Dynamo's standalone KV indexer API, same paths and JSON shapes, so that tools written
// for it work unchanged. Its errors are {"error": msg}; ours add field and offset.

// partition names the index of a (model, routing group): the model name for the group
// "default" (or none), "model@group" otherwise. Dynamo's legacy tenant_id names no group: it is
// read and ignored, as Dynamo does.
func partition(model, group string) string {
	if group == "" || group == dynDefaultGroup {
		return model
	}
	return model + "@" + group
}

// splitPartition is partition's inverse: the model and the routing group of an index name.
func splitPartition(name string) (model, group string) {
	model, group, ok := strings.Cut(name, "@")
	if !ok {
		group = dynDefaultGroup
	}
	return model, group
}

const dynDefaultGroup = "default"

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

// The request bodies of Dynamo's indexer, field for field (lib/kv-router services/indexer
// server.rs). Fields kvrouterd does not use are declared all the same, so that they are not
// counted as unknown.
type dynRegister struct {
	Instance  *uint64 `json:"instance_id"`
	Endpoint  string  `json:"endpoint"`
	Model     string  `json:"model_name"`
	BlockSize *int    `json:"block_size"`
	Group     string  `json:"routing_group"`
	Tenant    string  `json:"tenant_id"` // legacy: ignored
	Rank      *uint32 `json:"dp_rank"`
	Replay    *string `json:"replay_endpoint"`
	// additional_salt (alias additionalsalt): accepted, not mixed into hashes (as Dynamo).
	Salt      *string `json:"additional_salt"`
	SaltAlias *string `json:"additionalsalt"`
	// HTTP is kvrouterd's own: the worker's OpenAI-compatible API, for the front door, and
	// APIKey the key the front door sends it (never listed).
	HTTP   string `json:"http_endpoint"`
	APIKey string `json:"api_key"`
	// Weight and DeviceType are kvrouterd's own too: the worker's weight for mode
	// device_aware_weighted (router.DeviceWeight).
	Weight     float64 `json:"weight"`
	DeviceType string  `json:"device_type"`
}

type dynUnregister struct {
	Instance *uint64 `json:"instance_id"`
	Model    string  `json:"model_name"`
	Group    *string `json:"routing_group"`
	Tenant   *string `json:"tenant_id"` // legacy: ignored
	Rank     *uint32 `json:"dp_rank"`
}

type dynQuery struct {
	Tokens []uint32 `json:"token_ids"`
	Hashes []int64  `json:"block_hashes"`
	Model  string   `json:"model_name"`
	Group  string   `json:"routing_group"`
	Tenant string   `json:"tenant_id"` // legacy: ignored
	LoRA   *string  `json:"lora_name"`
	Salt   *string  `json:"cache_salt"`
}

// dynamoJSON decodes a Dynamo endpoint's body as Dynamo does: fields it does not know are
// ignored, counted in kvrouterd_dynamo_unknown_fields_total and logged at debug level once per
// name; a body that is not JSON is 400, a required field missing or a field of the wrong type
// 422 (axum's Json rejections). It answers the refusal itself and returns false.
func (s *Server) dynamoJSON(ctx *fasthttp.RequestCtx, path string, v any, required ...string) bool {
	unknown, keys, err := decodeLenient(ctx.PostBody(), v)
	if err != nil {
		var je *jsonError
		if !errors.As(err, &je) {
			s.fail(ctx, epDynamo, err)
			return false
		}
		status := fasthttp.StatusBadRequest
		if je.typed {
			status = fasthttp.StatusUnprocessableEntity
		}
		s.reject(ctx, epDynamo, status, "json", je.field, je.offset, je.msg)
		return false
	}
	s.noteUnknown(path, unknown)
	for _, name := range required {
		if !keys.has(name) || keys.null(name) {
			s.reject(ctx, epDynamo, fasthttp.StatusUnprocessableEntity, "json", name, -1,
				"Failed to deserialize the JSON body into the target type: missing field `"+name+"`")
			return false
		}
	}
	// A string with a default is no Option in Dynamo's structs: null is a type error there.
	for _, name := range dynNotNull[path] {
		if keys.null(name) {
			s.reject(ctx, epDynamo, fasthttp.StatusUnprocessableEntity, "json", name, -1,
				"Failed to deserialize the JSON body into the target type: "+name+": invalid type: null, expected a string")
			return false
		}
	}
	return true
}

// noteUnknown counts the fields of a Dynamo body that kvrouterd ignores, and logs each name
// at debug level once per path.
func (s *Server) noteUnknown(path string, unknown []string) {
	for _, name := range unknown {
		s.m.unknownFields.WithLabelValues(path).Inc()
		name = name[:min(len(name), 64)] // what a client sends bounds nothing kept
		if s.unknownCount.Load() >= maxUnknownLogged {
			continue
		}
		if _, seen := s.unknownSeen.LoadOrStore(path+" "+name, struct{}{}); !seen {
			s.unknownCount.Add(1)
			s.log.Debug("Dynamo endpoint: unknown field ignored", "path", path, "field", name)
		}
	}
}

// dynNotNull are the fields of Dynamo's bodies that may be left out but not be null (serde
// String fields with a default: routing_group and the legacy tenant_id).
var dynNotNull = map[string][]string{
	"/register":      {"routing_group", "tenant_id"},
	"/query":         {"routing_group", "tenant_id"},
	"/query_by_hash": {"routing_group", "tenant_id"},
}

// maxUnknownLogged bounds the distinct unknown field names logged and remembered, whatever
// clients send; the counter has them all.
const maxUnknownLogged = 256

// dynamoError answers Dynamo's {"error": msg} with status, as Dynamo's handlers do for the
// refusals they make themselves.
func (s *Server) dynamoError(ctx *fasthttp.RequestCtx, status int, reason, field, msg string) {
	s.reject(ctx, epDynamo, status, reason, field, -1, msg)
}

func (s *Server) dynamo(ctx *fasthttp.RequestCtx, path string) {
	want := "POST"
	if path == "/workers" || path == "/dump" || path == "/peers" {
		want = "GET"
	}
	if !s.method(ctx, epDynamo, ctx.Method(), []byte(want)) {
		return
	}
	switch path {
	case "/register":
		s.dynamoRegister(ctx)
	case "/unregister":
		s.dynamoUnregister(ctx)
	case "/workers":
		s.dynamoWorkers(ctx)
	case "/query", "/query_by_hash":
		s.dynamoQuery(ctx, path == "/query_by_hash")
	case "/dump":
		s.dynamoDump(ctx)
	case "/register_peer", "/deregister_peer":
		s.dynamoPeer(ctx, path == "/register_peer")
	case "/peers":
		s.dynamoPeers(ctx)
	case "/reopen_logs":
		s.reopenLogs(ctx)
	}
}

// dynamoRegister registers one rank of an instance for (model_name, routing_group), refusing
// what Dynamo refuses with its statuses and messages: a malformed endpoint 400; an instance
// registered for another partition, a rank registered already, or a block size other than the
// partition's 409. A refused registration changes nothing.
func (s *Server) dynamoRegister(ctx *fasthttp.RequestCtx) {
	var j dynRegister
	if !s.dynamoJSON(ctx, "/register", &j, "instance_id", "model_name", "block_size") {
		return
	}
	id, bs, rank := *j.Instance, *j.BlockSize, uint32(0)
	if j.Rank != nil {
		rank = *j.Rank
	}
	replay := ""
	if j.Replay != nil {
		replay = *j.Replay
	}
	if j.Endpoint != "" {
		if err := validZMQEndpoint(j.Endpoint); err != nil {
			s.dynamoError(ctx, fasthttp.StatusBadRequest, "invalid", "endpoint", err.Error())
			return
		}
	}
	if replay != "" {
		if err := validZMQEndpoint(replay); err != nil {
			s.dynamoError(ctx, fasthttp.StatusBadRequest, "invalid", "replay_endpoint", fmt.Sprintf("invalid replay endpoint `%s`: %v", replay, err))
			return
		}
	}
	group := cmp.Or(j.Group, dynDefaultGroup)
	key := partition(j.Model, group)
	if len(key) > wire.MaxString && len(j.Model) <= wire.MaxString {
		// Each part fits; the index's name, model_name@routing_group, does not.
		s.dynamoError(ctx, fasthttp.StatusBadRequest, "too_long", "routing_group",
			fmt.Sprintf("model_name@routing_group is %d bytes, at most %d", len(key), wire.MaxString))
		return
	}
	if m, ok := s.r.WorkerModel(id); ok && m != key {
		om, og := splitPartition(m)
		s.dynamoError(ctx, fasthttp.StatusConflict, "conflict", "instance_id",
			fmt.Sprintf("instance %d is already registered for model=%s routing_group=%s", id, om, og))
		return
	}
	if s.r.HasRank(id, rank) {
		s.dynamoError(ctx, fasthttp.StatusConflict, "conflict", "dp_rank", fmt.Sprintf("instance %d dp_rank %d already registered", id, rank))
		return
	}
	if have, ok := s.r.ModelBlockSize(key); ok && have != bs {
		s.dynamoError(ctx, fasthttp.StatusConflict, "conflict", "block_size",
			fmt.Sprintf("block_size mismatch for model=%s routing_group=%s: existing=%d, requested=%d", j.Model, group, have, bs))
		return
	}
	err := s.ch.Register(router.Registration{
		ID: id, Model: key, BlockSize: bs, Ranks: []uint32{rank}, Endpoint: j.Endpoint, Replay: replay, HTTPEndpoint: j.HTTP, APIKey: j.APIKey,
		Weight: router.DeviceWeight(j.DeviceType, j.Weight), KeepRole: true, // Dynamo's /register has no role
	})
	if err != nil {
		s.fail(ctx, epDynamo, dynamoField(err))
		return
	}
	ctx.SetStatusCode(fasthttp.StatusCreated)
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

// dynamoUnregister removes an instance as Dynamo does: with a routing_group, from that group
// only (with a dp_rank, that rank only, the instance's other ranks staying); without one,
// whatever its group, if its model is model_name (dp_rank is then ignored, as Dynamo ignores
// it). Every refusal is 404.
func (s *Server) dynamoUnregister(ctx *fasthttp.RequestCtx) {
	var j dynUnregister
	if !s.dynamoJSON(ctx, "/unregister", &j, "instance_id", "model_name") {
		return
	}
	id := *j.Instance
	m, ok := s.r.WorkerModel(id)
	if !ok {
		s.dynamoError(ctx, fasthttp.StatusNotFound, "unknown_worker", "instance_id", fmt.Sprintf("instance %d not found", id))
		return
	}
	model, group := splitPartition(m)
	if model != j.Model || j.Group != nil && cmp.Or(*j.Group, dynDefaultGroup) != group {
		s.dynamoError(ctx, fasthttp.StatusNotFound, "unknown_worker", "instance_id",
			fmt.Sprintf("instance %d is registered for model=%s routing_group=%s", id, model, group))
		return
	}
	if j.Group != nil && j.Rank != nil && !s.r.HasRank(id, *j.Rank) {
		s.dynamoError(ctx, fasthttp.StatusNotFound, "unknown_worker", "dp_rank", fmt.Sprintf("instance %d dp_rank %d not found", id, *j.Rank))
		return
	}
	var err error
	if j.Group != nil && j.Rank != nil {
		err = s.ch.UnregisterRank(id, *j.Rank) // that rank alone, as Dynamo does
	} else {
		err = s.ch.Unregister(id)
	}
	if err != nil {
		s.fail(ctx, epDynamo, err)
		return
	}
	s.writeJSON(ctx, map[string]string{"status": "ok"})
}

// dynamoWorkers lists the registered instances in Dynamo's form, filtered by the model_name and
// routing_group query parameters (tenant_id is ignored, as Dynamo ignores it).
func (s *Server) dynamoWorkers(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	wantModel, wantGroup := string(args.Peek("model_name")), string(args.Peek("routing_group"))
	type entry struct {
		Instance  uint64                  `json:"instance_id"`
		Source    string                  `json:"source"`
		Status    string                  `json:"status"`
		Model     string                  `json:"model_name"`
		Group     string                  `json:"routing_group"`
		BlockSize int                     `json:"block_size"`
		Endpoints map[string]string       `json:"endpoints"`
		Listeners map[string]*dynListener `json:"listeners"`
		// Problems: what is known to be wrong with the worker's configuration (kvrouterd's
		// own field; Dynamo's clients ignore it).
		Problems []string `json:"problems,omitempty"`
	}
	out := []*entry{}
	byID := map[uint64]*entry{}
	for _, w := range s.r.Workers() {
		model, group := splitPartition(w.Model)
		if wantModel != "" && model != wantModel || wantGroup != "" && group != wantGroup {
			continue
		}
		e := byID[w.ID]
		if e == nil {
			e = &entry{Instance: w.ID, Source: "http", Endpoints: map[string]string{}, Model: model, Group: group,
				BlockSize: w.BlockSize, Listeners: map[string]*dynListener{}, Problems: w.Problems}
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
}

// dynamoQuery answers /query (token ids, hashed with the partition's block size, the LoRA name
// and the cache salt, as Dynamo hashes them) and /query_by_hash (Dynamo's local block hashes,
// salted already), in Dynamo's form: per instance and rank the matched tokens on the device
// (scores), and per instance its tiers (instances): gpu the device match, cpu that plus the
// host tier's extension, disk that plus the disk and external tiers' extensions, each the
// largest over the instance's ranks (cumulative, as Dynamo's Mooncake-shaped summary).
func (s *Server) dynamoQuery(ctx *fasthttp.RequestCtx, byHash bool) {
	var j dynQuery
	path := "/query"
	required := []string{"token_ids", "model_name"}
	if byHash {
		path, required = "/query_by_hash", []string{"block_hashes", "model_name"}
	}
	if !s.dynamoJSON(ctx, path, &j, required...) {
		return
	}
	if byHash && j.Salt != nil {
		s.dynamoError(ctx, fasthttp.StatusBadRequest, "invalid", "cache_salt",
			"cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt")
		return
	}
	group := cmp.Or(j.Group, dynDefaultGroup)
	key := partition(j.Model, group)
	bs, ok := s.r.ModelBlockSize(key)
	if !ok {
		s.dynamoError(ctx, fasthttp.StatusNotFound, "unknown_model", "model_name", "no indexer for model="+j.Model+" routing_group="+group)
		return
	}
	b := s.bufs.Get()
	defer s.bufs.Put(b)
	// Both are asked as local block hashes, so that the salt needs nothing of the route path.
	// Every worker's overlap, whatever --max-candidates caps native answers to.
	b.req = wire.RouteRequest{Model: key, ByHash: true, Hashes: b.req.Hashes[:0], MaxCandidates: math.MaxUint16}
	if byHash {
		for _, h := range j.Hashes {
			b.req.Hashes = append(b.req.Hashes, uint64(h))
		}
	} else {
		lora, salt := "", ""
		if j.LoRA != nil {
			lora = *j.LoRA
		}
		if j.Salt != nil {
			salt = *j.Salt
		}
		b.req.Hashes = b.h.AppendLocal(b.req.Hashes, j.Tokens, bs, radix.Seed(lora, salt))
	}
	type summary struct {
		Longest int64            `json:"longest_matched"`
		GPU     int64            `json:"gpu"`
		DP      map[string]int64 `json:"dp"`
		CPU     int64            `json:"cpu"`
		Disk    int64            `json:"disk"`
	}
	// frequencies[i]: the worker ranks holding the prompt's block i along its prefix (Dynamo's
	// OverlapScores.frequencies: each matched depth's holders; none past the deepest match).
	frequencies := []int{}
	scores := map[string]map[string]int64{}
	trees := map[string]map[string]int64{} // kvrouterd's addition: each rank's blocks in all
	instances := map[string]*summary{}
	if len(b.req.Hashes) > 0 { // a prompt shorter than one block matches nothing
		if err := s.r.Match(&b.req, &b.resp); err != nil {
			s.fail(ctx, epDynamo, err)
			return
		}
		for i, c := range b.resp.Candidates {
			var x wire.CandidateTiers
			if i < len(b.resp.Tiers) {
				x = b.resp.Tiers[i]
			}
			lower := x.Host + x.Disk + x.External
			if c.CachedBlocks == 0 && lower == 0 {
				continue
			}
			id, rank := strconv.FormatUint(c.Worker, 10), strconv.FormatUint(uint64(c.Rank), 10)
			tokens := int64(c.CachedBlocks) * int64(bs)
			if instances[id] == nil {
				instances[id] = &summary{DP: map[string]int64{}}
			}
			in := instances[id]
			in.DP[rank] = tokens // 0 for a rank with lower-tier hits only
			in.GPU = max(in.GPU, tokens)
			in.CPU = max(in.CPU, int64(c.CachedBlocks+x.Host)*int64(bs))
			in.Disk = max(in.Disk, int64(c.CachedBlocks+lower)*int64(bs))
			in.Longest = max(in.GPU, in.CPU, in.Disk)
			if c.CachedBlocks == 0 {
				continue // scores and frequencies are the device tier's
			}
			if scores[id] == nil {
				scores[id], trees[id] = map[string]int64{}, map[string]int64{}
			}
			scores[id][rank] = tokens
			trees[id][rank] = int64(c.TreeBlocks)
			// Counted at its depth here, summed over the deeper ones below.
			for len(frequencies) < int(c.CachedBlocks) {
				frequencies = append(frequencies, 0)
			}
			frequencies[c.CachedBlocks-1]++
		}
		for i := len(frequencies) - 2; i >= 0; i-- {
			frequencies[i] += frequencies[i+1]
		}
	}
	s.writeJSON(ctx, map[string]any{"scores": scores, "frequencies": frequencies, "instances": instances, "tree_sizes": trees})
}

// validZMQEndpoint checks a ZMQ endpoint as Dynamo's indexer does before it registers one
// (services/common zmq.rs), with its messages: a scheme, an address, and for tcp a host and a
// port that is a 16-bit number; ipc and inproc as they are.
func validZMQEndpoint(e string) error {
	bad := func(why string) error { return fmt.Errorf("invalid ZMQ endpoint `%s`: %s", e, why) }
	scheme, addr, ok := strings.Cut(e, "://")
	switch {
	case !ok:
		return bad("missing scheme")
	case addr == "":
		return bad("missing address")
	case scheme == "ipc" || scheme == "inproc":
		return nil
	case scheme != "tcp":
		return bad("unsupported scheme `" + scheme + "`")
	}
	i := strings.LastIndexByte(addr, ':')
	if i < 0 || i == len(addr)-1 {
		return bad("missing TCP port")
	}
	host, port := addr[:i], addr[i+1:]
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		why := "invalid digit found in string"
		if errors.Is(err, strconv.ErrRange) {
			why = "number too large to fit in target type"
		}
		return bad("invalid TCP port: " + why)
	}
	switch {
	case host == "":
		return bad("missing TCP host")
	case strings.HasPrefix(host, "["):
		if !strings.HasSuffix(host, "]") {
			return bad("missing closing `]`")
		}
	case strings.Contains(host, ":"):
		return bad("missing TCP port")
	}
	return nil
}
