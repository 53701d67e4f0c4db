package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Request is one request of a workload: arrival time, prompt, output length. Plain data, safe
// to read from any number of goroutines; Tokens may share its array with other requests and must
// not be written.
type Request struct {
	At      time.Duration // arrival, from the trace's start
	Tokens  []uint32      // the prompt's token ids
	Output  int           // tokens to generate
	Session uint64        // conversation/session id when known, else 0
}

// MooncakeBlock is the number of tokens one Mooncake hash id stands for.
const MooncakeBlock = 512

// DefaultVocab is the token id range used when an option leaves Vocab zero (Llama 3 has 128,256
// ids; the exact value does not matter to a router, only that ids are spread).
const DefaultVocab = 128000

// ErrRow is wrapped by every error about the content of a trace row.
var ErrRow = errors.New("trace: bad row")

// RowError says which line of a trace and which field of its row was wrong. It is plain data.
// errors.Is(err, ErrRow) holds for it.
type RowError struct {
	Line  int    // 1-based line number in the input
	Field string // JSON field name, empty when the line as a whole is wrong
	Err   error
}

func (e *RowError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("trace: line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("trace: line %d: field %s: %v", e.Line, e.Field, e.Err)
}

func (e *RowError) Unwrap() []error { return []error{ErrRow, e.Err} }

// MooncakeOptions controls how a trace becomes a workload. The zero value is valid: arrival
// times as recorded in milliseconds, every row, 512-token hash ids unless the trace says
// otherwise, DefaultVocab, seed 0.
type MooncakeOptions struct {
	TimeScale float64 // multiplies arrival times (2 = half the load); 0 → 1
	Limit     int     // first N rows, 0 = all
	Vocab     uint32  // token ids are in [0, Vocab); 0 → DefaultVocab
	Seed      uint64  // varies the tokens of every hash id; equal ids stay equal under one seed
	// BlockSize is the number of tokens one hash id stands for; 0 → the trace's own
	// block_size (a row's field, or a header line's), else MooncakeBlock.
	BlockSize int
	// TimeUnit is the unit of numeric timestamps: time.Millisecond (Mooncake's; 0 → it) or
	// time.Second (Alibaba's Qwen traces, BurstGPT); a header line's "time_unit" ("ms" or "s")
	// sets it when the option does not. ISO-8601 strings need none.
	TimeUnit time.Duration
}

// ParseTimeUnit reads a --time-unit flag: "ms", "s", or "" (0: the trace's own, else ms).
func ParseTimeUnit(s string) (time.Duration, error) {
	switch s {
	case "":
		return 0, nil
	case "ms":
		return time.Millisecond, nil
	case "s":
		return time.Second, nil
	}
	return 0, fmt.Errorf("trace: time unit %q: want ms or s", s)
}

func (o MooncakeOptions) vocab() uint64 {
	if o.Vocab == 0 {
		return DefaultVocab
	}
	return uint64(o.Vocab)
}

func (o MooncakeOptions) blockSize() int {
	if o.BlockSize <= 0 {
		return MooncakeBlock
	}
	return o.BlockSize
}

// MooncakeRow is one row of a trace before tokens are made: plain data.
type MooncakeRow struct {
	Line         int           // 1-based line number in the input
	At           time.Duration // timestamp × TimeScale
	InputLength  int
	OutputLength int
	HashIDs      []uint64 // ceil(InputLength / BlockSize) ids; nil when the row gives Tokens
	BlockSize    int      // tokens per hash id
	Tokens       []uint32 // the prompt's token ids, when the row gives them instead of hash ids
	Session      uint64   // the row's session (conversation) id, 0 when it has none
}

// LoadMooncake reads a JSON-lines trace in Mooncake's form ({"timestamp": ms, "input_length",
// "output_length", "hash_ids": [...]}) or one of its relatives (see ReadMooncakeRows): each hash
// id stands for one block (512 tokens unless the trace or opt says otherwise) identifying its
// whole prefix. Tokens: each hash id gets a block of deterministic pseudo-random token ids
// derived from the id and opt.Seed, concatenated and truncated to input_length, so equal ids
// give equal token prefixes; a row that gives its token ids keeps them. Rows come back sorted by
// arrival (stable, so equal timestamps keep file order). Errors name the line and field
// (*RowError).
func LoadMooncake(path string, opt MooncakeOptions) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := ReadMooncake(f, opt)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// ReadMooncake is LoadMooncake from an io.Reader. All prompts share one pointer-free array.
func ReadMooncake(r io.Reader, opt MooncakeOptions) ([]Request, error) {
	rows, err := ReadMooncakeRows(r, opt)
	if err != nil {
		return nil, err
	}
	total := 0
	for i := range rows {
		total += rows[i].InputLength
	}
	buf := make([]uint32, 0, total)
	reqs := make([]Request, len(rows))
	for i := range rows {
		row := &rows[i]
		start := len(buf)
		if row.Tokens != nil {
			buf = append(buf, row.Tokens...)
		} else {
			buf = opt.appendBlocks(buf, row.HashIDs, row.InputLength, row.BlockSize)
		}
		reqs[i] = Request{At: row.At, Tokens: buf[start:len(buf):len(buf)], Output: row.OutputLength, Session: row.Session}
	}
	return reqs, nil
}

// rowJSON is a row as decoded, under every name the accepted forms give a field; pointers tell
// a missing field from a zero one.
type rowJSON struct {
	Timestamp    json.RawMessage `json:"timestamp"`
	Time         json.RawMessage `json:"time"`
	ArrivalTime  json.RawMessage `json:"arrival_time"`
	InputLength  *int            `json:"input_length"`
	OutputLength *int            `json:"output_length"`
	HashIDs      *[]uint64       `json:"hash_ids"`
	TokenIDs     *[]uint32       `json:"token_ids"`
	InputIDs     *[]uint32       `json:"input_ids"`
	PromptIDs    *[]uint32       `json:"prompt_token_ids"`
	BlockSize    *int            `json:"block_size"`
	TimeUnit     *string         `json:"time_unit"`
	SessionID    json.RawMessage `json:"session_id"`
	Conversation json.RawMessage `json:"conversation_id"`
	ChatID       json.RawMessage `json:"chat_id"`
	ParentChatID json.RawMessage `json:"parent_chat_id"`
}

// A trace's timestamps are all numbers or all ISO-8601 strings.
const (
	stampNone = iota
	stampNumber
	stampString
)

// rowsReader is the state of one ReadMooncakeRows.
type rowsReader struct {
	opt       MooncakeOptions
	scale     float64
	blockSize int           // the trace's header's, until a row says otherwise
	unit      time.Duration // of numeric timestamps
	stamps    int           // stampNumber or stampString, once a row has one
	raw       []float64     // each row's timestamp in its unit (strings: ns since ref)
	ref       time.Time     // the first string timestamp
	chatRoot  map[uint64]uint64
}

// ReadMooncakeRows reads a trace without making tokens, for callers that make each prompt on
// demand with AppendTokens. Blank lines are skipped; unknown fields are ignored. Accepted, beside
// Mooncake's own rows:
//   - a timestamp named "timestamp", "time" or "arrival_time": a number in opt.TimeUnit (ms
//     unless a header says "time_unit": "s") or an ISO-8601 string (RFC 3339, or without the
//     zone, read as UTC); a trace whose first arrival is over a day from 0 (epoch times) is
//     moved to start at 0;
//   - the prompt as token ids ("token_ids", "input_ids" or "prompt_token_ids") instead of hash
//     ids, input_length then optional;
//   - "block_size", the tokens per hash id, on a row or on a header line (a line with no
//     timestamp), which may also give "time_unit";
//   - a session: "session_id", "conversation_id", or "chat_id" with "parent_chat_id" (each turn
//     takes its first turn's id), numbers or strings.
func ReadMooncakeRows(r io.Reader, opt MooncakeOptions) ([]MooncakeRow, error) {
	rr, err := newRowsReader(opt)
	if err != nil {
		return nil, err
	}
	sc := newLineScanner(r)
	var rows []MooncakeRow
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if opt.Limit > 0 && len(rows) == opt.Limit {
			break
		}
		row, raw, ok, err := rr.parse(b, line)
		if err != nil {
			return nil, err
		}
		if ok {
			rows = append(rows, row)
			rr.raw = append(rr.raw, raw)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace: after line %d: %w", line, err)
	}
	if err := rr.times(rows); err != nil {
		return nil, err
	}
	if !slices.IsSortedFunc(rows, cmpRowAt) {
		slices.SortStableFunc(rows, cmpRowAt)
	}
	return rows, nil
}

// newRowsReader checks opt.
func newRowsReader(opt MooncakeOptions) (*rowsReader, error) {
	rr := &rowsReader{opt: opt, scale: opt.TimeScale, blockSize: opt.blockSize(), unit: opt.TimeUnit}
	if rr.scale == 0 {
		rr.scale = 1
	}
	if !(rr.scale > 0) || math.IsInf(rr.scale, 0) {
		return nil, fmt.Errorf("trace: TimeScale %v: want a positive finite number", opt.TimeScale)
	}
	if rr.unit != 0 && rr.unit != time.Millisecond && rr.unit != time.Second {
		return nil, fmt.Errorf("trace: TimeUnit %v: want 1ms or 1s", opt.TimeUnit)
	}
	return rr, nil
}

// newLineScanner reads a trace's lines, of up to 64 MiB each.
func newLineScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	return sc
}

