package wire

import (
	"fmt"
	"math"
	"slices"
)

// RouteRequest flags (body offset 0).
const (
	reqWeight      = 1 << 0
	reqTemperature = 1 << 1
	reqPinned      = 1 << 2
	reqByHash      = 1 << 3
	reqExt         = 1 << 4 // the admission and load-model extension follows the items
	reqKnown       = reqWeight | reqTemperature | reqPinned | reqByHash | reqExt
	// reqUnencodable is set by AppendRouteRequest on a request the format cannot carry
	// faithfully, so that the receiver rejects it (an unknown bit) instead of reading another
	// request. See Validate.
	reqUnencodable = 1 << 31
)

const requestFixed = 40 // bytes of the body before request_id

// The extension's flags (ext_flags).
const (
	extTrackPrefill = 3 << 0 // an Opt: track_prefill_tokens
	extAssumeReuse  = 3 << 2 // an Opt: assume_kv_reuse
	extCredit       = 1 << 4 // overlap_score_credit set
	extLoadScale    = 1 << 5 // prefill_load_scale set
	extDisagg       = 1 << 6 // a disaggregated decision is asked for
	extKnown        = extTrackPrefill | extAssumeReuse | extCredit | extLoadScale | extDisagg
)

const extFixed = 40 // bytes of the extension before session_id

var extLayout = [...]field{
	{"ext_flags", 4}, {"strict_priority", 4}, {"priority_jump", 8}, {"overlap_score_credit", 8},
	{"prefill_load_scale", 8}, {"max_wait_ms", 4}, {"expected_output_tokens", 4},
}

var requestLayout = [...]field{
	{"flags", 4}, {"mode", 1}, {"reserved", 1}, {"max_candidates", 2}, {"overlap_score_weight", 8},
	{"router_temperature", 8}, {"pinned_worker", 8}, {"pinned_rank", 4}, {"isl", 4},
}

// RouteRequest asks the router where to send one prompt; like any plain value it may be read by
// many goroutines at once, but DecodeRouteRequest writes it and needs it to itself.
//
// After DecodeRouteRequest, RequestID, Model and LoRA alias the decoded buffer: they are valid
// only while that buffer is unchanged. A caller that keeps one past the buffer's reuse must copy
// it with strings.Clone.
type RouteRequest struct {
	RequestID string
	Model     string
	LoRA      string // adapter name, "" for the base model
	Mode      Mode

	// Each value below is sent only with its Has flag; without it, the value must be zero.
	HasWeight      bool
	Weight         float64 // overlap_score_weight
	HasTemperature bool
	Temperature    float64 // router_temperature
	HasPinned      bool
	PinnedWorker   uint64
	PinnedRank     uint32

	ISL uint32 // prompt length in tokens; 0 = derive it from the items
	// MaxCandidates caps the candidate records of the answer (the chosen worker first, then the
	// lowest logits); 0 = the server's default.
	MaxCandidates uint16
	Allowed       []uint64 // worker ids the router may choose; empty = all
	ByHash        bool     // the prompt is given as Hashes (local block hashes), else as Tokens
	Tokens        []uint32 // must be empty when ByHash
	Hashes        []uint64 // must be empty unless ByHash

	// Admission and the load model (the binary format's extension, sent when any is set).
	//
	// PriorityJump is how many seconds ahead of its arrival a queued request is ordered (Dynamo's
	// nvext.agent_hints.priority, negative values counting as 0); StrictPriority is compared
	// before any policy score; MaxWaitMs bounds the time in the router's queue (0: the server's
	// default); ExpectedOSL is the expected output length in tokens (0: unknown); SessionID
	// keeps a session on one worker when the server has affinity on.
	PriorityJump   float64
	StrictPriority uint32
	MaxWaitMs      uint32
	ExpectedOSL    uint32
	SessionID      string
	// Dynamo's router_config_override members beyond weight and temperature.
	TrackPrefill     Opt // track_prefill_tokens
	AssumeReuse      Opt // assume_kv_reuse
	HasCredit        bool
	OverlapCredit    float64 // overlap_score_credit
	HasLoadScale     bool
	PrefillLoadScale float64 // prefill_load_scale
	// Disagg asks for a disaggregated decision: a prefill worker and a decode worker when the
	// model has prefill workers (RouteResponse.Prefill), else one worker serving the request
	// whole. A match ignores it.
	Disagg bool
}

// Opt is an optional boolean: unset (the server's setting), false or true.
type Opt uint8

const (
	Unset Opt = iota
	False
	True
)

// OptOf returns False or True.
func OptOf(b bool) Opt {
	if b {
		return True
	}
	return False
}

// Or returns o's value, or def when o is Unset.
func (o Opt) Or(def bool) bool {
	if o == Unset {
		return def
	}
	return o == True
}

