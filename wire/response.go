package wire

import (
	"fmt"
	"math"
	"slices"
	"unsafe"
)

// RouteResponse flags (body offset 0).
const (
	respChosen  = 1 << 0
	respPrefill = 1 << 1 // a prefill stage was chosen: the prefill trailer follows the candidates
	respKnown   = respChosen | respPrefill
	// respUnencodable: see reqUnencodable.
	respUnencodable = 1 << 31
)

const (
	responseFixed = 32 // bytes of the body before request_id
	candidateSize = 40 // bytes of one candidate record
	prefillSize   = 16 // bytes of the prefill trailer
)

var responseLayout = [...]field{
	{"flags", 4}, {"mode", 1}, {"reserved", 3}, {"worker", 8}, {"rank", 4},
	{"query_blocks", 4}, {"isl", 4}, {"reserved", 4},
}

var prefillLayout = [...]field{{"prefill_worker", 8}, {"prefill_rank", 4}, {"reserved", 4}}

// candidateNative reports whether Candidate's memory layout is the wire's record layout, so that
// on little-endian machines records move with one memmove.
const candidateNative = unsafe.Sizeof(Candidate{}) == candidateSize &&
	unsafe.Offsetof(Candidate{}.Rank) == 8 &&
	unsafe.Offsetof(Candidate{}.CachedBlocks) == 12 &&
	unsafe.Offsetof(Candidate{}.PrefillTokens) == 16 &&
	unsafe.Offsetof(Candidate{}.ActiveBlocks) == 20 &&
	unsafe.Offsetof(Candidate{}.TreeBlocks) == 24 &&
	unsafe.Offsetof(Candidate{}.Logit) == 32

// Candidate is how one worker scored for a request; a plain value, safe to copy and share. Its
// fields are in wire order and its layout is the wire record's.
type Candidate struct {
	Worker        uint64
	Rank          uint32  // data-parallel rank
	CachedBlocks  uint32  // contiguous prefix of the prompt cached on the worker, in blocks
	PrefillTokens uint32  // tokens the worker would prefill, its active prefill load included
	ActiveBlocks  uint32  // the worker's decode blocks, counting this request
	TreeBlocks    uint64  // all blocks the worker holds
	Logit         float64 // the cost function's value; lower is better
}

// RouteResponse is the router's answer to a RouteRequest; like any plain value it may be read by
// many goroutines at once, but DecodeRouteResponse writes it and needs it to itself.
//
// After DecodeRouteResponse, RequestID aliases the decoded buffer: it is valid only while that
// buffer is unchanged; copy it with strings.Clone to keep it longer.
type RouteResponse struct {
	RequestID string
	Mode      Mode // the mode used, never ModeDefault
	// Chosen: a worker was chosen (a route); clear for a match-only answer, where Worker and
	// Rank must be zero.
	Chosen     bool
	Worker     uint64
	Rank       uint32
	Blocks     uint32 // full blocks of the prompt that were hashed
	ISL        uint32
	Candidates []Candidate
	// Cached is, with Chosen, the chosen worker's cached blocks (with Prefill, the prefill
	// worker's), for the router's caller (its metrics): the format does not carry it, and a
	// decoded answer has 0.
	Cached uint32
	// Prefill: a disaggregated decision chose a prefill stage, on PrefillWorker's rank
	// PrefillRank, and Worker and Rank are the decode stage's. Without it (and Chosen) Worker
	// serves the request whole, and PrefillWorker and PrefillRank must be zero.
	Prefill       bool
	PrefillWorker uint64
	PrefillRank   uint32
	// Tiers, when not empty, holds one entry per candidate (Tiers[i] for Candidates[i]): how
	// far the lower storage tiers extend its CachedBlocks. Empty when no candidate has such an
	// extension. JSON answers carry it; the binary format does not (SPEC.md §4), and a decoded
	// answer has none.
	Tiers []CandidateTiers
	// PredictedTTFT is, with Chosen, the chosen worker's predicted time to first token in ms
	// (scoring.CostTTFT's prediction; 0: none). JSON answers carry it as predicted_ttft_ms;
	// the binary format does not, and a decoded answer has 0.
	PredictedTTFT float64
}

// CandidateTiers is how many blocks the lower storage tiers add to a candidate's cached
// prefix, each tier after the one before: host from CachedBlocks on, disk after the host's,
// external after the disk's. Extensions, not cumulative depths. A plain value.
type CandidateTiers struct {
	Host, Disk, External uint32
}

