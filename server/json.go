package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/kvrouterd/kvrouterd/kvevent"
	"github.com/kvrouterd/kvrouterd/scoring"
	"github.com/kvrouterd/kvrouterd/shard"
	"github.com/kvrouterd/kvrouterd/wire"
)

// jsonError is a JSON body that does not parse or does not fit the schema.
type jsonError struct {
	field  string
	offset int
	msg    string
	// typed: the body is JSON, but a field has the wrong type (Dynamo's endpoints answer 422).
	typed bool
}

func (e *jsonError) Error() string { return e.msg }

// decodeJSON decodes body into v strictly: unknown fields and trailing data are errors, and the
// error names the field and byte offset where it can.
func decodeJSON(body []byte, v any) error {
	return decodeJSONAs(body, v, true)
}

// decodeJSONAs is decodeJSON, with unknown fields errors only if strict.
func decodeJSONAs(body []byte, v any, strict bool) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return &jsonError{field: "body", offset: 0, msg: "empty body: want a JSON object"}
	}
	d := json.NewDecoder(bytes.NewReader(body))
	if strict {
		d.DisallowUnknownFields()
	}
	err := d.Decode(v)
	if err == nil {
		if _, err2 := d.Token(); err2 != io.EOF {
			return &jsonError{field: "body", offset: int(d.InputOffset()), msg: "trailing data after the JSON object"}
		}
		return nil
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return &jsonError{field: "body", offset: int(se.Offset), msg: "malformed JSON: " + se.Error()}
	case errors.As(err, &te) && te.Field == "":
		// The body itself is not an object (a number, an array, a string).
		return &jsonError{field: "body", offset: int(te.Offset), msg: fmt.Sprintf("the body is a JSON %s, not an object", te.Value)}
	case errors.As(err, &te):
		return &jsonError{field: te.Field, offset: int(te.Offset), msg: typeErrorMsg(te), typed: true}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &jsonError{field: "body", offset: len(body), msg: "truncated JSON"}
	}
	msg := err.Error()
	field := "body"
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		field, _ = strconv.Unquote(f)
		msg = "unknown field " + f
	}
	return &jsonError{field: field, offset: int(d.InputOffset()), msg: msg}
}