// hasExt reports whether r needs the extension.
func (r *RouteRequest) hasExt() bool {
	return math.Float64bits(r.PriorityJump) != 0 || r.StrictPriority != 0 || r.MaxWaitMs != 0 || r.ExpectedOSL != 0 ||
		r.SessionID != "" || r.TrackPrefill != Unset || r.AssumeReuse != Unset || r.HasCredit ||
		r.HasLoadScale || math.Float64bits(r.OverlapCredit) != 0 || math.Float64bits(r.PrefillLoadScale) != 0 ||
		r.Disagg
}

// Validate reports the first field of r that the format cannot carry as it is, as an *Error
// with Offset -1.
func (r *RouteRequest) Validate() error {
	const m = "route request"
	if err := validStr(m, "request_id", r.RequestID); err != nil {
		return err
	}
	if err := validStr(m, "model", r.Model); err != nil {
		return err
	}
	if err := validStr(m, "lora_name", r.LoRA); err != nil {
		return err
	}
	if r.Mode > ModeMax {
		return invalid(m, "mode", ErrInvalid, fmt.Sprintf("mode %d, max %d", r.Mode, ModeMax))
	}
	if !r.HasWeight && math.Float64bits(r.Weight) != 0 {
		return invalid(m, "overlap_score_weight", ErrInvalid, fmt.Sprintf("Weight is %v but HasWeight is false", r.Weight))
	}
	if !r.HasTemperature && math.Float64bits(r.Temperature) != 0 {
		return invalid(m, "router_temperature", ErrInvalid, fmt.Sprintf("Temperature is %v but HasTemperature is false", r.Temperature))
	}
	if !r.HasPinned && r.PinnedWorker != 0 {
		return invalid(m, "pinned_worker", ErrInvalid, fmt.Sprintf("PinnedWorker is %d but HasPinned is false", r.PinnedWorker))
	}
	if !r.HasPinned && r.PinnedRank != 0 {
		return invalid(m, "pinned_rank", ErrInvalid, fmt.Sprintf("PinnedRank is %d but HasPinned is false", r.PinnedRank))
	}
	if err := validStr(m, "session_id", r.SessionID); err != nil {
		return err
	}
	if r.TrackPrefill > True {
		return invalid(m, "track_prefill_tokens", ErrInvalid, fmt.Sprintf("%d is not an Opt", r.TrackPrefill))
	}
	if r.AssumeReuse > True {
		return invalid(m, "assume_kv_reuse", ErrInvalid, fmt.Sprintf("%d is not an Opt", r.AssumeReuse))
	}
	if !r.HasCredit && math.Float64bits(r.OverlapCredit) != 0 {
		return invalid(m, "overlap_score_credit", ErrInvalid, fmt.Sprintf("OverlapCredit is %v but HasCredit is false", r.OverlapCredit))
	}
	if !r.HasLoadScale && math.Float64bits(r.PrefillLoadScale) != 0 {
		return invalid(m, "prefill_load_scale", ErrInvalid, fmt.Sprintf("PrefillLoadScale is %v but HasLoadScale is false", r.PrefillLoadScale))
	}
	if r.ByHash && len(r.Tokens) > 0 {
		return invalid(m, "token_ids", ErrInvalid, fmt.Sprintf("%d tokens in a request by block hashes", len(r.Tokens)))
	}
	if !r.ByHash && len(r.Hashes) > 0 {
		return invalid(m, "block_hashes", ErrInvalid, fmt.Sprintf("%d hashes in a request by token ids", len(r.Hashes)))
	}
	if tooMany(len(r.Allowed)) {
		return invalid(m, "allowed", ErrTooLong, "more than 2^32-1 workers")
	}
	if tooMany(len(r.Tokens)) || tooMany(len(r.Hashes)) {
		return invalid(m, "n_items", ErrTooLong, "more than 2^32-1 items")
	}
	return nil
}

// unencodable reports whether r holds something the format has no place for.
func (r *RouteRequest) unencodable() bool {
	if r.ByHash {
		return len(r.Tokens) > 0 || tooMany(len(r.Hashes)) || tooMany(len(r.Allowed))
	}
	return len(r.Hashes) > 0 || tooMany(len(r.Tokens)) || tooMany(len(r.Allowed))
}

