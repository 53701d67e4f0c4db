package wire

import (
	"fmt"
	"math"
	"slices"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// Event flags (event offset 2).
const (
	evHasParent = 1 << 0
	evHasSalt   = 1 << 1 // a cache_salt string follows the multimodal lists
	evHasLocals = 1 << 2 // local hashes follow, instead of token ids
	evStored    = evHasParent | evHasSalt | evHasLocals
	// evUnencodable is set by AppendEventBatch on an event the format cannot carry faithfully,
	// so that the receiver rejects the batch (an unknown bit). See EventBatch.Validate.
	evUnencodable = 1 << 7
)

const (
	batchFixed  = 8  // bytes of the body before model
	eventFixed  = 16 // bytes every event starts with, whatever its kind
	storedFixed = 12 // block_size and parent
	maxMM       = 1<<16 - 1
)

var (
	eventLayout  = [...]field{{"kind", 1}, {"tier", 1}, {"flags", 1}, {"reserved", 1}, {"rank", 4}, {"id", 8}}
	storedLayout = [...]field{{"block_size", 4}, {"parent", 8}}
)

// EventBatch carries the KV events of one worker of one model; it is for one goroutine at a
// time, since decoding into it reuses its memory.
//
// DecodeEventBatch points the decoded events' Hashes, Tokens and MM into arenas the batch keeps
// and reuses: they are valid until the next decode into the same EventBatch. Model and every
// event's LoRA alias the decoded buffer: valid only while it is unchanged (strings.Clone keeps
// one). shard.Batch.Add copies both slices and strings.
type EventBatch struct {
	Worker uint64
	Model  string
	Events []kvevent.Event

	// Arenas the decoded events' slices point into. A slice taken before an arena grew keeps
	// the old backing array, which still holds its data.
	hashes []uint64
	tokens []uint32
	mm     [][]uint64
	mmData []uint64
}

// Validate reports the first field of b that the format cannot carry as it is, as an *Error
// with Offset -1. Meaning is not checked (tokens = hashes × block size, for one, is the
// server's rule).
func (b *EventBatch) Validate() error {
	const m = "event batch"
	if err := validStr(m, "model", b.Model); err != nil {
		return err
	}
	if len(b.Events) > MaxEvents {
		return invalid(m, "n_events", ErrTooLong, fmt.Sprintf("%d events, max %d", len(b.Events), MaxEvents))
	}
	for i := range b.Events {
		if err := validEvent(i, &b.Events[i]); err != nil {
			return err
		}
	}
	return nil
}

func validEvent(i int, e *kvevent.Event) error {
	bad := func(field string, err error, format string, args ...any) error {
		return invalid("event batch", fmt.Sprintf("events[%d].%s", i, field), err, fmt.Sprintf(format, args...))
	}
	if e.Kind < kvevent.Stored || e.Kind > kvevent.Cleared {
		return bad("kind", ErrInvalid, "kind %d, want 1 (stored), 2 (removed) or 3 (cleared)", e.Kind)
	}
	if e.Tier > kvevent.External {
		return bad("tier", ErrInvalid, "tier %d, max %d", e.Tier, kvevent.External)
	}
	if tooMany(len(e.Hashes)) {
		return bad("block_hashes", ErrTooLong, "more than 2^32-1 hashes")
	}
	if e.Kind != kvevent.Stored {
		switch {
		case e.HasParent:
			return bad("flags", ErrInvalid, "HasParent on a %v event", e.Kind)
		case e.Parent != 0:
			return bad("parent", ErrInvalid, "Parent on a %v event", e.Kind)
		case e.BlockSize != 0:
			return bad("block_size", ErrInvalid, "BlockSize on a %v event", e.Kind)
		case len(e.Tokens) > 0:
			return bad("token_ids", ErrInvalid, "Tokens on a %v event", e.Kind)
		case e.LoRA != "":
			return bad("lora_name", ErrInvalid, "LoRA on a %v event", e.Kind)
		case e.Salt != "":
			return bad("cache_salt", ErrInvalid, "Salt on a %v event", e.Kind)
		case e.Locals != nil:
			return bad("local_hashes", ErrInvalid, "Locals on a %v event", e.Kind)
		case len(e.MM) > 0:
			return bad("mm", ErrInvalid, "MM on a %v event", e.Kind)
		case e.Kind == kvevent.Cleared && len(e.Hashes) > 0:
			return bad("block_hashes", ErrInvalid, "Hashes on a cleared event")
		}
		return nil
	}
	switch {
	case !e.HasParent && e.Parent != 0:
		return bad("parent", ErrInvalid, "Parent is %#x but HasParent is false", e.Parent)
	case e.BlockSize < 0 || uint64(e.BlockSize) > math.MaxUint32:
		return bad("block_size", ErrInvalid, "BlockSize %d, want 0 to 2^32-1", e.BlockSize)
	case tooMany(len(e.Tokens)):
		return bad("token_ids", ErrTooLong, "more than 2^32-1 tokens")
	case len(e.LoRA) > MaxString:
		return bad("lora_name", ErrTooLong, "%d bytes, max %d", len(e.LoRA), MaxString)
	case len(e.Salt) > MaxString:
		return bad("cache_salt", ErrTooLong, "%d bytes, max %d", len(e.Salt), MaxString)
	case e.Locals != nil && len(e.Locals) != len(e.Hashes):
		return bad("n_locals", ErrInvalid, "%d local hashes for %d blocks", len(e.Locals), len(e.Hashes))
	case e.Locals != nil && len(e.Tokens) > 0:
		return bad("token_ids", ErrInvalid, "token ids and local hashes both")
	case len(e.MM) != 0 && len(e.MM) != len(e.Hashes):
		return bad("n_mm", ErrInvalid, "%d multimodal lists for %d blocks", len(e.MM), len(e.Hashes))
	}
	for j, x := range e.MM {
		if len(x) > maxMM {
			return bad(fmt.Sprintf("mm[%d].hashes", j), ErrTooLong, "%d hashes, max %d", len(x), maxMM)
		}
	}
	return nil
}

// unencodable reports whether e holds something the format has no place for. Values it can
// hold but the decoder refuses (an unknown kind or tier, a long LoRA name, a parent without
// HasParent, a multimodal list count other than 0 or the block count) are written as they are.
func unencodable(e *kvevent.Event) bool {
	switch e.Kind {
	case kvevent.Stored:
		if e.BlockSize < 0 || uint64(e.BlockSize) > math.MaxUint32 || tooMany(len(e.Hashes)) || tooMany(len(e.Tokens)) {
			return true
		}
		for _, x := range e.MM {
			if len(x) > maxMM {
				return true
			}
		}
		return false
	case kvevent.Removed:
		return tooMany(len(e.Hashes)) || e.Parent != 0 || e.BlockSize != 0 || len(e.Tokens) > 0 || e.LoRA != "" || len(e.MM) > 0 || e.Salt != "" || e.Locals != nil
	case kvevent.Cleared:
		return len(e.Hashes) > 0 || e.Parent != 0 || e.BlockSize != 0 || len(e.Tokens) > 0 || e.LoRA != "" || len(e.MM) > 0 || e.Salt != "" || e.Locals != nil
	}
	return false
}

func eventSize(e *kvevent.Event) int {
	switch e.Kind {
	case kvevent.Stored:
		n := eventFixed + 4 + 8 + 4 + 8*len(e.Hashes) + 4 + 4*len(e.Tokens) + strSize(e.LoRA) + 4
		for _, x := range e.MM {
			n += 2 + 8*min(len(x), maxMM)
		}
		if e.Salt != "" {
			n += strSize(e.Salt)
		}
		if e.Locals != nil {
			n += 4 + 8*len(e.Locals)
		}
		return n
	case kvevent.Removed:
		return eventFixed + 4 + 8*len(e.Hashes)
	}
	return eventFixed
}

// AppendEventBatch appends b as a complete message (header included) to dst and returns the
// extended slice. It grows dst at most once.
//
// It expects a valid b (see Validate) and does not check it, but it never turns an invalid
// batch into a different valid one: values out of range are written as they are and the
// decoder rejects them, and an event holding what the format has no place for (Tokens on a
// removal, Hashes on a clear, a negative BlockSize, ...) gets an undefined flag bit so that the
// decoder rejects the batch.
func AppendEventBatch(dst []byte, b *EventBatch) []byte {
	body := batchFixed + strSize(b.Model) + 4
	for i := range b.Events {
		body += eventSize(&b.Events[i])
	}
	dst = slices.Grow(dst, HeaderSize+body)
	dst = appendHeader(dst, TypeEventBatch, body)
	dst = le.AppendUint64(dst, b.Worker)
	dst = appendStr(dst, b.Model)
	dst = appendCount(dst, len(b.Events))
	for i := range b.Events {
		dst = appendEvent(dst, &b.Events[i])
	}
	return dst
}

func appendEvent(dst []byte, e *kvevent.Event) []byte {
	var flags byte
	if e.HasParent {
		flags |= evHasParent
	}
	if e.Kind == kvevent.Stored && e.Salt != "" {
		flags |= evHasSalt
	}
	if e.Kind == kvevent.Stored && e.Locals != nil {
		flags |= evHasLocals
	}
	if unencodable(e) {
		flags |= evUnencodable
	}
	dst = append(dst, byte(e.Kind), byte(e.Tier), flags, 0)
	dst = le.AppendUint32(dst, e.Rank)
	dst = le.AppendUint64(dst, e.ID)
	switch e.Kind {
	case kvevent.Stored:
		dst = le.AppendUint32(dst, uint32(e.BlockSize))
		dst = le.AppendUint64(dst, e.Parent)
		dst = appendCount(dst, len(e.Hashes))
		dst = appendHashes(dst, e.Hashes)
		dst = appendCount(dst, len(e.Tokens))
		dst = appendTokens(dst, e.Tokens)
		dst = appendStr(dst, e.LoRA)
		dst = appendCount(dst, len(e.MM))
		for _, x := range e.MM {
			x = x[:min(len(x), maxMM)]
			dst = le.AppendUint16(dst, uint16(len(x)))
			dst = appendHashes(dst, x)
		}
		if e.Salt != "" {
			dst = appendStr(dst, e.Salt)
		}
		if e.Locals != nil {
			dst = appendCount(dst, len(e.Locals))
			dst = appendHashes(dst, e.Locals)
		}
	case kvevent.Removed:
		dst = appendCount(dst, len(e.Hashes))
		dst = appendHashes(dst, e.Hashes)
	}
	return dst
}

// DecodeEventBatch decodes the message b into out, reusing out's Events array and arenas. It
// checks structure only (SPEC.md): whether an event's tokens match its blocks, whether ids are
// in order, and the like are the server's to judge. On error out holds a partial result.
//
// See EventBatch for how long the decoded slices and strings stay valid. Decoding allocates
// nothing once out's memory has grown to the sizes seen.
func DecodeEventBatch(b []byte, out *EventBatch) error {
	d := newDecoder(b, "event batch")
	if err := d.header(TypeEventBatch); err != nil {
		return err
	}
	worker, err := d.u64("worker")
	if err != nil {
		return err
	}
	model, err := d.str("model")
	if err != nil {
		return err
	}
	cnt, err := d.u32("n_events")
	if err != nil {
		return err
	}
	if cnt > MaxEvents {
		return d.errAt("n_events", d.off-4, ErrTooLong, "%d events, max %d", cnt, MaxEvents)
	}
	n, err := d.fits("n_events", "events", cnt, eventFixed)
	if err != nil {
		return err
	}
	old := len(out.Events)
	out.Events = slices.Grow(out.Events[:0], n)[:n]
	if old > n {
		clear(out.Events[n:old]) // let go of the strings of the previous buffer
	}
	out.hashes, out.tokens, out.mm, out.mmData = out.hashes[:0], out.tokens[:0], out.mm[:0], out.mmData[:0]
	for i := range n {
		d.ev = i
		if err := out.decodeEvent(&d, &out.Events[i]); err != nil {
			return err
		}
	}
	d.ev = -1
	if err := d.end(); err != nil {
		return err
	}
	out.Worker, out.Model = worker, model
	return nil
}

func (out *EventBatch) decodeEvent(d *decoder, e *kvevent.Event) error {
	p, err := d.fixed(eventLayout[:], eventFixed)
	if err != nil {
		return err
	}
	base := d.off - eventFixed
	k, tier, flags := kvevent.Kind(p[0]), kvevent.Tier(p[1]), p[2]
	if k < kvevent.Stored || k > kvevent.Cleared {
		return d.errAt("kind", base, ErrInvalid, "kind %d, want 1 (stored), 2 (removed) or 3 (cleared)", p[0])
	}
	if tier > kvevent.External {
		return d.errAt("tier", base+1, ErrInvalid, "tier %d, max %d", p[1], kvevent.External)
	}
	if k == kvevent.Stored && flags&^evStored != 0 {
		return d.errAt("flags", base+2, ErrInvalid, "unknown bits %#x", flags&^evStored)
	}
	if k != kvevent.Stored && flags != 0 {
		return d.errAt("flags", base+2, ErrInvalid, "%#x on a %v event, must be 0", flags, k)
	}
	if err := d.zero("reserved", base+3, p[3:4]); err != nil {
		return err
	}
	*e = kvevent.Event{Kind: k, ID: le.Uint64(p[8:]), Rank: le.Uint32(p[4:]), Tier: tier}
	switch k {
	case kvevent.Removed:
		e.Hashes, err = out.decodeHashes(d)
		return err
	case kvevent.Cleared:
		return nil
	}

	if p, err = d.fixed(storedLayout[:], storedFixed); err != nil {
		return err
	}
	bs := le.Uint32(p)
	if uint64(bs) > math.MaxInt {
		return d.errAt("block_size", d.off-storedFixed, ErrInvalid, "%d does not fit this machine's int", bs)
	}
	e.BlockSize = int(bs)
	e.HasParent = flags&evHasParent != 0
	if e.Parent = le.Uint64(p[4:]); !e.HasParent && e.Parent != 0 {
		return d.unset("parent", d.off-8, e.Parent, "flags bit 0")
	}
	if e.Hashes, err = out.decodeHashes(d); err != nil {
		return err
	}
	n, err := d.count("n_tokens", "token_ids", 4)
	if err != nil {
		return err
	}
	if n > 0 {
		start := len(out.tokens)
		out.tokens = appendU32s(out.tokens, d.take(4*n))
		e.Tokens = out.tokens[start:len(out.tokens):len(out.tokens)]
	}
	if e.LoRA, err = d.str("lora_name"); err != nil {
		return err
	}
	nmm, err := d.u32("n_mm")
	if err != nil {
		return err
	}
	if nmm != 0 && int(nmm) != len(e.Hashes) {
		return d.errAt("n_mm", d.off-4, ErrInvalid, "%d, want 0 or n_hashes (%d)", nmm, len(e.Hashes))
	}
	if n, err = d.fits("n_mm", "mm", nmm, 2); err != nil {
		return err
	}
	if n > 0 {
		start := len(out.mm)
		out.mm = slices.Grow(out.mm, n)
		for j := range n {
			d.blk = j
			c, err := d.u16("count")
			if err != nil {
				return err
			}
			if _, err := d.fits("count", "hashes", uint32(c), 8); err != nil {
				return err
			}
			out.mm = append(out.mm, arenaU64(&out.mmData, d.take(8*int(c))))
		}
		d.blk = -1
		e.MM = out.mm[start:len(out.mm):len(out.mm)]
	}
	if flags&evHasSalt != 0 {
		if e.Salt, err = d.str("cache_salt"); err != nil {
			return err
		}
		if e.Salt == "" {
			return d.errAt("cache_salt", d.off-2, ErrInvalid, "empty, but flags bit 1 is set")
		}
	}
	if flags&evHasLocals != 0 {
		at := d.off
		if len(e.Tokens) > 0 {
			return d.errAt("flags", at, ErrInvalid, "bit 2 (local hashes) on an event with token ids")
		}
		nl, err := d.count("n_locals", "local_hashes", 8)
		if err != nil {
			return err
		}
		if nl != len(e.Hashes) {
			return d.errAt("n_locals", at, ErrInvalid, "%d, want n_hashes (%d)", nl, len(e.Hashes))
		}
		if e.Locals = arenaU64(&out.hashes, d.take(8*nl)); e.Locals == nil {
			e.Locals = noHashes
		}
	}
	return nil
}

// noHashes is the Locals of an event of no blocks that carries local hashes: empty, not nil.
var noHashes = []uint64{}

// decodeHashes reads n_hashes and the hashes into the hash arena.
func (out *EventBatch) decodeHashes(d *decoder) ([]uint64, error) {
	n, err := d.count("n_hashes", "block_hashes", 8)
	if err != nil {
		return nil, err
	}
	return arenaU64(&out.hashes, d.take(8*n)), nil
}

// arenaU64 appends the u64s of src to the arena and returns them as a slice of it, capped so
// that appending to it cannot overwrite its neighbours; nil if src is empty.
func arenaU64(arena *[]uint64, src []byte) []uint64 {
	if len(src) == 0 {
		return nil
	}
	start := len(*arena)
	*arena = appendU64s(*arena, src)
	return (*arena)[start:len(*arena):len(*arena)]
}
