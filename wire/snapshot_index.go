package wire

import (
	"fmt"
	"slices"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// SnapshotHeader opens a snapshot of the second format (SPEC.md §12): the first message of its
// first chunk. A snapshot that starts with a SnapshotWorker is of the first format. Plain data.
type SnapshotHeader struct {
	Version uint32 // SnapshotVersion
	// IndexSection says that SnapshotIndex messages follow the workers, in chunks of their own:
	// the index by block, which a restore loads in bulk.
	IndexSection bool
}

// SnapshotVersion is the snapshot format a SnapshotHeader announces: 2, the first format
// (worker messages only) having no header.
const SnapshotVersion = 2

const snapHeaderIndex = 1 << 0

var snapHeaderLayout = [...]field{{"version", 4}, {"flags", 4}}

// AppendSnapshotHeader appends h as one message.
func AppendSnapshotHeader(dst []byte, h SnapshotHeader) []byte {
	dst = appendHeader(dst, TypeSnapshotHeader, 8)
	dst = le.AppendUint32(dst, h.Version)
	var flags uint32
	if h.IndexSection {
		flags |= snapHeaderIndex
	}
	return le.AppendUint32(dst, flags)
}

// DecodeSnapshotHeader decodes the one message b holds into h. A version other than
// SnapshotVersion is an error (ErrVersion) that says which.
func DecodeSnapshotHeader(b []byte, h *SnapshotHeader) error {
	d := newDecoder(b, "snapshot header")
	if err := d.header(TypeSnapshotHeader); err != nil {
		return err
	}
	p, err := d.fixed(snapHeaderLayout[:], 8)
	if err != nil {
		return err
	}
	v, flags := le.Uint32(p), le.Uint32(p[4:])
	if v != SnapshotVersion {
		return d.errAt("version", HeaderSize, ErrVersion, "snapshot format %d; this kvrouterd reads formats 1 and %d", v, SnapshotVersion)
	}
	if flags&^snapHeaderIndex != 0 {
		return d.errAt("flags", HeaderSize+4, ErrInvalid, "unknown bits %#x", flags&^snapHeaderIndex)
	}
	*h = SnapshotHeader{Version: v, IndexSection: flags&snapHeaderIndex != 0}
	return d.end()
}

// SnapshotSlot is a (worker, data-parallel rank) as a SnapshotIndex numbers its holders.
type SnapshotSlot struct {
	ID   uint64
	Rank uint32
}

// SnapshotIndex is part of one model's index in one storage tier, by block (SPEC.md §12): each
// block's sequence hash and the workers holding it, numbered by their place in Slots. It holds
// the same residencies as the snapshot's worker messages, written once per block so that a
// restore builds each block's holder set in one step. For one goroutine at a time: decoding
// reuses its slices, and Model aliases the decoded buffer.
type SnapshotIndex struct {
	Model string
	Tier  kvevent.Tier
	// Salt is the placement salt of the index written (radix.Index.Salt), under which Keys are
	// listed by segment: a restore that takes it loads them where they lie.
	Salt  uint64
	Slots []SnapshotSlot
	// Keys are the blocks' sequence hashes, each once; Counts[i] is how many holders Keys[i]
	// has, listed in Holders run after run, each run strictly ascending, each a place in Slots.
	Keys    []uint64
	Counts  []uint32
	Holders []uint32
}

// Validate reports what AppendSnapshotIndex could not write faithfully.
func (x *SnapshotIndex) Validate() error {
	const m = "snapshot index"
	switch {
	case x.Model == "":
		return invalid(m, "model", ErrInvalid, "must not be empty")
	case len(x.Model) > MaxString:
		return invalid(m, "model", ErrTooLong, fmt.Sprintf("%d bytes, max %d", len(x.Model), MaxString))
	case x.Tier >= kvevent.NumTiers:
		return invalid(m, "tier", ErrInvalid, fmt.Sprintf("%d, want 0 to %d", x.Tier, kvevent.NumTiers-1))
	case len(x.Counts) != len(x.Keys):
		return invalid(m, "counts", ErrInvalid, fmt.Sprintf("%d counts for %d keys", len(x.Counts), len(x.Keys)))
	case tooMany(len(x.Slots)) || tooMany(len(x.Keys)) || tooMany(len(x.Holders)):
		return invalid(m, "body_length", ErrTooLong, "more than 2^32-1 elements")
	}
	if size := x.size(); size > 1<<32-1 {
		return invalid(m, "body_length", ErrTooLong, fmt.Sprintf("%d bytes, max 2^32-1", size))
	}
	return nil
}

func (x *SnapshotIndex) size() int {
	return strSize(x.Model) + 4 + 8 + 4 + 12*len(x.Slots) + 4 + 12*len(x.Keys) + 4 + 4*len(x.Holders)
}

// AppendSnapshotIndex appends x as one message. Call Validate first.
func AppendSnapshotIndex(dst []byte, x *SnapshotIndex) []byte {
	body := x.size()
	dst = slices.Grow(dst, HeaderSize+body)
	dst = appendHeader(dst, TypeSnapshotIndex, body)
	dst = appendStr(dst, x.Model)
	dst = le.AppendUint32(dst, uint32(x.Tier))
	dst = le.AppendUint64(dst, x.Salt)
	dst = appendCount(dst, len(x.Slots))
	for _, s := range x.Slots {
		dst = le.AppendUint64(dst, s.ID)
		dst = le.AppendUint32(dst, s.Rank)
	}
	dst = appendCount(dst, len(x.Keys))
	dst = appendHashes(dst, x.Keys)
	dst = appendTokens(dst, x.Counts)
	dst = appendCount(dst, len(x.Holders))
	return appendTokens(dst, x.Holders)
}

// DecodeSnapshotIndex decodes the one message b holds into x, checking that every count is
// positive, that the counts add up to the holders, and that each block's holders are strictly
// ascending places in Slots.
func DecodeSnapshotIndex(b []byte, x *SnapshotIndex) error {
	d := newDecoder(b, "snapshot index")
	if err := d.header(TypeSnapshotIndex); err != nil {
		return err
	}
	model, err := d.str("model")
	if err != nil {
		return err
	}
	if model == "" {
		return d.errAt("model", d.off-2, ErrInvalid, "must not be empty")
	}
	tier, err := d.u32("tier")
	if err != nil {
		return err
	}
	if tier >= uint32(kvevent.NumTiers) {
		return d.errAt("tier", d.off-4, ErrInvalid, "%d, want 0 to %d", tier, kvevent.NumTiers-1)
	}
	salt, err := d.u64("salt")
	if err != nil {
		return err
	}
	ns, err := d.count("n_slots", "slots", 12)
	if err != nil {
		return err
	}
	x.Model, x.Tier, x.Salt, x.Slots = model, kvevent.Tier(tier), salt, x.Slots[:0]
	for range ns {
		p := d.take(12)
		x.Slots = append(x.Slots, SnapshotSlot{ID: le.Uint64(p), Rank: le.Uint32(p[8:])})
	}
	nk, err := d.count("n_blocks", "keys", 12)
	if err != nil {
		return err
	}
	x.Keys = appendU64s(x.Keys[:0], d.take(8*nk))
	countsAt := d.off
	x.Counts = appendU32s(x.Counts[:0], d.take(4*nk))
	nh, err := d.count("n_holders", "holders", 4)
	if err != nil {
		return err
	}
	holdersAt := d.off
	x.Holders = appendU32s(x.Holders[:0], d.take(4*nh))
	if err := d.end(); err != nil {
		return err
	}
	h := 0
	for i, c := range x.Counts {
		if c == 0 || uint64(c) > uint64(nh-h) {
			return d.errAt(fmt.Sprintf("counts[%d]", i), countsAt+4*i, ErrInvalid, "%d holders, %d left of %d", c, nh-h, nh)
		}
		run := x.Holders[h : h+int(c)]
		for j, s := range run {
			if int(s) >= ns || j > 0 && s <= run[j-1] {
				return d.errAt(fmt.Sprintf("holders[%d]", h+j), holdersAt+4*(h+j), ErrInvalid,
					"%d: want a place in the %d slots, above the block's holder before", s, ns)
			}
		}
		h += int(c)
	}
	if h != nh {
		return d.errAt("n_holders", holdersAt-4, ErrInvalid, "%d, but the counts add up to %d", nh, h)
	}
	return nil
}