func cmpRowAt(a, b MooncakeRow) int {
	switch {
	case a.At < b.At:
		return -1
	case a.At > b.At:
		return 1
	}
	return 0
}

// parse reads one line: a row (true), or a header line that sets the block size or the time
// unit (false).
func (rr *rowsReader) parse(b []byte, line int) (row MooncakeRow, raw float64, ok bool, err error) {
	bad := func(field, format string, args ...any) error {
		return &RowError{Line: line, Field: field, Err: fmt.Errorf(format, args...)}
	}
	var j rowJSON
	if err := json.Unmarshal(b, &j); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return MooncakeRow{}, 0, false, bad("", "byte %d: %v", syn.Offset, err)
		case errors.As(err, &typ):
			field := typ.Field
			if field == "" {
				return MooncakeRow{}, 0, false, bad("", "%s is not a JSON object", typ.Value)
			}
			// Field is "hash_ids" for an element of the array too.
			return MooncakeRow{}, 0, false, bad(strings.SplitN(field, ".", 2)[0], "%s does not fit %v", typ.Value, typ.Type)
		}
		return MooncakeRow{}, 0, false, bad("", "%v", err)
	}
	stampField, stamp := "timestamp", j.Timestamp
	if stamp == nil && j.Time != nil {
		stampField, stamp = "time", j.Time
	}
	if stamp == nil && j.ArrivalTime != nil {
		stampField, stamp = "arrival_time", j.ArrivalTime
	}
	if j.TimeUnit != nil && rr.opt.TimeUnit == 0 {
		switch *j.TimeUnit {
		case "ms":
			rr.unit = time.Millisecond
		case "s":
			rr.unit = time.Second
		default:
			return MooncakeRow{}, 0, false, bad("time_unit", "%q: want \"ms\" or \"s\"", *j.TimeUnit)
		}
	}
	bs := rr.blockSize
	if j.BlockSize != nil {
		if *j.BlockSize < 1 || *j.BlockSize > 1<<20 {
			return MooncakeRow{}, 0, false, bad("block_size", "%d: want 1 to 1048576", *j.BlockSize)
		}
		if rr.opt.BlockSize == 0 {
			bs = *j.BlockSize
		}
	}
	toks := j.TokenIDs
	if toks == nil {
		toks = j.InputIDs
	}
	if toks == nil {
		toks = j.PromptIDs
	}
	if stamp == nil && j.InputLength == nil && j.HashIDs == nil && toks == nil {
		if j.BlockSize != nil || j.TimeUnit != nil {
			rr.blockSize = bs // a header line
			return MooncakeRow{}, 0, false, nil
		}
		return MooncakeRow{}, 0, false, bad("timestamp", "missing")
	}
	switch {
	case stamp == nil:
		return MooncakeRow{}, 0, false, bad("timestamp", "missing")
	case j.InputLength == nil && toks == nil:
		return MooncakeRow{}, 0, false, bad("input_length", "missing")
	case j.OutputLength == nil:
		return MooncakeRow{}, 0, false, bad("output_length", "missing")
	case j.HashIDs == nil && toks == nil:
		return MooncakeRow{}, 0, false, bad("hash_ids", "missing (or token_ids)")
	}
	v, err := rr.stamp(stamp)
	if err != nil {
		return MooncakeRow{}, 0, false, bad(stampField, "%v", err)
	}
	row = MooncakeRow{Line: line, OutputLength: *j.OutputLength, BlockSize: bs}
	if row.OutputLength < 0 {
		return MooncakeRow{}, 0, false, bad("output_length", "%d is negative", row.OutputLength)
	}
	if toks != nil {
		row.Tokens, row.InputLength = *toks, len(*toks)
		if row.Tokens == nil {
			row.Tokens = []uint32{}
		}
		if j.InputLength != nil && *j.InputLength != row.InputLength {
			return MooncakeRow{}, 0, false, bad("input_length", "%d, but the row gives %d token ids", *j.InputLength, row.InputLength)
		}
	} else {
		in, ids := *j.InputLength, *j.HashIDs
		if in < 0 {
			return MooncakeRow{}, 0, false, bad("input_length", "%d is negative", in)
		}
		if want := (in + bs - 1) / bs; len(ids) != want {
			return MooncakeRow{}, 0, false, bad("hash_ids", "%d ids for input_length %d, want %d (one per %d tokens; --block-size or the trace's block_size sets it)", len(ids), in, want, bs)
		}
		row.InputLength, row.HashIDs = in, ids
	}
	if row.Session, err = rr.session(&j); err != nil {
		return MooncakeRow{}, 0, false, bad("session_id", "%v", err)
	}
	return row, v, true, nil
}

