package frontdoor

import (
	"strconv"

	"github.com/valyala/fasthttp"
)

// Dynamo's routing headers (lib/llm protocols nvext.rs, apply_header_routing_overrides), with
// the older unprefixed names it still reads.
var (
	headersWorker   = []string{"x-dynamo-worker-instance-id", "x-worker-instance-id"}
	headersDPRank   = []string{"x-dynamo-dp-rank", "x-dp-rank", "x-data-parallel-rank"}
	headerPriority  = "x-dynamo-request-priority"
	headerStrictPri = "x-dynamo-request-strict-priority"
)

// applyHeaders sets h's pinned worker and rank, priority and strict priority from Dynamo's
// routing headers, which win over the body's nvext, as in Dynamo. A value that does not parse
// (as u64, u32, i32 and u32) is ignored, as Dynamo ignores it. x-tenant-id is not read: the
// front door forwards the body as it is, so an engine would not salt its cache with it.
func (h *nvext) applyHeaders(hd *fasthttp.RequestHeader) {
	first := func(names []string) []byte {
		for _, n := range names {
			if v := hd.Peek(n); len(v) > 0 {
				return v
			}
		}
		return nil
	}
	if v, err := strconv.ParseUint(string(first(headersWorker)), 10, 64); err == nil {
		h.BackendInstanceID = &v
	}
	if v, err := strconv.ParseUint(string(first(headersDPRank)), 10, 32); err == nil {
		r := uint32(v)
		h.DPRank = &r
	}
	pri, errP := strconv.ParseInt(string(hd.Peek(headerPriority)), 10, 32)
	strict, errS := strconv.ParseUint(string(hd.Peek(headerStrictPri)), 10, 32)
	if errP != nil && errS != nil {
		return
	}
	if h.AgentHints == nil {
		h.AgentHints = new(agentHints)
	}
	if errP == nil {
		p := int32(pri)
		h.AgentHints.Priority = &p
	}
	if errS == nil {
		s := uint32(strict)
		h.AgentHints.StrictPriority = &s
	}
}
