package wire

// KV-cache groups of hybrid models: which events reach the index (SPEC.md §10.4).
//
// A hybrid model (full attention beside sliding-window or Mamba layers) keeps one KV-cache
// group per kind of layer, and vLLM publishes every group's events with the same block hashes.
// Only the main attention group may reach the index: a sliding-window group's removal of a hash
// would otherwise remove the full-attention block. A stored event names its group's index and
// kind; a removal names the index alone, so the kind of a group is learned from the stored
// events that name both, per (rank, group index), as Dynamo's ZMQ reader learns it
// (lib/kv-router/src/zmq_wire: filter_reason and learn_metadata).

import (
	"math"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvrouterd/kvrouterd/kvevent"
)

// specKind is what an event's kv_cache_spec_kind says of its group.
type specKind uint8

const (
	specNone  specKind = iota // no kind
	specMain                  // full_attention, mla_attention or sink_full_attention
	specOther                 // any other kind, unknown ones included
)

func parseSpecKind(s []byte) specKind {
	switch string(s) {
	case "full_attention", "mla_attention", "sink_full_attention":
		return specMain
	}
	return specOther
}

// evMeta is what the group filter needs of one decoded event, kept beside it until the
// batch's rank is known (the array form puts it after the events).
type evMeta struct {
	group    uint32
	hasGroup bool
	kind     specKind
	unknown  bool   // the medium is a name kvevent.ParseMedium does not know
	medium   string // that name, aliasing the payload
}

// maxEngineGroups bounds what one EngineGroups learns: a model has a few groups per rank, and a
// publisher naming more cannot make the table grow without end. Past it, new groups are not
// learned, and their events are decided as unlearned ones are.
const maxEngineGroups = 256

// EngineGroups are the KV-cache groups one publisher's stored events described: per (rank,
// group index), whether the group is the main attention one. For one goroutine at a time,
// like the EngineBatch that uses it. The zero value is empty and ready.
type EngineGroups struct {
	known []engineGroup
}

type engineGroup struct {
	rank, group uint32
	main        bool
}

// learn records that group of rank is of the main attention kind or not; a later stored event
// that says otherwise replaces it, as in Dynamo.
func (g *EngineGroups) learn(rank, group uint32, main bool) {
	for i := range g.known {
		if k := &g.known[i]; k.rank == rank && k.group == group {
			k.main = main
			return
		}
	}
	if len(g.known) < maxEngineGroups {
		g.known = append(g.known, engineGroup{rank: rank, group: group, main: main})
	}
}

// keep reports whether an event with m's group fields belongs to the main attention group.
// The kind decides when the event names one; else the kind learned for its group index; else
// only group index 0 is kept, the main group of every non-hybrid model.
func (g *EngineGroups) keep(rank uint32, m *evMeta) bool {
	switch m.kind {
	case specMain:
		return true
	case specOther:
		return false
	}
	if !m.hasGroup {
		return true
	}
	for _, k := range g.known {
		if k.rank == rank && k.group == m.group {
			return k.main
		}
	}
	return m.group == 0
}

// filterGroups learns the groups the batch's stored events describe and drops, in order, the
// events of groups other than the main attention one, counting them in Filtered; the events
// kept with an unknown medium are counted in UnknownMedium. An event's own fields are learned
// before it is decided, so a store that introduces its group is decided by that.
func (b *EngineBatch) filterGroups() {
	g := b.Groups
	if g == nil {
		g = &b.groups
	}
	n := 0
	for i := range b.Events {
		m := &b.meta[i]
		e := b.Events[i]
		if e.Kind == kvevent.Stored && m.hasGroup && m.kind != specNone {
			g.learn(b.Rank, m.group, m.kind == specMain)
		}
		if !g.keep(b.Rank, m) {
			b.Filtered++
			continue
		}
		if m.unknown {
			if b.UnknownMedium++; b.UnknownMedium == 1 {
				b.UnknownMediumName = m.medium
			}
		}
		b.Events[n] = e
		n++
	}
	clear(b.Events[n:])
	b.Events = b.Events[:n]
}

// groupIndex reads a group index or sliding window: nil (ok false) or an integer from 0 to
// 2^32-1, as Dynamo reads them (u32).
func (d *engineDecoder) groupIndex(b []byte, field string, i int) (uint32, bool, []byte, error) {
	const want = "nil or an integer from 0 to 2^32-1"
	if isNil(b) {
		return 0, false, b[1:], nil
	}
	if t := msgp.NextType(b); t != msgp.IntType && t != msgp.UintType {
		return 0, false, nil, d.bad(b, field, i, -1, want, nil)
	}
	v, r, err := msgp.ReadUint64Bytes(b)
	if err != nil {
		return 0, false, nil, d.bad(b, field, i, -1, want, err)
	}
	if v > math.MaxUint32 {
		return 0, false, nil, d.errAt(b, field, i, -1, ErrInvalid, "%d, want %s", v, want)
	}
	return uint32(v), true, r, nil
}

// tail reads element i of an array event past its fixed fields: the positions where vLLM puts
// group_idx, kv_cache_spec_kind and kv_cache_spec_sliding_window. Dynamo reads them by type,
// and so does this: nil is nothing, a str the spec kind, the first integer the group index and
// the second the sliding window; in a BlockStored an array is Dynamo's own block_mm_infos, not
// read. Anything else is an error naming the position.
func (d *engineDecoder) tail(st *evState, b []byte, i int, stored bool) ([]byte, error) {
	switch t := msgp.NextType(b); {
	case isNil(b):
		return b[1:], nil
	case t == msgp.StrType:
		s, r, err := d.str(b, "", i, -1)
		if err != nil {
			return nil, err
		}
		st.meta.kind = parseSpecKind(s)
		return r, nil
	case t == msgp.IntType || t == msgp.UintType:
		v, _, r, err := d.groupIndex(b, "", i)
		if err != nil {
			return nil, err
		}
		if !st.meta.hasGroup {
			st.meta.group, st.meta.hasGroup = v, true
		}
		return r, nil
	case t == msgp.ArrayType && stored:
		return d.skip(b, "", i, -1)
	}
	want := "nil, a group index or sliding window (an integer), or a kv_cache_spec_kind (str)"
	if stored {
		want += ", or block_mm_infos (an array)"
	}
	return nil, d.bad(b, "", i, -1, want, nil)
}