// stamp reads a timestamp: a number (in the trace's unit, known only at the end) or an
// ISO-8601 string (ns since the trace's first, exact in a float64 for 104 days).
func (rr *rowsReader) stamp(raw json.RawMessage) (float64, error) {
	kind := stampNumber
	if len(raw) > 0 && raw[0] == '"' {
		kind = stampString
	}
	if rr.stamps != stampNone && rr.stamps != kind {
		return 0, errors.New("mixes numbers and strings: want one form for the whole trace")
	}
	rr.stamps = kind
	if kind == stampNumber {
		var v float64
		if err := json.Unmarshal(raw, &v); err != nil {
			return 0, fmt.Errorf("%s: want a number or an ISO-8601 string", raw)
		}
		return v, nil
	}
	var str string
	if err := json.Unmarshal(raw, &str); err != nil {
		return 0, err
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999"} {
		if t, err := time.Parse(layout, str); err == nil {
			if rr.ref.IsZero() {
				rr.ref = t
			}
			return float64(t.Sub(rr.ref)), nil
		}
	}
	return 0, fmt.Errorf("%q: want an ISO-8601 time such as 2024-05-10T12:00:01.250Z", str)
}

// session is a row's session id: session_id or conversation_id as given (numbers as such,
// strings hashed), or the first turn's chat_id along parent_chat_id links.
func (rr *rowsReader) session(j *rowJSON) (uint64, error) {
	id := func(raw json.RawMessage) (uint64, error) {
		if len(raw) == 0 || string(raw) == "null" {
			return 0, nil
		}
		if raw[0] == '"' {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return 0, err
			}
			return xxh3.HashString(s) | 1, nil // never 0, which is "no session"
		}
		var v int64
		if err := json.Unmarshal(raw, &v); err != nil {
			return 0, fmt.Errorf("%s: want an integer or a string", raw)
		}
		return uint64(v) ^ 1<<63, nil // 0 and -1 (Qwen's "no parent") stay apart from "none"
	}
	for _, raw := range []json.RawMessage{j.SessionID, j.Conversation} {
		if v, err := id(raw); err != nil || v != 0 {
			return v, err
		}
	}
	chat, err := id(j.ChatID)
	if err != nil || chat == 0 {
		return 0, err
	}
	parent, err := id(j.ParentChatID)
	if err != nil {
		return 0, err
	}
	if rr.chatRoot == nil {
		rr.chatRoot = map[uint64]uint64{}
	}
	root := chat
	if r, ok := rr.chatRoot[parent]; ok {
		root = r
	}
	rr.chatRoot[chat] = root
	return root, nil
}