// AppendRouteRequest appends r as a complete message (header included) to dst and returns the
// extended slice. It grows dst at most once.
//
// It expects a valid r (see Validate) and does not check it, but it never turns an invalid r
// into a different valid request: values out of range (a long string, an unknown mode, a weight
// without HasWeight, ...) are written as they are and the decoder rejects them, and lists the
// format has no place for (Hashes in token mode, Tokens in hash mode) set an undefined flag bit
// so that the decoder rejects the message.
func AppendRouteRequest(dst []byte, r *RouteRequest) []byte {
	var flags uint32
	items := 4 * len(r.Tokens)
	if r.ByHash {
		flags |= reqByHash
		items = 8 * len(r.Hashes)
	}
	if r.HasWeight {
		flags |= reqWeight
	}
	if r.HasTemperature {
		flags |= reqTemperature
	}
	if r.HasPinned {
		flags |= reqPinned
	}
	ext := r.hasExt()
	if ext {
		flags |= reqExt
	}
	if r.unencodable() {
		flags |= reqUnencodable
	}
	body := requestFixed + strSize(r.RequestID) + strSize(r.Model) + strSize(r.LoRA) +
		4 + 8*len(r.Allowed) + 4 + items
	if ext {
		body += extFixed + strSize(r.SessionID)
	}
	dst = slices.Grow(dst, HeaderSize+body)
	dst = appendHeader(dst, TypeRouteRequest, body)
	dst = le.AppendUint32(dst, flags)
	dst = append(dst, byte(r.Mode), 0)
	dst = le.AppendUint16(dst, r.MaxCandidates)
	dst = le.AppendUint64(dst, math.Float64bits(r.Weight))
	dst = le.AppendUint64(dst, math.Float64bits(r.Temperature))
	dst = le.AppendUint64(dst, r.PinnedWorker)
	dst = le.AppendUint32(dst, r.PinnedRank)
	dst = le.AppendUint32(dst, r.ISL)
	dst = appendStr(dst, r.RequestID)
	dst = appendStr(dst, r.Model)
	dst = appendStr(dst, r.LoRA)
	dst = appendCount(dst, len(r.Allowed))
	dst = appendHashes(dst, r.Allowed)
	if r.ByHash {
		dst = appendCount(dst, len(r.Hashes))
		dst = appendHashes(dst, r.Hashes)
	} else {
		dst = appendCount(dst, len(r.Tokens))
		dst = appendTokens(dst, r.Tokens)
	}
	if !ext {
		return dst
	}
	// Opts out of range are written as they are (into the neighbouring bits or beyond the known
	// ones), so that the decoder rejects them or reads a different Opt pair only when Validate
	// would have refused r.
	xf := uint32(r.TrackPrefill) | uint32(r.AssumeReuse)<<2
	if r.HasCredit {
		xf |= extCredit
	}
	if r.HasLoadScale {
		xf |= extLoadScale
	}
	if r.Disagg {
		xf |= extDisagg
	}
	if r.TrackPrefill > True || r.AssumeReuse > True {
		xf |= 1 << 31
	}
	dst = le.AppendUint32(dst, xf)
	dst = le.AppendUint32(dst, r.StrictPriority)
	dst = le.AppendUint64(dst, math.Float64bits(r.PriorityJump))
	dst = le.AppendUint64(dst, math.Float64bits(r.OverlapCredit))
	dst = le.AppendUint64(dst, math.Float64bits(r.PrefillLoadScale))
	dst = le.AppendUint32(dst, r.MaxWaitMs)
	dst = le.AppendUint32(dst, r.ExpectedOSL)
	return appendStr(dst, r.SessionID)
}