// Validate reports the first field of r that the format cannot carry as it is, as an *Error
// with Offset -1.
func (r *RouteResponse) Validate() error {
	const m = "route response"
	if err := validStr(m, "request_id", r.RequestID); err != nil {
		return err
	}
	if r.Mode == ModeDefault || r.Mode > ModeMax {
		return invalid(m, "mode", ErrInvalid, fmt.Sprintf("mode %d, want 1 to %d", r.Mode, ModeMax))
	}
	if !r.Chosen && r.Worker != 0 {
		return invalid(m, "worker", ErrInvalid, fmt.Sprintf("Worker is %d but Chosen is false", r.Worker))
	}
	if !r.Chosen && r.Rank != 0 {
		return invalid(m, "rank", ErrInvalid, fmt.Sprintf("Rank is %d but Chosen is false", r.Rank))
	}
	if r.Prefill && !r.Chosen {
		return invalid(m, "prefill", ErrInvalid, "Prefill is set but Chosen is false")
	}
	if !r.Prefill && r.PrefillWorker != 0 {
		return invalid(m, "prefill_worker", ErrInvalid, fmt.Sprintf("PrefillWorker is %d but Prefill is false", r.PrefillWorker))
	}
	if !r.Prefill && r.PrefillRank != 0 {
		return invalid(m, "prefill_rank", ErrInvalid, fmt.Sprintf("PrefillRank is %d but Prefill is false", r.PrefillRank))
	}
	if tooMany(len(r.Candidates)) {
		return invalid(m, "candidates", ErrTooLong, "more than 2^32-1 candidates")
	}
	return nil
}

// AppendRouteResponse appends r as a complete message (header included) to dst and returns the
// extended slice. It grows dst at most once. Like AppendRouteRequest it expects a valid r and
// writes invalid values as they are, for the decoder to reject.
func AppendRouteResponse(dst []byte, r *RouteResponse) []byte {
	dst = appendRouteHead(dst, r, len(r.Candidates))
	if nativeLE && candidateNative {
		cs := r.Candidates
		dst = append(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(cs))), candidateSize*len(cs))...)
	} else {
		dst = appendCandidatesPortable(dst, r.Candidates)
	}
	return appendPrefill(dst, r)
}

// hasPrefillTrailer reports whether r's message carries the prefill trailer: a prefill stage,
// or prefill fields set without one (written for the decoder to reject).
func (r *RouteResponse) hasPrefillTrailer() bool {
	return r.Prefill || r.PrefillWorker != 0 || r.PrefillRank != 0
}

// appendPrefill appends r's prefill trailer, if it has one.
func appendPrefill(dst []byte, r *RouteResponse) []byte {
	if !r.hasPrefillTrailer() {
		return dst
	}
	dst = le.AppendUint64(dst, r.PrefillWorker)
	dst = le.AppendUint32(dst, r.PrefillRank)
	return le.AppendUint32(dst, 0)
}

// AppendRouteResponseRecords appends r as a complete message to dst as AppendRouteResponse does,
// but with n candidate records in place of r.Candidates (which it ignores), left for the caller
// to write with PutCandidate: records is the last n×CandidateSize bytes of msg, whose content
// is undefined until written. It lets an answer be encoded where it will be sent, without a
// slice of Candidates in between.
func AppendRouteResponseRecords(dst []byte, r *RouteResponse, n int) (msg, records []byte) {
	dst = appendRouteHead(dst, r, n)
	at := len(dst)
	dst = dst[:at+candidateSize*n]
	records = dst[at:]
	return appendPrefill(dst, r), records
}

// PutRouteResponseWorker writes worker and rank as the chosen worker of msg, a route response
// message as AppendRouteResponse or AppendRouteResponseRecords wrote it (msg starts at its
// header), for an encoder that chooses the worker while it writes the records. msg must have
// been written with Chosen set.
func PutRouteResponseWorker(msg []byte, worker uint64, rank uint32) {
	b := msg[HeaderSize+8 : HeaderSize+20]
	le.PutUint64(b, worker)
	le.PutUint32(b[8:], rank)
}

// CandidateSize is the bytes of one candidate record.
const CandidateSize = candidateSize

// PutCandidate writes one candidate record into b[:CandidateSize]: the fields of Candidate, in
// its order. It takes them one by one so that a caller making many records needs no Candidate
// in memory between computing and writing them.
func PutCandidate(b []byte, worker uint64, rank, cached, prefill, active uint32, tree uint64, logit float64) {
	b = b[:candidateSize]
	// Five 8-byte stores rather than seven: the pairs of 32-bit fields are adjacent, little
	// endian, so each pair is one word. A 1,000-worker answer writes 40 KB of these.
	le.PutUint64(b, worker)
	le.PutUint64(b[8:], uint64(rank)|uint64(cached)<<32)
	le.PutUint64(b[16:], uint64(prefill)|uint64(active)<<32)
	le.PutUint64(b[24:], tree)
	le.PutUint64(b[32:], math.Float64bits(logit))
}