// times turns the rows' raw timestamps into arrivals: in the unit, moved to start at 0 when
// they are epoch times, scaled.
func (rr *rowsReader) times(rows []MooncakeRow) error {
	if len(rows) == 0 {
		return nil
	}
	base := rr.base(slices.Min(rr.raw))
	for i := range rows {
		at, err := rr.arrival(rr.raw[i], base, rows[i].Line)
		if err != nil {
			return err
		}
		rows[i].At = at
	}
	return nil
}

// unitNs is the length of the raw timestamps' unit in ns.
func (rr *rowsReader) unitNs() float64 {
	switch {
	case rr.stamps == stampString:
		return 1 // ns already
	case rr.unit == 0:
		return float64(time.Millisecond)
	}
	return float64(rr.unit)
}

// base is the raw time that becomes 0, given the trace's first: itself for ISO-8601 strings
// and epoch times (over a day from 0), else 0.
func (rr *rowsReader) base(first float64) float64 {
	if rr.stamps == stampString || first*rr.unitNs() > float64(24*time.Hour) {
		return first
	}
	return 0
}

// arrival is the arrival of the row on line whose raw timestamp is v.
func (rr *rowsReader) arrival(v, base float64, line int) (time.Duration, error) {
	unit := rr.unitNs()
	ts := (v - base) * unit * rr.scale
	if !(ts >= 0) || ts >= math.MaxInt64 {
		u := "ms"
		if unit == float64(time.Second) {
			u = "s"
		}
		return 0, &RowError{Line: line, Field: "timestamp", Err: fmt.Errorf("%v %s: want 0 ≤ t < %v after scaling", v, u, time.Duration(math.MaxInt64))}
	}
	return time.Duration(ts), nil
}