// DecodeRouteRequest decodes the message b into r, reusing the backing arrays of r.Allowed,
// r.Tokens and r.Hashes. It checks structure only (SPEC.md lists the rules), not meaning: NaN
// weights, a pinned worker outside Allowed and the like are the server's to refuse. On error r
// holds a partial result.
//
// r's strings alias b (see RouteRequest). Decoding allocates nothing once r's slices have
// grown to the sizes seen.
func DecodeRouteRequest(b []byte, r *RouteRequest) error {
	d := newDecoder(b, "route request")
	if err := d.header(TypeRouteRequest); err != nil {
		return err
	}
	p, err := d.fixed(requestLayout[:], requestFixed)
	if err != nil {
		return err
	}
	base := d.off - requestFixed
	flags := le.Uint32(p[0:])
	if flags&^reqKnown != 0 {
		return d.errAt("flags", base, ErrInvalid, "unknown bits %#x", flags&^uint32(reqKnown))
	}
	mode := Mode(p[4])
	if mode > ModeMax {
		return d.errAt("mode", base+4, ErrInvalid, "mode %d, max %d", mode, ModeMax)
	}
	if err := d.zero("reserved", base+5, p[5:6]); err != nil {
		return err
	}
	weight, temp, worker := le.Uint64(p[8:]), le.Uint64(p[16:]), le.Uint64(p[24:])
	rank, isl := le.Uint32(p[32:]), le.Uint32(p[36:])
	if flags&reqWeight == 0 && weight != 0 {
		return d.unset("overlap_score_weight", base+8, weight, "flags bit 0")
	}
	if flags&reqTemperature == 0 && temp != 0 {
		return d.unset("router_temperature", base+16, temp, "flags bit 1")
	}
	if flags&reqPinned == 0 && worker != 0 {
		return d.unset("pinned_worker", base+24, worker, "flags bit 2")
	}
	if flags&reqPinned == 0 && rank != 0 {
		return d.unset("pinned_rank", base+32, uint64(rank), "flags bit 2")
	}
	if r.RequestID, err = d.str("request_id"); err != nil {
		return err
	}
	if r.Model, err = d.str("model"); err != nil {
		return err
	}
	if r.LoRA, err = d.str("lora_name"); err != nil {
		return err
	}
	n, err := d.count("n_allowed", "allowed", 8)
	if err != nil {
		return err
	}
	r.Allowed = appendU64s(r.Allowed[:0], d.take(8*n))
	r.ByHash = flags&reqByHash != 0
	if r.ByHash {
		if n, err = d.count("n_items", "block_hashes", 8); err != nil {
			return err
		}
		r.Hashes = appendU64s(r.Hashes[:0], d.take(8*n))
		r.Tokens = r.Tokens[:0]
	} else {
		if n, err = d.count("n_items", "token_ids", 4); err != nil {
			return err
		}
		r.Tokens = appendU32s(r.Tokens[:0], d.take(4*n))
		r.Hashes = r.Hashes[:0]
	}
	if flags&reqExt != 0 {
		if err := decodeExt(&d, r); err != nil {
			return err
		}
	} else {
		r.clearExt()
	}
	if err := d.end(); err != nil {
		return err
	}
	r.Mode = mode
	r.HasWeight, r.Weight = flags&reqWeight != 0, math.Float64frombits(weight)
	r.HasTemperature, r.Temperature = flags&reqTemperature != 0, math.Float64frombits(temp)
	r.HasPinned, r.PinnedWorker, r.PinnedRank = flags&reqPinned != 0, worker, rank
	r.ISL = isl
	r.MaxCandidates = le.Uint16(p[6:])
	return nil
}

// decodeExt reads the admission and load-model extension into r.
func decodeExt(d *decoder, r *RouteRequest) error {
	p, err := d.fixed(extLayout[:], extFixed)
	if err != nil {
		return err
	}
	base := d.off - extFixed
	xf := le.Uint32(p[0:])
	if xf&^extKnown != 0 {
		return d.errAt("ext_flags", base, ErrInvalid, "unknown bits %#x", xf&^uint32(extKnown))
	}
	tp, ar := Opt(xf&3), Opt(xf>>2&3)
	if tp > True {
		return d.errAt("ext_flags", base, ErrInvalid, "track_prefill_tokens %d, want 0 unset, 1 false or 2 true", tp)
	}
	if ar > True {
		return d.errAt("ext_flags", base, ErrInvalid, "assume_kv_reuse %d, want 0 unset, 1 false or 2 true", ar)
	}
	credit, scale := le.Uint64(p[16:]), le.Uint64(p[24:])
	if xf&extCredit == 0 && credit != 0 {
		return d.unset("overlap_score_credit", base+16, credit, "ext_flags bit 4")
	}
	if xf&extLoadScale == 0 && scale != 0 {
		return d.unset("prefill_load_scale", base+24, scale, "ext_flags bit 5")
	}
	if r.SessionID, err = d.str("session_id"); err != nil {
		return err
	}
	r.TrackPrefill, r.AssumeReuse = tp, ar
	r.StrictPriority = le.Uint32(p[4:])
	r.PriorityJump = math.Float64frombits(le.Uint64(p[8:]))
	r.HasCredit, r.OverlapCredit = xf&extCredit != 0, math.Float64frombits(credit)
	r.HasLoadScale, r.PrefillLoadScale = xf&extLoadScale != 0, math.Float64frombits(scale)
	r.MaxWaitMs, r.ExpectedOSL = le.Uint32(p[32:]), le.Uint32(p[36:])
	r.Disagg = xf&extDisagg != 0
	if !r.hasExt() { // a writer sets bit 4 only for an extension with something in it
		return d.errAt("ext_flags", base, ErrInvalid, "an extension that holds nothing: its writer must clear flags bit 4")
	}
	return nil
}

// clearExt zeroes the extension's fields.
func (r *RouteRequest) clearExt() {
	r.PriorityJump, r.StrictPriority, r.MaxWaitMs, r.ExpectedOSL, r.SessionID = 0, 0, 0, 0, ""
	r.TrackPrefill, r.AssumeReuse = Unset, Unset
	r.HasCredit, r.OverlapCredit, r.HasLoadScale, r.PrefillLoadScale = false, 0, false, 0
	r.Disagg = false
}

func validStr(msg, field, s string) error {
	if len(s) > MaxString {
		return invalid(msg, field, ErrTooLong, fmt.Sprintf("%d bytes, max %d", len(s), MaxString))
	}
	return nil
}