// decodeLenient decodes body, a JSON object, into v, a pointer to a struct, ignoring fields v
// does not have, as Dynamo's serde structs do. It returns the object's keys that v has no field
// for, and the object's members by key.
func decodeLenient(body []byte, v any) (unknown []string, keys jsonKeys, err error) {
	if err := decodeJSONAs(body, v, false); err != nil {
		return nil, nil, err
	}
	if err := json.Unmarshal(body, &keys); err != nil {
		return nil, nil, &jsonError{field: "body", offset: 0, msg: err.Error()}
	}
	known := jsonFields(reflect.TypeOf(v).Elem())
	for k := range keys {
		if !known[strings.ToLower(k)] {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	return unknown, keys, nil
}

// jsonKeys are the members of a decoded JSON object, by key.
type jsonKeys map[string]json.RawMessage

// has reports whether the object has the member name, matched as encoding/json matches names.
func (k jsonKeys) has(name string) bool {
	_, ok := k.get(name)
	return ok
}

// null reports whether the object has the member name with the value null.
func (k jsonKeys) null(name string) bool {
	v, ok := k.get(name)
	return ok && string(bytes.TrimSpace(v)) == "null"
}

func (k jsonKeys) get(name string) (json.RawMessage, bool) {
	if v, ok := k[name]; ok {
		return v, true
	}
	for key, v := range k {
		if strings.EqualFold(key, name) { // encoding/json matches names so
			return v, true
		}
	}
	return nil, false
}

// jsonFieldsCache maps a struct type to its fields' JSON names, lower-cased.
var jsonFieldsCache sync.Map

// jsonFields returns the JSON names of t's fields, lower-cased, with those of the structs it
// embeds without a name, as encoding/json promotes them.
func jsonFields(t reflect.Type) map[string]bool {
	if m, ok := jsonFieldsCache.Load(t); ok {
		return m.(map[string]bool)
	}
	m := map[string]bool{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct {
			for k := range jsonFields(f.Type) {
				m[k] = true
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[strings.ToLower(name)] = true
	}
	jsonFieldsCache.Store(t, m)
	return m
}

type workerRef struct {
	Worker uint64 `json:"worker_id"`
	Rank   uint32 `json:"dp_rank"`
}

type routeJSON struct {
	RequestID   string     `json:"request_id"`
	Model       string     `json:"model"`
	LoRA        string     `json:"lora_name"`
	TokenIDs    []uint32   `json:"token_ids"`
	BlockHashes []uint64   `json:"block_hashes"`
	ISL         uint32     `json:"isl"`
	Mode        string     `json:"router_mode"`
	Weight      *float64   `json:"overlap_score_weight"`
	Temperature *float64   `json:"router_temperature"`
	Allowed     []uint64   `json:"allowed_workers"`
	Pinned      *workerRef `json:"pinned_worker"`
	// MaxCandidates caps the answer's candidates; 0 = the server's default.
	MaxCandidates uint16 `json:"max_candidates"`

	// Admission: queue order, the longest wait, the expected output, session affinity.
	PriorityJump   float64        `json:"priority_jump"`
	StrictPriority uint32         `json:"strict_priority"`
	MaxWaitMs      uint32         `json:"max_wait_ms"`
	ExpectedOSL    uint32         `json:"expected_output_tokens"`
	SessionID      string         `json:"session_id"`
	Override       *wire.Override `json:"router_config_override"` // wins over the top-level weight and temperature
	// Disagg asks for a disaggregated decision (a prefill and a decode worker).
	Disagg bool `json:"disagg"`
}

func decodeRouteJSON(body []byte, r *wire.RouteRequest) error {
	var j routeJSON
	if err := decodeJSON(body, &j); err != nil {
		return err
	}
	if j.TokenIDs != nil && j.BlockHashes != nil {
		return &jsonError{field: "block_hashes", offset: -1, msg: "give token_ids or block_hashes, not both"}
	}
	*r = wire.RouteRequest{
		RequestID: j.RequestID, Model: j.Model, LoRA: j.LoRA, ISL: j.ISL, Allowed: j.Allowed,
		Tokens: j.TokenIDs, Hashes: j.BlockHashes, ByHash: j.BlockHashes != nil,
		MaxCandidates: j.MaxCandidates,
	}
	if j.Mode != "" {
		m, err := scoring.ParseMode(j.Mode)
		if err != nil {
			return &jsonError{field: "router_mode", offset: -1, msg: err.Error()}
		}
		r.Mode = wire.Mode(m)
	}
	if j.Weight != nil {
		r.HasWeight, r.Weight = true, *j.Weight
	}
	if j.Temperature != nil {
		r.HasTemperature, r.Temperature = true, *j.Temperature
	}
	if j.Pinned != nil {
		r.HasPinned, r.PinnedWorker, r.PinnedRank = true, j.Pinned.Worker, j.Pinned.Rank
	}
	r.PriorityJump, r.StrictPriority, r.MaxWaitMs = j.PriorityJump, j.StrictPriority, j.MaxWaitMs
	r.ExpectedOSL, r.SessionID = j.ExpectedOSL, j.SessionID
	r.Disagg = j.Disagg
	j.Override.Apply(r)
	return nil
}

// appendRouteJSON writes a route or match answer by hand: it is on the request path, and
// reflection would allocate per candidate.
func appendRouteJSON(b []byte, r *wire.RouteResponse) []byte {
	b = append(b, `{"request_id":`...)
	b = strconv.AppendQuote(b, r.RequestID)
	b = append(b, `,"mode":"`...)
	b = append(b, scoring.Mode(r.Mode).String()...)
	b = append(b, `","chosen":`...)
	b = strconv.AppendBool(b, r.Chosen)
	if r.Chosen {
		b = append(b, `,"worker_id":`...)
		b = strconv.AppendUint(b, r.Worker, 10)
		b = append(b, `,"dp_rank":`...)
		b = strconv.AppendUint(b, uint64(r.Rank), 10)
	}
	if r.Prefill {
		b = append(b, `,"prefill":true,"prefill_worker_id":`...)
		b = strconv.AppendUint(b, r.PrefillWorker, 10)
		b = append(b, `,"prefill_dp_rank":`...)
		b = strconv.AppendUint(b, uint64(r.PrefillRank), 10)
	}
	if r.PredictedTTFT > 0 {
		b = append(b, `,"predicted_ttft_ms":`...)
		b = strconv.AppendFloat(b, r.PredictedTTFT, 'f', 1, 64)
	}
	b = append(b, `,"blocks":`...)
	b = strconv.AppendUint(b, uint64(r.Blocks), 10)
	b = append(b, `,"isl":`...)
	b = strconv.AppendUint(b, uint64(r.ISL), 10)
	b = append(b, `,"candidates":[`...)
	for i := range r.Candidates {
		c := &r.Candidates[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"worker_id":`...)
		b = strconv.AppendUint(b, c.Worker, 10)
		b = append(b, `,"dp_rank":`...)
		b = strconv.AppendUint(b, uint64(c.Rank), 10)
		b = append(b, `,"cached_blocks":`...)
		b = strconv.AppendUint(b, uint64(c.CachedBlocks), 10)
		b = append(b, `,"prefill_tokens":`...)
		b = strconv.AppendUint(b, uint64(c.PrefillTokens), 10)
		b = append(b, `,"active_blocks":`...)
		b = strconv.AppendUint(b, uint64(c.ActiveBlocks), 10)
		b = append(b, `,"tree_blocks":`...)
		b = strconv.AppendUint(b, c.TreeBlocks, 10)
		if i < len(r.Tiers) {
			if x := r.Tiers[i]; x != (wire.CandidateTiers{}) {
				// The lower tiers' extensions of cached_blocks, present when any is not 0.
				b = append(b, `,"host_blocks":`...)
				b = strconv.AppendUint(b, uint64(x.Host), 10)
				b = append(b, `,"disk_blocks":`...)
				b = strconv.AppendUint(b, uint64(x.Disk), 10)
				b = append(b, `,"external_blocks":`...)
				b = strconv.AppendUint(b, uint64(x.External), 10)
			}
		}
		b = append(b, `,"logit":`...)
		b = appendFloat(b, c.Logit)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}

func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// appendJSONString appends s as a JSON string. Messages quote what clients sent, which may be
// any bytes: strconv.Quote's \x and \a escapes are not JSON, json.Marshal's are (bytes that are
// not UTF-8 become U+FFFD).
func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// appendError writes {"error": msg, "field": field, "offset": offset}; offset < 0 is left out.
func appendError(b []byte, msg, field string, offset int) []byte {
	b = append(b, `{"error":`...)
	b = appendJSONString(b, msg)
	if field != "" {
		b = append(b, `,"field":`...)
		b = appendJSONString(b, field)
	}
	if offset >= 0 {
		b = append(b, `,"offset":`...)
		b = strconv.AppendInt(b, int64(offset), 10)
	}
	return append(b, "}\n"...)
}

type eventJSON struct {
	Type      string     `json:"type"`
	EventID   uint64     `json:"event_id"`
	Rank      uint32     `json:"dp_rank"`
	Hashes    []uint64   `json:"block_hashes"`
	Parent    *uint64    `json:"parent_hash"`
	Tokens    []uint32   `json:"token_ids"`
	BlockSize int        `json:"block_size"`
	LoRA      string     `json:"lora_name"`
	Salt      string     `json:"cache_salt"`
	Medium    string     `json:"medium"`
	MM        [][]uint64 `json:"mm_hashes"`
}

type eventsJSON struct {
	Worker *uint64     `json:"worker_id"`
	Model  string      `json:"model"`
	Events []eventJSON `json:"events"`
}

func decodeEventsJSON(body []byte, b *wire.EventBatch) error {
	var j eventsJSON
	if err := decodeJSON(body, &j); err != nil {
		return err
	}
	if j.Worker == nil {
		return &jsonError{field: "worker_id", offset: -1, msg: "worker_id is required"}
	}
	b.Worker, b.Model = *j.Worker, j.Model
	b.Events = b.Events[:0]
	for i, e := range j.Events {
		ev := kvevent.Event{ID: e.EventID, Rank: e.Rank, Hashes: e.Hashes, Tokens: e.Tokens, BlockSize: e.BlockSize, LoRA: e.LoRA, Salt: e.Salt, MM: e.MM}
		field := func(f string) string { return "events[" + strconv.Itoa(i) + "]." + f }
		switch e.Type {
		case "stored", "BlockStored":
			ev.Kind = kvevent.Stored
		case "removed", "BlockRemoved":
			ev.Kind = kvevent.Removed
		case "cleared", "AllBlocksCleared":
			ev.Kind = kvevent.Cleared
		default:
			return &jsonError{field: field("type"), offset: -1, msg: fmt.Sprintf("%s: unknown event type %q (want stored, removed or cleared)", field("type"), e.Type)}
		}
		tier, ok := kvevent.ParseMedium(e.Medium)
		if !ok {
			return &jsonError{field: field("medium"), offset: -1, msg: fmt.Sprintf("%s: unknown medium %q", field("medium"), e.Medium)}
		}
		ev.Tier = tier
		if e.Parent != nil {
			if ev.Kind != kvevent.Stored {
				return &jsonError{field: field("parent_hash"), offset: -1, msg: field("parent_hash") + ": only stored events have a parent"}
			}
			ev.Parent, ev.HasParent = *e.Parent, true
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

func appendOutcomesJSON(b []byte, oc []shard.Outcome) []byte {
	applied := 0
	for _, o := range oc {
		if o.Status == shard.OK {
			applied++
		}
	}
	b = append(b, `{"events":`...)
	b = strconv.AppendInt(b, int64(len(oc)), 10)
	b = append(b, `,"ok":`...)
	b = strconv.AppendInt(b, int64(applied), 10)
	b = append(b, `,"outcomes":[`...)
	for i, o := range oc {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"event_id":`...)
		b = strconv.AppendUint(b, o.EventID, 10)
		b = append(b, `,"dp_rank":`...)
		b = strconv.AppendUint(b, uint64(o.Rank), 10)
		b = append(b, `,"status":"`...)
		b = append(b, o.Status.String()...)
		b = append(b, `","applied":`...)
		b = strconv.AppendInt(b, int64(o.Applied), 10)
		b = append(b, `,"skipped":`...)
		b = strconv.AppendInt(b, int64(o.Skipped), 10)
		b = append(b, `,"gap":`...)
		b = strconv.AppendUint(b, o.Gap, 10)
		b = append(b, `,"cleared":`...)
		b = strconv.AppendInt(b, int64(o.Cleared), 10)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}