// AppendTokens appends the first n tokens of the prompt that hashIDs stand for to dst and returns
// the extended slice: for each id, a block of o.BlockSize tokens (MooncakeBlock when 0) that
// depend only on the id, o.Seed and o.Vocab. n beyond len(hashIDs)·BlockSize is cut to it. It
// allocates only when dst is full.
func (o MooncakeOptions) AppendTokens(dst []uint32, hashIDs []uint64, n int) []uint32 {
	return o.appendBlocks(dst, hashIDs, n, o.blockSize())
}

// appendBlocks is AppendTokens with blocks of bs tokens.
func (o MooncakeOptions) appendBlocks(dst []uint32, hashIDs []uint64, n, bs int) []uint32 {
	n = min(n, len(hashIDs)*bs)
	if n <= 0 {
		return dst
	}
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	out := dst[start:]
	key := mix64(o.Seed + 0x6d6f6f6e63616b65) // so that seed 0 is not the identity
	vocab := o.vocab()
	for i, id := range hashIDs {
		lo := i * bs
		if lo >= n {
			break
		}
		fillTokens(out[lo:min(lo+bs, n)], id^key, vocab)
	}
	return dst
}

const golden = 0x9e3779b97f4a7c15

// mix64 is splitmix64's output function, a bijection on uint64.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// fillTokens fills dst with the splitmix64 stream started at mix64(key), two token ids in
// [0, vocab) per step (multiply-shift reduction; its bias below 2^-15 does not matter here).
// Distinct keys start at distinct states, so their streams differ.
func fillTokens(dst []uint32, key, vocab uint64) {
	s := mix64(key)
	i := 0
	for ; i+1 < len(dst); i += 2 {
		s += golden
		z := mix64(s)
		dst[i] = uint32((z & 0xffffffff) * vocab >> 32)
		dst[i+1] = uint32((z >> 32) * vocab >> 32)
	}
	if i < len(dst) {
		z := mix64(s + golden)
		dst[i] = uint32((z & 0xffffffff) * vocab >> 32)
	}
}

// HitCounts is what an infinite prefix cache shared by all workers would have served over a
// workload replayed in arrival order, in blocks of one size. Plain data.
type HitCounts struct {
	BlockSize    int
	Blocks       int   // every block of every prompt, a partial tail block included: Σ ⌈len/BlockSize⌉
	FullBlocks   int   // full blocks only: Σ ⌊len/BlockSize⌋
	Hits         int   // full blocks in each prompt's longest prefix already seen
	PromptTokens int64 // Σ len
}

// Bound is Hits/Blocks, the fraction HitBound returns; 0 for an empty workload.
func (c HitCounts) Bound() float64 {
	if c.Blocks == 0 {
		return 0
	}
	return float64(c.Hits) / float64(c.Blocks)
}

// FullBound is Hits/FullBlocks, the bound when partial tail blocks are not counted at all.
func (c HitCounts) FullBound() float64 {
	if c.FullBlocks == 0 {
		return 0
	}
	return float64(c.Hits) / float64(c.FullBlocks)
}