// appendRouteHead appends r's message up to its candidates, with room for n records in dst's
// capacity.
func appendRouteHead(dst []byte, r *RouteResponse, n int) []byte {
	var flags uint32
	if r.Chosen {
		flags |= respChosen
	}
	if tooMany(n) {
		flags |= respUnencodable
	}
	body := responseFixed + strSize(r.RequestID) + 4 + candidateSize*n
	if r.hasPrefillTrailer() {
		// Prefill fields without Prefill go out without the flag, for the decoder to
		// reject as trailing bytes rather than read another answer.
		if r.Prefill {
			flags |= respPrefill
		}
		body += prefillSize
	}
	dst = slices.Grow(dst, HeaderSize+body)
	dst = appendHeader(dst, TypeRouteResponse, body)
	dst = le.AppendUint32(dst, flags)
	dst = append(dst, byte(r.Mode), 0, 0, 0)
	dst = le.AppendUint64(dst, r.Worker)
	dst = le.AppendUint32(dst, r.Rank)
	dst = le.AppendUint32(dst, r.Blocks)
	dst = le.AppendUint32(dst, r.ISL)
	dst = le.AppendUint32(dst, 0)
	dst = appendStr(dst, r.RequestID)
	return appendCount(dst, n)
}

func appendCandidatesPortable(dst []byte, cs []Candidate) []byte {
	for i := range cs {
		at := len(dst)
		dst = dst[:at+candidateSize]
		c := &cs[i]
		PutCandidate(dst[at:], c.Worker, c.Rank, c.CachedBlocks, c.PrefillTokens, c.ActiveBlocks, c.TreeBlocks, c.Logit)
	}
	return dst
}

// DecodeRouteResponse decodes the message b into r, reusing the backing array of r.Candidates.
// It checks structure only (SPEC.md). On error r holds a partial result.
//
// r.RequestID aliases b (see RouteResponse). Decoding allocates nothing once r.Candidates has
// grown to the size seen.
func DecodeRouteResponse(b []byte, r *RouteResponse) error {
	d := newDecoder(b, "route response")
	if err := d.header(TypeRouteResponse); err != nil {
		return err
	}
	p, err := d.fixed(responseLayout[:], responseFixed)
	if err != nil {
		return err
	}
	base := d.off - responseFixed
	flags := le.Uint32(p[0:])
	if flags&^respKnown != 0 {
		return d.errAt("flags", base, ErrInvalid, "unknown bits %#x", flags&^uint32(respKnown))
	}
	mode := Mode(p[4])
	if mode == ModeDefault || mode > ModeMax {
		return d.errAt("mode", base+4, ErrInvalid, "mode %d, want 1 to %d", mode, ModeMax)
	}
	if err := d.zero("reserved", base+5, p[5:8]); err != nil {
		return err
	}
	chosen := flags&respChosen != 0
	worker, rank := le.Uint64(p[8:]), le.Uint32(p[16:])
	if !chosen && worker != 0 {
		return d.unset("worker", base+8, worker, "flags bit 0")
	}
	if !chosen && rank != 0 {
		return d.unset("rank", base+16, uint64(rank), "flags bit 0")
	}
	blocks, isl := le.Uint32(p[20:]), le.Uint32(p[24:])
	if err := d.zero("reserved", base+28, p[28:32]); err != nil {
		return err
	}
	if r.RequestID, err = d.str("request_id"); err != nil {
		return err
	}
	n, err := d.count("n_candidates", "candidates", candidateSize)
	if err != nil {
		return err
	}
	r.Candidates = slices.Grow(r.Candidates[:0], n)[:n]
	src := d.take(candidateSize * n)
	if nativeLE && candidateNative {
		if n > 0 {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&r.Candidates[0])), len(src)), src)
		}
	} else {
		decodeCandidatesPortable(r.Candidates, src)
	}
	prefill := flags&respPrefill != 0
	var pworker uint64
	var prank uint32
	if prefill {
		if !chosen {
			return d.errAt("flags", base, ErrInvalid, "bit 1 (a prefill stage) without bit 0 (a worker chosen)")
		}
		t, err := d.fixed(prefillLayout[:], prefillSize)
		if err != nil {
			return err
		}
		if err := d.zero("reserved", d.off-4, t[12:16]); err != nil {
			return err
		}
		pworker, prank = le.Uint64(t[0:]), le.Uint32(t[8:])
	}
	if err := d.end(); err != nil {
		return err
	}
	r.Mode, r.Chosen, r.Worker, r.Rank = mode, chosen, worker, rank
	r.Blocks, r.ISL = blocks, isl
	r.Prefill, r.PrefillWorker, r.PrefillRank = prefill, pworker, prank
	return nil
}

func decodeCandidatesPortable(cs []Candidate, src []byte) {
	src = src[:candidateSize*len(cs)]
	for i := range cs {
		p := src[candidateSize*i : candidateSize*(i+1)]
		cs[i] = Candidate{
			Worker:        le.Uint64(p),
			Rank:          le.Uint32(p[8:]),
			CachedBlocks:  le.Uint32(p[12:]),
			PrefillTokens: le.Uint32(p[16:]),
			ActiveBlocks:  le.Uint32(p[20:]),
			TreeBlocks:    le.Uint64(p[24:]),
			Logit:         math.Float64frombits(le.Uint64(p[32:])),
		}
	}
}