// TokenBound is the fraction of prompt tokens in hit blocks: the prefill an ideal router saves.
func (c HitCounts) TokenBound() float64 {
	if c.PromptTokens == 0 {
		return 0
	}
	return float64(c.Hits) * float64(c.BlockSize) / float64(c.PromptTokens)
}

// CountHits replays reqs in slice order (a workload's arrival order) against one infinite
// prefix cache. A prompt's full block hits when the prompt up to and including that block was
// the prefix of an earlier prompt; blocks are told apart by a chained 64-bit XXH3 of their
// tokens, so two distinct prefixes are confused with probability about 2^-64 per pair (under
// 10^-8 for the 3·10^5 blocks of the conversation trace). It panics if blockSize ≤ 0.
func CountHits(reqs []Request, blockSize int) HitCounts {
	if blockSize <= 0 {
		panic(fmt.Sprintf("trace: block size %d: want a positive number", blockSize))
	}
	return countHits(reqs, blockSize, make(infinite))
}

// CountLRUHits is CountHits for one shared prefix cache of capacity blocks with LRU eviction: the
// whole fleet's KV memory as a single cache with no load limits, a reference for what routing
// can recover when caches are finite (infinite capacity gives CountHits). A prompt touches its
// chain deepest block first, so a parent is always more recent than its children and evictions
// take leaves first, keeping every cached block's prefix cached. It panics if blockSize ≤ 0 or
// capacity < 1.
func CountLRUHits(reqs []Request, blockSize, capacity int) HitCounts {
	if blockSize <= 0 || capacity < 1 {
		panic(fmt.Sprintf("trace: CountLRUHits(block size %d, capacity %d): want positive numbers", blockSize, capacity))
	}
	return countHits(reqs, blockSize, newLRU(capacity))
}

// blockCache is the prefix cache countHits replays a workload against.
type blockCache interface {
	has(h uint64) bool
	// cache is told a prompt's full-block chain (hashes, root first) once it is served.
	cache(chain []uint64)
}

// countHits replays reqs against c: a full block hits while the prompt's chain up to it is cached.
func countHits(reqs []Request, blockSize int, c blockCache) HitCounts {
	n := HitCounts{BlockSize: blockSize}
	var chain []uint64
	for i := range reqs {
		toks := reqs[i].Tokens
		n.PromptTokens += int64(len(toks))
		n.Blocks += (len(toks) + blockSize - 1) / blockSize
		full := len(toks) / blockSize
		n.FullBlocks += full
		chain = chain[:0]
		h, hit := uint64(1337), true
		for b := range full {
			h = xxh3.HashSeed(tokenBytes(toks[b*blockSize:(b+1)*blockSize]), h)
			chain = append(chain, h)
			if hit = hit && c.has(h); hit {
				n.Hits++
			}
		}
		c.cache(chain)
	}
	return n
}

// infinite is a prefix cache that forgets nothing.
type infinite map[uint64]struct{}

func (c infinite) has(h uint64) bool { _, ok := c[h]; return ok }

func (c infinite) cache(chain []uint64) {
	for _, h := range chain {
		c[h] = struct{}{}
	}
}

// lru is a set of block hashes of fixed capacity that forgets the least recently touched.
type lru struct {
	idx      map[uint64]int32 // hash → node
	nodes    []lruNode        // nodes[0] is the list's sentinel
	capacity int
}

type lruNode struct {
	hash       uint64
	prev, next int32
}

func newLRU(capacity int) *lru {
	return &lru{idx: make(map[uint64]int32, capacity), nodes: make([]lruNode, 1, capacity+1), capacity: capacity}
}

func (l *lru) has(h uint64) bool { _, ok := l.idx[h]; return ok }

// cache touches chain deepest block first; a chain longer than the cache keeps its first blocks.
func (l *lru) cache(chain []uint64) {
	for j := min(len(chain), l.capacity) - 1; j >= 0; j-- {
		l.touch(chain[j])
	}
}

// touch makes h the most recent, inserting it and evicting the least recent if full.
func (l *lru) touch(h uint64) {
	n, ok := l.idx[h]
	switch {
	case ok:
		l.unlink(n)
	case len(l.nodes) <= l.capacity:
		n = int32(len(l.nodes))
		l.nodes = append(l.nodes, lruNode{hash: h})
		l.idx[h] = n
	default:
		n = l.nodes[0].prev // the least recent
		l.unlink(n)
		delete(l.idx, l.nodes[n].hash)
		l.nodes[n].hash = h
		l.idx[h] = n
	}
	// Insert after the sentinel: the front is the most recent.
	first := l.nodes[0].next
	l.nodes[n].prev, l.nodes[n].next = 0, first
	l.nodes[first].prev = n
	l.nodes[0].next = n
}

func (l *lru) unlink(n int32) {
	p, x := l.nodes[n].prev, l.nodes[n].next
	l.nodes[p].next = x
	l.nodes[x].prev = p
}

// tokenBytes views toks as bytes in the machine's order, which is fine for hashes that never
// leave the process.
func tokenBytes(toks []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(toks))), 4*len(toks))
}

// InfiniteBound is the infinite-cache bound that bench/fleetsim and bench/report compare hit
// rates with, one function for both: the fraction of prompt tokens in blocks an infinite cache
// shared by all workers would serve as prefix hits, replaying reqs in arrival order
// (CountHits(reqs, blockSize).TokenBound()). The simulators' hit rates are in prompt tokens
// too. It panics if blockSize ≤ 0.
func InfiniteBound(reqs []Request, blockSize int) float64 {
	return CountHits(reqs, blockSize).TokenBound()
}

// HitBound returns the fraction of prompt blocks that an infinite cache shared by all workers
// would serve as prefix hits over the whole workload, in arrival order: the best any router can
// do. Every block of a prompt counts, a partial tail block too (engines cache only full blocks,
// so it is always computed); see CountHits for the other ratios. It panics if blockSize ≤ 0.
func HitBound(reqs []Request, blockSize int) float64 {
	return CountHits(reqs, blockSize).Bound()
}

// Scale returns a copy of reqs with arrival times multiplied by f (a load knob: f = 0.5 offers
// twice the load). The copies share Tokens with reqs. It panics unless f is positive and finite.
func Scale(reqs []Request, f float64) []Request {
	if !(f > 0) || math.IsInf(f, 0) {
		panic(fmt.Sprintf("trace: Scale factor %v: want a positive finite number", f))
	}
	out := slices.Clone(reqs)
	for i := range out {
		out[i].At = time.Duration(float64(out[i].At) * f)
	}
	return out
}

// Dist summarises a distribution of token counts: plain data.
type Dist struct {
	Mean     float64
	P50, P99 int // nearest rank
	Max      int
}

func (d Dist) String() string {
	return fmt.Sprintf("mean %.0f p50 %d p99 %d max %d", d.Mean, d.P50, d.P99, d.Max)
}

// Stats summarises a workload: plain data.
type Stats struct {
	Requests     int
	Duration     time.Duration // arrival of the last request, from the trace's start
	Input        Dist          // prompt tokens per request
	Output       Dist          // output tokens per request
	PromptTokens int64
	OutputTokens int64
}

func (s Stats) String() string {
	return fmt.Sprintf("%d requests over %v; input %v; output %v; %d prompt tokens, %d output tokens",
		s.Requests, s.Duration.Round(time.Millisecond), s.Input, s.Output, s.PromptTokens, s.OutputTokens)
}

// Summarize summarises a workload: requests, duration, mean/p50/p99 input and output tokens,
// total prompt tokens.
func Summarize(reqs []Request) Stats {
	s := Stats{Requests: len(reqs)}
	if len(reqs) == 0 {
		return s
	}
	in := make([]int, len(reqs))
	out := make([]int, len(reqs))
	for i := range reqs {
		in[i], out[i] = len(reqs[i].Tokens), reqs[i].Output
		s.PromptTokens += int64(in[i])
		s.OutputTokens += int64(out[i])
		s.Duration = max(s.Duration, reqs[i].At)
	}
	s.Input = dist(in, s.PromptTokens)
	s.Output = dist(out, s.OutputTokens)
	return s
}

func dist(v []int, sum int64) Dist {
	slices.Sort(v)
	rank := func(p float64) int { return v[max(0, int(math.Ceil(p*float64(len(v))))-1)] }
	return Dist{Mean: float64(sum) / float64(len(v)), P50: rank(0.50), P99: rank(0.99), Max: v[len(v)-1]}
}
